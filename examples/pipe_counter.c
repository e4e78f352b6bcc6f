/*
 * A small multi-process program: the parent counts, the child it forked
 * doubles.  usage: pipe_counter TICKS INTERVAL_MS
 * The parent sends N down one pipe, the child answers 2N up another; the
 * parent checks the answer (exit 3 if wrong) and prints "tick N".  Both
 * processes and both pipes live inside the checkpointed tree.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int read_full(int fd, long *v)
{
    char *p = (char *)v;
    size_t got = 0;

    while (got < sizeof(*v)) {
        ssize_t n = read(fd, p + got, sizeof(*v) - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

int main(int argc, char **argv)
{
    long ticks = argc > 1 ? atol(argv[1]) : 100;
    long ms = argc > 2 ? atol(argv[2]) : 20;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    int down[2], up[2];
    pid_t child;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pipe(down) || pipe(up))
        return 2;
    child = fork();
    if (child < 0)
        return 2;
    if (child == 0) {
        long v;

        close(down[1]);
        close(up[0]);
        while (read_full(down[0], &v) == 0) {
            v *= 2;
            if (write(up[1], &v, sizeof(v)) != sizeof(v))
                return 2;
        }
        return 0;
    }
    close(down[0]);
    close(up[1]);
    for (long n = 1; n <= ticks; n++) {
        long answer;

        if (write(down[1], &n, sizeof(n)) != sizeof(n) || read_full(up[0], &answer) != 0)
            return 2;
        if (answer != 2 * n) {
            fprintf(stderr, "child answered %ld to %ld\n", answer, n);
            return 3;
        }
        printf("tick %ld (child %d says %ld)\n", n, (int)child, answer);
        nanosleep(&ts, NULL);
    }
    close(down[1]);
    waitpid(child, NULL, 0);
    printf("done %ld\n", ticks);
    return 0;
}
