/* An MPI job that checks itself: a ring, an allreduce and a Jacobi solver.
 *
 * usage: mpi_solver ITERATIONS [USLEEP_PER_ITERATION] [POINTS_PER_RANK]
 *
 * Every iteration each rank passes a token around the ring (rank 0 checks
 * that it came back with every rank's stamp), exchanges its halo with both
 * neighbours, does one Jacobi sweep of -u'' = 1 on its share of the grid,
 * and every 10th iteration the ranks agree on the largest change with
 * MPI_Allreduce (checked against each rank's own value).  At the end rank 0
 * prints "checksum <hex>": a sum of the grid's bit patterns, exact and
 * independent of the order of reduction, so an interrupted run must print
 * the same one as an uninterrupted run.  Rank 0 prints "iter N" every 50
 * iterations so that a test can see where the job is.  Any broken
 * invariant: "FAIL ..." on stderr and MPI_Abort with 3.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

static void fail(const char *what, long a, long b)
{
    fprintf(stderr, "FAIL rank %d: %s (%ld != %ld)\n", rank, what, a, b);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static void ring(long iteration)
{
    long token[2];
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (size == 1)
        return;
    if (rank == 0) {
        token[0] = iteration;
        token[1] = 0;
        MPI_Send(token, 2, MPI_LONG, next, 1, MPI_COMM_WORLD);
        MPI_Recv(token, 2, MPI_LONG, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (token[0] != iteration)
            fail("token came back from another iteration", token[0], iteration);
        /* each rank r > 0 added r + 1 */
        if (token[1] != (long)size * (size + 1) / 2 - 1)
            fail("token misses a rank's stamp", token[1], (long)size * (size + 1) / 2 - 1);
    } else {
        MPI_Recv(token, 2, MPI_LONG, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (token[0] != iteration)
            fail("token from another iteration", token[0], iteration);
        token[1] += rank + 1;
        MPI_Send(token, 2, MPI_LONG, next, 1, MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: %s ITERATIONS [USLEEP] [POINTS_PER_RANK]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long iterations = atol(argv[1]);
    long pause = argc > 2 ? atol(argv[2]) : 0;
    long n = argc > 3 ? atol(argv[3]) : 4096;
    double h = 1.0 / ((double)n * size + 1);
    /* u[0] and u[n+1] are halo cells */
    double *u = calloc((size_t)n + 2, sizeof *u), *v = calloc((size_t)n + 2, sizeof *v);
    if (!u || !v)
        fail("out of memory", 0, 1);
    int left = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    int right = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;

    for (long it = 1; it <= iterations; it++) {
        ring(it);
        MPI_Sendrecv(&u[1], 1, MPI_DOUBLE, left, 2, &u[n + 1], 1, MPI_DOUBLE, right, 2,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(&u[n], 1, MPI_DOUBLE, right, 3, &u[0], 1, MPI_DOUBLE, left, 3,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double change = 0;
        for (long i = 1; i <= n; i++) {
            v[i] = 0.5 * (u[i - 1] + u[i + 1] + h * h);
            double d = v[i] > u[i] ? v[i] - u[i] : u[i] - v[i];
            if (d > change)
                change = d;
        }
        memcpy(&u[1], &v[1], (size_t)n * sizeof *u);
        if (it % 10 == 0) {
            double largest;
            MPI_Allreduce(&change, &largest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (largest < change)
                fail("allreduce gave less than this rank's value", (long)(largest * 1e12),
                     (long)(change * 1e12));
        }
        if (rank == 0 && it % 50 == 0) {
            printf("iter %ld\n", it);
            fflush(stdout);
        }
        if (pause > 0)
            usleep((useconds_t)pause);
    }

    uint64_t local = 0, total = 0;
    for (long i = 1; i <= n; i++) {
        uint64_t bits;
        memcpy(&bits, &u[i], sizeof bits);
        local += bits * (uint64_t)(rank * n + i);
    }
    MPI_Reduce(&local, &total, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("checksum %016llx\n", (unsigned long long)total);
        fflush(stdout);
    }
    free(u);
    free(v);
    MPI_Finalize();
    return 0;
}
