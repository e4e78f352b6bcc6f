/*
 * A single-threaded program that only computes.  usage: spin TICKS STEPS
 * Each tick runs STEPS steps of a hash chain and prints "tick N HASH"; the
 * end prints "done N HASH".  Every tick checks (exit 3 if broken) that a
 * 1 MiB ring in the heap still holds the hash of each of the last ticks,
 * recomputed from the one before: memory brought back by a restore must be
 * the memory that was dumped.  Used where a tree must want a whole CPU
 * (--rebalance).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define RING (1u << 17) /* 128 Ki uint64 = 1 MiB */

static uint64_t chain(uint64_t h, uint64_t n, long steps)
{
    for (long i = 0; i < steps; i++)
        h = h * 6364136223846793005ull + n + (uint64_t)i;
    return h;
}

int main(int argc, char **argv)
{
    long ticks = argc > 1 ? atol(argv[1]) : 100;
    long steps = argc > 2 ? atol(argv[2]) : 10000000;
    uint64_t *ring = calloc(RING, sizeof(uint64_t));
    uint64_t n = 0, h = 1;

    if (!ring || steps < 1)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    ring[0] = h;
    while ((long)n < ticks) {
        n++;
        h = chain(h, n, steps);
        ring[n % RING] = h;
        /* the tick before this one, recomputed from its own predecessor */
        if (n >= 2 && chain(ring[(n - 2) % RING], n - 1, steps) != ring[(n - 1) % RING]) {
            fprintf(stderr, "invariant broken at %" PRIu64 "\n", n);
            return 3;
        }
        printf("tick %" PRIu64 " %" PRIx64 "\n", n, h);
    }
    printf("done %" PRIu64 " %" PRIx64 "\n", n, h);
    return 0;
}
