/*
 * Threads that never make a system call, in a program that does its best
 * to keep signals out: every worker blocks all signals, and main tries to
 * ignore every signal there is.  usage: busy_threads TICKS INTERVAL_MS
 * Prints "tick N" from main; exits 3 if a worker's counter ever goes
 * backwards (the state must survive suspension and restore).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WORKERS 3

static volatile unsigned long counters[WORKERS];

static void *spin(void *arg)
{
    volatile unsigned long *c = &counters[(long)arg];
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;)
        (*c)++;
    return NULL;
}

int main(int argc, char **argv)
{
    long ticks = argc > 1 ? atol(argv[1]) : 100;
    long ms = argc > 2 ? atol(argv[2]) : 20;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    unsigned long last[WORKERS] = { 0 };
    pthread_t t;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int sig = 1; sig <= SIGRTMAX; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig != SIGINT && sig != SIGTERM)
            signal(sig, SIG_IGN);
    for (long k = 0; k < WORKERS; k++)
        if (pthread_create(&t, NULL, spin, (void *)k) != 0)
            return 2;
    for (long n = 1; n <= ticks; n++) {
        nanosleep(&ts, NULL);
        for (int k = 0; k < WORKERS; k++) {
            if (counters[k] < last[k])
                return 3;
            last[k] = counters[k];
        }
        printf("tick %ld\n", n);
    }
    printf("done %ld\n", ticks);
    return 0;
}
