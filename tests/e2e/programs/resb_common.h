/*
 * Shared by the resb_*.c test programs (each is compiled on its own, so
 * everything here is static inline).  Every program takes
 *     TICKS INTERVAL_MS NAME
 * prints "tick N ..." lines and a final "done N", and exits 3 when one of
 * its invariants breaks (2 on a setup error).  NAME makes the program's
 * named objects unique to the test run: a prefix for shm, semaphore and
 * /dev/shm names, or the directory its temporary directory goes in.
 *
 * The checkpoint shim stops every thread with a signal at each checkpoint,
 * so blocking calls may return early with EINTR: everything here retries.
 */
#ifndef RESB_COMMON_H
#define RESB_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RESB_PRINTF __attribute__((format(printf, 1, 2)))

struct resb_args {
    long ticks;
    long ms;
    const char *name;
};

static inline struct resb_args resb_parse(int argc, char **argv)
{
    struct resb_args a;

    if (argc != 4 || atol(argv[1]) <= 0 || atol(argv[2]) < 0) {
        fprintf(stderr, "usage: %s TICKS INTERVAL_MS NAME\n", argv[0]);
        exit(2);
    }
    a.ticks = atol(argv[1]);
    a.ms = atol(argv[2]);
    a.name = argv[3];
    setvbuf(stdout, NULL, _IOLBF, 0);
    return a;
}

/* An invariant broke: say which.  Returns 1, to count broken invariants. */
static inline int resb_vcomplain(const char *fmt, va_list ap)
{
    fprintf(stderr, "[%d] invariant broken: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return 1;
}

RESB_PRINTF static inline int resb_complain(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    resb_vcomplain(fmt, ap);
    va_end(ap);
    return 1;
}

/* An invariant broke: say which, and exit 3. */
RESB_PRINTF static inline _Noreturn void resb_fail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    resb_vcomplain(fmt, ap);
    va_end(ap);
    exit(3);
}

/* A system call failed during setup or teardown: exit 2. */
static inline _Noreturn void resb_die(const char *what)
{
    fprintf(stderr, "[%d] %s: %s\n", (int)getpid(), what, strerror(errno));
    exit(2);
}

static inline void resb_sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000L };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Read (writing 0) or write exactly n bytes; 0 on success, -1 on error or
 * end of file. */
static inline int resb_transfer(int fd, char *p, size_t n, int writing)
{
    while (n > 0) {
        ssize_t moved = writing ? write(fd, p, n) : read(fd, p, n);

        if (moved < 0 && errno == EINTR)
            continue;
        if (moved <= 0)
            return -1;
        p += moved;
        n -= (size_t)moved;
    }
    return 0;
}

static inline int resb_read_full(int fd, void *buf, size_t n)
{
    return resb_transfer(fd, buf, n, 0);
}

static inline int resb_write_full(int fd, const void *buf, size_t n)
{
    return resb_transfer(fd, (char *)buf, n, 1);
}

/* Wait for a child and insist that it exited 0 (its own checks passed). */
static inline void resb_reap(pid_t child)
{
    int status;

    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            resb_die("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        resb_fail("child %d ended with status 0x%x", (int)child, status);
}

#endif
