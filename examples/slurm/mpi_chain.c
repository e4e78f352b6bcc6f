/*
 * mpi_chain STEPS [MS_PER_STEP]: a self-checking MPI computation for the
 * Slurm requeue example.  At every step each rank contributes a number,
 * the ranks add them up (MPI_Allreduce) and fold the sum into a chained
 * checksum that depends on every step in order; rank 0 prints progress.
 * At the end rank 0 computes the same chain alone, without MPI, and prints
 * "RESULT OK ..." when the two agree ("RESULT WRONG ..." and exit 1 if
 * not): a restart that lost or repeated a step, or a rank's state, shows.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MOD 2305843009213693951ULL /* 2^61 - 1 */

static uint64_t contribution(long step, int rank)
{
    return (uint64_t)step * 1000003ULL + (uint64_t)rank * 7919ULL + 1ULL;
}

static uint64_t fold(uint64_t chain, uint64_t sum)
{
    return (uint64_t)(((unsigned __int128)chain * 1099511628211ULL + sum) % MOD);
}

static void nap(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

int main(int argc, char **argv)
{
    int rank, size;
    long steps = argc > 1 ? atol(argv[1]) : 100;
    long ms = argc > 2 ? atol(argv[2]) : 100;
    uint64_t chain = 1, mine, sum, expect = 1;
    char host[256];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (MPI_Get_processor_name(host, &(int){ 0 }) != MPI_SUCCESS)
        host[0] = '\0';
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    for (long step = 0; step < steps; step++) {
        mine = contribution(step, rank);
        MPI_Allreduce(&mine, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        chain = fold(chain, sum);
        if (rank == 0 && step % 10 == 0) {
            printf("step %ld of %ld\n", step, steps);
            fflush(stdout);
        }
        nap(ms);
    }
    if (rank == 0) {
        for (long step = 0; step < steps; step++) {
            uint64_t s = 0;
            for (int r = 0; r < size; r++)
                s += contribution(step, r);
            expect = fold(expect, s);
        }
        printf("RESULT %s chain=%llu expected=%llu steps=%ld ranks=%d\n",
               chain == expect ? "OK" : "WRONG", (unsigned long long)chain,
               (unsigned long long)expect, steps, size);
        fflush(stdout);
    }
    MPI_Finalize();
    return rank == 0 && chain != expect ? 1 : 0;
}
