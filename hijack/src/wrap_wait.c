/*
 * Calls that wait, made blind to the checkpoint signal.
 *
 * WHY: at every checkpoint each thread is stopped by the reserved signal
 * (suspend.c), whose handler has SA_RESTART.  But Linux never restarts some
 * calls once a handler ran, whatever SA_RESTART says (man 7 signal,
 * "Interruption of system calls and library functions by signal
 * handlers"): the sleeps (nanosleep, clock_nanosleep, usleep; sleep returns
 * the seconds left), the multiplexers (poll, ppoll, select, pselect,
 * epoll_wait, epoll_pwait, epoll_pwait2) and the signal waits (pause,
 * sigsuspend, sigtimedwait, sigwaitinfo).  They fail with EINTR, so a
 * program would see every checkpoint as a signal nobody sent.
 *
 * The handler counts, per thread, the calls it made fail with EINTR
 * (suspend_interruptions()).  Each wrapper reads the counter before the
 * call; when the call fails with EINTR and the counter moved, the EINTR was
 * ours and the call is made again for the time left.  When the counter did
 * not move, the EINTR is the program's own signal and goes back as the real
 * call gave it.
 *
 * Time left: measured on CLOCK_MONOTONIC from the wrapper's entry, and
 * never more than the original timeout (after a restart on another host the
 * monotonic clock may have jumped either way; the time stopped for the
 * checkpoint counts as time waited).  Once the time is used up the
 * multiplexers and sigtimedwait are called once more with a zero timeout
 * (so they return what they return on timeout, or what became ready); the
 * sleeps return as if they had slept.  Infinite timeouts are waited again
 * in full; pause, sigsuspend and sigwaitinfo are simply called again.
 *
 * Signal masks and sets given to these calls lose the reserved signal: a
 * mask that blocked it would keep the thread from stopping, a set that
 * waited for it would steal it from the handler.
 *
 * What these wrappers cannot see: calls glibc makes inside itself (sleep
 * and usleep are nanosleep underneath, hence their own wrappers here;
 * sigwait and sigpause do not go through sigtimedwait and sigsuspend), and
 * raw syscall()s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define NSEC 1000000000L

/* struct wait and the helpers below are shared with wrap_ipc.c (shim.h). */

void wait_begin(struct wait *w)
{
    w->saved_errno = errno;
    w->retried = 0;
    clock_gettime(CLOCK_MONOTONIC, &w->start);
}

/*
 * wait_begin on CLOCK_MONOTONIC_COARSE, a fifth of the cost, for calls as
 * frequent as read and write (wrap_ipc.c).  That clock lags by up to its
 * resolution (a tick): the start is put one resolution later, so that
 * the time counted as spent is never more than what was.  A retry may
 * then wait up to a tick longer, never shorter; the kernel counts socket
 * timeouts in ticks too.
 */
void wait_begin_coarse(struct wait *w)
{
    static long resolution; /* ns; the same for all threads */
    long res = __atomic_load_n(&resolution, __ATOMIC_RELAXED);

    w->saved_errno = errno;
    w->retried = 0;
    if (res == 0) {
        struct timespec r;

        res = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0 && r.tv_sec == 0 ? r.tv_nsec : -1;
        __atomic_store_n(&resolution, res, __ATOMIC_RELAXED);
    }
    if (res < 0) { /* no coarse clock: the precise one */
        clock_gettime(CLOCK_MONOTONIC, &w->start);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC_COARSE, &w->start);
    w->start.tv_nsec += res;
    if (w->start.tv_nsec >= NSEC) {
        w->start.tv_nsec -= NSEC;
        w->start.tv_sec++;
    }
}

/* Before each call. */
void wait_snapshot(struct wait *w)
{
    w->seen = suspend_interruptions();
}

/* After a call: was it our signal that made it fail with EINTR? */
int wait_again(struct wait *w, int eintr)
{
    if (!eintr || suspend_interruptions() == w->seen)
        return 0;
    w->retried = 1;
    return 1;
}

/* A successful result after a retry leaves errno as it was at entry. */
long wait_done(const struct wait *w, long result)
{
    if (result >= 0 && w->retried)
        errno = w->saved_errno;
    return result;
}

/* The part of w->limit not yet spent, in [0, limit]; nonzero if any. */
int time_left(const struct wait *w, struct timespec *left)
{
    struct timespec now;
    long long sec;
    long nsec;

    clock_gettime(CLOCK_MONOTONIC, &now);
    sec = (long long)now.tv_sec - w->start.tv_sec;
    nsec = now.tv_nsec - w->start.tv_nsec;
    if (nsec < 0) {
        nsec += NSEC;
        sec--;
    }
    if (sec < 0)
        sec = nsec = 0; /* the clock went back: count nothing as spent */
    sec = (long long)w->limit.tv_sec - sec;
    nsec = w->limit.tv_nsec - nsec;
    if (nsec < 0) {
        nsec += NSEC;
        sec--;
    }
    if (sec < 0 || (sec == 0 && nsec == 0)) {
        left->tv_sec = 0;
        left->tv_nsec = 0;
        return 0;
    }
    left->tv_sec = (time_t)sec;
    left->tv_nsec = nsec;
    return 1;
}

/* Milliseconds, rounded up (never more than the limit they came from). */
static int ms_left(const struct wait *w)
{
    struct timespec left;

    time_left(w, &left);
    return (int)(left.tv_sec * 1000 + (left.tv_nsec + 999999) / 1000000);
}

static void limit_ms(struct wait *w, int ms)
{
    w->limit.tv_sec = ms / 1000;
    w->limit.tv_nsec = (long)(ms % 1000) * 1000000L;
}

/* set without the reserved signal (in copy if it had it). */
static const sigset_t *without_reserved(const sigset_t *set, sigset_t *copy)
{
    int sig = suspend_signal();

    if (set == NULL || sig == 0 || !sigismember(set, sig))
        return set;
    *copy = *set;
    sigdelset(copy, sig);
    return copy;
}

/* ---- sleeps ---- */

/* Clocks on which a relative sleep is real time passing, so that a deadline
 * on CLOCK_MONOTONIC measures it; on a CPU-time clock the kernel's remainder
 * is used instead. */
/*
 * The two shapes of a wrapped wait: call(ctx, timeout) again while our
 * signal is what interrupted it, each time for the time left of the
 * original timeout.  again(ctx), if any, runs before each new call (select
 * puts its fd sets back).  retry_ts is shared (shim.h).
 */
typedef int (*ms_call)(void *ctx, int timeout);

static int retry_ms(int timeout, ms_call call, void *ctx)
{
    struct wait w;
    int ask = timeout, n;

    wait_begin(&w);
    limit_ms(&w, timeout);
    for (;;) {
        wait_snapshot(&w);
        n = call(ctx, ask);
        if (!wait_again(&w, n < 0 && errno == EINTR))
            return wait_done(&w, n);
        if (timeout >= 0)
            ask = ms_left(&w);
    }
}

long retry_ts(const struct timespec *timeout, ts_call call, void *ctx,
              void (*again)(void *ctx))
{
    struct wait w;
    struct timespec ask;
    const struct timespec *asking = timeout;
    int n;

    wait_begin(&w);
    for (;;) {
        wait_snapshot(&w);
        n = call(ctx, asking);
        if (!wait_again(&w, n < 0 && errno == EINTR))
            return wait_done(&w, n);
        if (again)
            again(ctx);
        if (timeout) {
            if (asking == timeout)
                w.limit = *timeout;
            time_left(&w, &ask);
            asking = &ask;
        }
    }
}

static int real_time_clock(clockid_t clock)
{
    return clock >= 0 && clock != CLOCK_PROCESS_CPUTIME_ID && clock != CLOCK_THREAD_CPUTIME_ID;
}

/*
 * A relative sleep through nanosleep (via_nanosleep) or clock_nanosleep:
 * 0, or the error number (errno is left to the caller to set).  On EINTR
 * from the program's signal, *rem (if not NULL) holds the time left.
 */
static int sleep_for(int via_nanosleep, clockid_t clock, const struct timespec *req,
                     struct timespec *rem, struct wait *w)
{
    struct timespec ask, krem;
    const struct timespec *asking = req; /* the program's, untouched, first */

    for (;;) {
        int err;

        wait_snapshot(w);
        if (via_nanosleep)
            err = real_nanosleep(asking, &krem) == 0 ? 0 : errno;
        else
            err = real_clock_nanosleep(clock, 0, asking, &krem);
        if (!wait_again(w, err == EINTR)) {
            if (err == EINTR && rem)
                *rem = krem;
            return err;
        }
        if (asking == req)
            w->limit = *req; /* valid: the kernel took it */
        if (real_time_clock(clock)) {
            if (!time_left(w, &ask))
                return 0;
        } else {
            ask = krem; /* the kernel's count on that clock, within the request */
            if (ask.tv_sec == 0 && ask.tv_nsec == 0)
                return 0;
        }
        asking = &ask;
    }
}

SHIM_EXPORT int nanosleep(const struct timespec *req, struct timespec *rem)
{
    struct wait w;
    int err;

    wait_begin(&w);
    err = sleep_for(1, CLOCK_REALTIME, req, rem, &w);
    if (err) {
        errno = err;
        return -1;
    }
    return wait_done(&w, 0);
}

SHIM_EXPORT int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req,
                                struct timespec *rem)
{
    struct wait w;

    wait_begin(&w);
    if (flags & TIMER_ABSTIME) {
        /* the same absolute time again: nothing to compute */
        for (;;) {
            int err;

            wait_snapshot(&w);
            err = real_clock_nanosleep(clock, flags, req, rem);
            if (!wait_again(&w, err == EINTR))
                return err;
        }
    }
    return sleep_for(0, clock, req, rem, &w); /* errno untouched, as glibc's */
}

/* glibc's sleep and usleep call nanosleep inside libc, where no wrapper
 * sees it; so they are done here the way glibc does them. */
SHIM_EXPORT unsigned int sleep(unsigned int seconds)
{
    struct timespec req = { (time_t)seconds, 0 }, rem = { 0, 0 };
    struct wait w;
    int err;

    wait_begin(&w);
    err = sleep_for(1, CLOCK_REALTIME, &req, &rem, &w);
    if (err == 0) {
        errno = w.saved_errno;
        return 0;
    }
    errno = err;
    /* interrupted: the whole seconds not slept (glibc truncates) */
    return err == EINTR ? (unsigned int)rem.tv_sec : seconds;
}

SHIM_EXPORT int usleep(useconds_t usec)
{
    struct timespec req = { (time_t)(usec / 1000000), (long)(usec % 1000000) * 1000L };
    struct wait w;
    int err;

    wait_begin(&w);
    err = sleep_for(1, CLOCK_REALTIME, &req, NULL, &w);
    if (err) {
        errno = err;
        return -1;
    }
    return wait_done(&w, 0);
}

/* ---- multiplexers ---- */

struct poll_args {
    struct pollfd *fds;
    nfds_t nfds;
    const sigset_t *mask;
};

static int call_poll(void *ctx, int timeout)
{
    struct poll_args *a = ctx;

    return real_poll(a->fds, a->nfds, timeout);
}

SHIM_EXPORT int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    struct poll_args a = { fds, nfds, NULL };

    return retry_ms(timeout, call_poll, &a);
}

static long call_ppoll(void *ctx, const struct timespec *timeout)
{
    struct poll_args *a = ctx;

    return real_ppoll(a->fds, a->nfds, timeout, a->mask);
}

SHIM_EXPORT int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
                      const sigset_t *mask)
{
    sigset_t copy;
    struct poll_args a = { fds, nfds, without_reserved(mask, &copy) };

    return retry_ts(timeout, call_ppoll, &a, NULL);
}

/* What -D_FORTIFY_SOURCE programs call instead (glibc's go to its own
 * poll and ppoll, out of reach). */
extern void __chk_fail(void) __attribute__((noreturn));

SHIM_EXPORT int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fdslen)
{
    if (fdslen / sizeof(*fds) < nfds)
        __chk_fail();
    return poll(fds, nfds, timeout);
}

SHIM_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
                            const sigset_t *mask, size_t fdslen)
{
    if (fdslen / sizeof(*fds) < nfds)
        __chk_fail();
    return ppoll(fds, nfds, timeout, mask);
}

/* What select's fd sets are worth keeping a copy of (more, rarely seen,
 * Linux leaves untouched on EINTR anyway). */
#define SELECT_KEEP_FDS 4096

struct fd_sets {
    fd_set *set[3];
    size_t bytes;
    unsigned long copy[3][SELECT_KEEP_FDS / (8 * sizeof(unsigned long))];
};

static void fd_sets_keep(struct fd_sets *s, int nfds, fd_set *r, fd_set *wr, fd_set *e)
{
    const size_t word_bits = 8 * sizeof(unsigned long);

    s->set[0] = r;
    s->set[1] = wr;
    s->set[2] = e;
    s->bytes = 0;
    if (nfds <= 0 || nfds > SELECT_KEEP_FDS)
        return;
    /* the kernel's view: whole longs */
    s->bytes = ((size_t)nfds + word_bits - 1) / word_bits * sizeof(unsigned long);
    for (int i = 0; i < 3; i++)
        if (s->set[i])
            memcpy(s->copy[i], s->set[i], s->bytes);
}

static void fd_sets_restore(const struct fd_sets *s)
{
    for (int i = 0; i < 3; i++)
        if (s->set[i] && s->bytes)
            memcpy(s->set[i], s->copy[i], s->bytes);
}

/* select's timeval as the timespec Linux waits for (glibc's normalisation);
 * called only once the kernel accepted it. */
struct timespec timeval_limit(const struct timeval *tv)
{
    struct timespec ts;
    long long sec = tv->tv_sec, whole = tv->tv_usec / 1000000;

    if (whole > 0x7fffffffffffffffLL - sec) {
        ts.tv_sec = (time_t)0x7fffffffffffffffLL;
        ts.tv_nsec = NSEC - 1;
    } else {
        ts.tv_sec = (time_t)(sec + whole);
        ts.tv_nsec = (long)(tv->tv_usec % 1000000) * 1000L;
    }
    return ts;
}

/* Linux writes the time left into *timeout: the retry is given the time
 * left of the whole wait the same way, so the program finds it there. */
SHIM_EXPORT int select(int nfds, fd_set *r, fd_set *wr, fd_set *e, struct timeval *timeout)
{
    struct wait w;
    struct fd_sets sets;
    struct timeval original;
    int n, have_limit = 0;

    wait_begin(&w);
    if (timeout)
        original = *timeout;
    fd_sets_keep(&sets, nfds, r, wr, e);
    for (;;) {
        wait_snapshot(&w);
        n = real_select(nfds, r, wr, e, timeout);
        if (!wait_again(&w, n < 0 && errno == EINTR))
            return wait_done(&w, n);
        fd_sets_restore(&sets);
        if (timeout) {
            struct timespec left;

            if (!have_limit) {
                w.limit = timeval_limit(&original);
                have_limit = 1;
            }
            time_left(&w, &left);
            timeout->tv_sec = left.tv_sec;
            timeout->tv_usec = (suseconds_t)((left.tv_nsec + 999) / 1000);
            if (timeout->tv_usec >= 1000000) {
                timeout->tv_sec++;
                timeout->tv_usec -= 1000000;
            }
        }
    }
}

struct pselect_args {
    int nfds;
    fd_set *r, *wr, *e;
    const sigset_t *mask;
    struct fd_sets sets;
};

static long call_pselect(void *ctx, const struct timespec *timeout)
{
    struct pselect_args *a = ctx;

    return real_pselect(a->nfds, a->r, a->wr, a->e, timeout, a->mask);
}

static void pselect_again(void *ctx)
{
    fd_sets_restore(&((struct pselect_args *)ctx)->sets);
}

SHIM_EXPORT int pselect(int nfds, fd_set *r, fd_set *wr, fd_set *e,
                        const struct timespec *timeout, const sigset_t *mask)
{
    sigset_t copy;
    struct pselect_args a;

    a.nfds = nfds;
    a.r = r;
    a.wr = wr;
    a.e = e;
    a.mask = without_reserved(mask, &copy);

    fd_sets_keep(&a.sets, nfds, r, wr, e);
    return retry_ts(timeout, call_pselect, &a, pselect_again);
}

struct epoll_args {
    int ep;
    struct epoll_event *events;
    int max;
    const sigset_t *mask;
};

static int call_epoll_wait(void *ctx, int timeout)
{
    struct epoll_args *a = ctx;

    return real_epoll_wait(a->ep, a->events, a->max, timeout);
}

SHIM_EXPORT int epoll_wait(int ep, struct epoll_event *events, int max, int timeout)
{
    struct epoll_args a = { ep, events, max, NULL };

    return retry_ms(timeout, call_epoll_wait, &a);
}

static int call_epoll_pwait(void *ctx, int timeout)
{
    struct epoll_args *a = ctx;

    return real_epoll_pwait(a->ep, a->events, a->max, timeout, a->mask);
}

SHIM_EXPORT int epoll_pwait(int ep, struct epoll_event *events, int max, int timeout,
                            const sigset_t *mask)
{
    sigset_t copy;
    struct epoll_args a = { ep, events, max, without_reserved(mask, &copy) };

    return retry_ms(timeout, call_epoll_pwait, &a);
}

static long call_epoll_pwait2(void *ctx, const struct timespec *timeout)
{
    struct epoll_args *a = ctx;

    return real_epoll_pwait2(a->ep, a->events, a->max, timeout, a->mask);
}

SHIM_EXPORT int epoll_pwait2(int ep, struct epoll_event *events, int max,
                             const struct timespec *timeout, const sigset_t *mask)
{
    sigset_t copy;
    struct epoll_args a = { ep, events, max, without_reserved(mask, &copy) };

    return retry_ts(timeout, call_epoll_pwait2, &a, NULL);
}

/* ---- signal waits ---- */

SHIM_EXPORT int pause(void)
{
    struct wait w;
    int r;

    wait_begin(&w);
    do {
        wait_snapshot(&w);
        r = real_pause();
    } while (wait_again(&w, r < 0 && errno == EINTR));
    return r;
}

SHIM_EXPORT int sigsuspend(const sigset_t *mask)
{
    struct wait w;
    sigset_t copy;
    const sigset_t *m = without_reserved(mask, &copy);
    int r;

    wait_begin(&w);
    do {
        wait_snapshot(&w);
        r = real_sigsuspend(m);
    } while (wait_again(&w, r < 0 && errno == EINTR));
    return r;
}

struct sigwait_args {
    const sigset_t *set;
    siginfo_t *info;
};

static long call_sigtimedwait(void *ctx, const struct timespec *timeout)
{
    struct sigwait_args *a = ctx;

    /* no timeout (sigwaitinfo, or sigtimedwait given NULL): wait for ever */
    return timeout ? real_sigtimedwait(a->set, a->info, timeout)
                   : real_sigwaitinfo(a->set, a->info);
}

SHIM_EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *info)
{
    sigset_t copy;
    struct sigwait_args a = { without_reserved(set, &copy), info };

    return retry_ts(NULL, call_sigtimedwait, &a, NULL);
}

SHIM_EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout)
{
    sigset_t copy;
    struct sigwait_args a = { without_reserved(set, &copy), info };

    return retry_ts(timeout, call_sigtimedwait, &a, NULL);
}

/* glibc's sigwait waits again after EINTR by itself, but through its own
 * sigtimedwait: only the set needs the reserved signal taken out. */
SHIM_EXPORT int sigwait(const sigset_t *set, int *sig)
{
    sigset_t copy;

    return real_sigwait(without_reserved(set, &copy), sig);
}
