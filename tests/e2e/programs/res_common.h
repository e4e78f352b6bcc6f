/*
 * Header-only helpers shared by the res_*.c test programs (each of which is
 * built as a standalone program).  Every program takes TICKS INTERVAL_MS,
 * prints "tick N ..." lines and "done N", and on a broken invariant prints
 * "FAIL[pid]: ..." on stderr and exits 3.
 *
 * The shim stops every thread with a signal at each checkpoint, so sleeps,
 * poll/epoll_wait and pause may return early with EINTR: these helpers
 * carry on as a robust program does.
 */
#ifndef RES_COMMON_H
#define RES_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline void res_sleep_ms(long ms);

/*
 * Print "FAIL[pid]: ..." and leave with status 3 (also from a forked child).
 * A kill of the tree takes its processes one by one, so a process may see
 * a peer vanish (a pipe's end of file, a child killed) just before its own
 * turn: it waits a moment first, and is then killed without a word.
 */
static inline void res_fail(const char *fmt, ...)
{
    va_list ap;

    res_sleep_ms(300);
    fprintf(stderr, "FAIL[%d]: ", (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (gettid() != getpid()) /* which thread saw it */
        fprintf(stderr, " (thread %d)", (int)gettid());
    fputc('\n', stderr);
    fflush(NULL);
    _exit(3);
}

#define RES_CHECK(cond, ...)          \
    do {                              \
        if (!(cond))                  \
            res_fail(__VA_ARGS__);    \
    } while (0)

/* TICKS and INTERVAL_MS from argv; stdout line-buffered. */
static inline void res_args(int argc, char **argv, long *ticks, long *ms)
{
    *ticks = argc > 1 ? atol(argv[1]) : 100;
    *ms = argc > 2 ? atol(argv[2]) : 20;
    if (*ticks < 1 || *ms < 1)
        res_fail("usage: %s TICKS INTERVAL_MS", argv[0]);
    setvbuf(stdout, NULL, _IOLBF, 0);
}

/* Sleep the whole time even when a signal interrupts. */
static inline void res_sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static inline long res_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/*
 * One read or write (writing != 0) of exactly len bytes, again after a
 * signal.  Enough here: what these programs pass through pipes is written
 * in units of at most PIPE_BUF bytes, which pipes move whole, and the rest
 * goes to regular files.  0 when all moved; -1 on end of file, an error or
 * a short count.
 */
static inline int res_io_full(int fd, char *p, size_t len, int writing)
{
    ssize_t n;

    do
        n = writing ? write(fd, p, len) : read(fd, p, len);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)len ? 0 : -1;
}

#define res_read_full(fd, buf, len) res_io_full((fd), (char *)(buf), (len), 0)
#define res_write_full(fd, buf, len) res_io_full((fd), (char *)(buf), (len), 1)

/*
 * A counter that must never go back and must move at least once every
 * `patience` ticks (a timer or a thread that was not brought back stalls).
 * Start it zeroed but for `what`: the first tick is 1.
 */
struct res_progress {
    const char *what;
    long value, moved_at;
};

static inline void res_progress(struct res_progress *p, long value, long tick, long patience)
{
    RES_CHECK(value >= p->value, "%s went back from %ld to %ld at tick %ld",
              p->what, p->value, value, tick);
    if (value > p->value) {
        p->value = value;
        p->moved_at = tick;
    }
    RES_CHECK(tick - p->moved_at <= patience, "%s stuck at %ld since tick %ld (now %ld)",
              p->what, value, p->moved_at, tick);
}

#endif
