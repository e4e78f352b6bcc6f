/*
 * Single-threaded counter.  usage: counter_single TICKS INTERVAL_MS
 * Each tick advances a counter and a hash chain kept in heap memory and
 * prints "tick N HASH".  Invariants checked every tick (exit 3 if broken):
 * a 1 MiB ring in the heap holds the last counters, and the hash chain
 * recomputed from the ring's last entry agrees.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RING (1u << 17) /* 128 Ki uint64 = 1 MiB */

static uint64_t step(uint64_t h, uint64_t n) { return h * 6364136223846793005ull + n; }

int main(int argc, char **argv)
{
    long ticks = argc > 1 ? atol(argv[1]) : 100;
    long ms = argc > 2 ? atol(argv[2]) : 20;
    uint64_t *ring = calloc(RING, sizeof(uint64_t));
    uint64_t n = 0, h = 1, h_before;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    if (!ring)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    while ((long)n < ticks) {
        h_before = h;
        n++;
        h = step(h, n);
        ring[n % RING] = n;
        if (ring[(n - 1) % RING] != n - 1 || step(h_before, ring[n % RING]) != h) {
            fprintf(stderr, "invariant broken at %" PRIu64 "\n", n);
            return 3;
        }
        printf("tick %" PRIu64 " %" PRIx64 "\n", n, h);
        nanosleep(&ts, NULL);
    }
    printf("done %" PRIu64 " %" PRIx64 "\n", n, h);
    return 0;
}
