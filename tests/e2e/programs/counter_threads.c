/*
 * Multi-threaded counter.  usage: counter_threads TICKS INTERVAL_MS
 * Four workers take turns under a mutex and condition variable: worker k
 * may only add when turn == k, so after every full round each worker has
 * added exactly the same amount.  The main thread prints "tick N TOTAL"
 * and checks (exit 3) that TOTAL equals the sum of the per-worker counts
 * and that no worker is more than one step ahead of another.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WORKERS 4

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static long counts[WORKERS];
static long total;
static int turn;

static void *worker(void *arg)
{
    int k = (int)(long)arg;

    for (;;) {
        pthread_mutex_lock(&lock);
        while (turn != k)
            pthread_cond_wait(&cond, &lock);
        counts[k]++;
        total++;
        turn = (turn + 1) % WORKERS;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    long ticks = argc > 1 ? atol(argv[1]) : 100;
    long ms = argc > 2 ? atol(argv[2]) : 20;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    pthread_t tids[WORKERS];

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (long k = 0; k < WORKERS; k++)
        if (pthread_create(&tids[k], NULL, worker, (void *)k) != 0)
            return 2;
    for (long n = 1; n <= ticks; n++) {
        long sum = 0, lo, hi;

        nanosleep(&ts, NULL);
        pthread_mutex_lock(&lock);
        lo = hi = counts[0];
        for (int k = 0; k < WORKERS; k++) {
            sum += counts[k];
            lo = counts[k] < lo ? counts[k] : lo;
            hi = counts[k] > hi ? counts[k] : hi;
        }
        if (sum != total || hi - lo > 1) {
            fprintf(stderr, "invariant broken at tick %ld: sum %ld total %ld spread %ld\n",
                    n, sum, total, hi - lo);
            return 3;
        }
        printf("tick %ld %ld\n", n, total);
        pthread_mutex_unlock(&lock);
    }
    printf("done %ld\n", ticks);
    return 0;
}
