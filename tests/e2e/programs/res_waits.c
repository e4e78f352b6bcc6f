/*
 * Calls that Linux never restarts after a signal handler (man 7 signal),
 * across checkpoint and restart.  usage: res_waits TICKS INTERVAL_MS
 *
 * The checkpoint signal must stay invisible: none of these calls may fail
 * with EINTR or return before its time because of a checkpoint.  Threads:
 *   main     ticks every INTERVAL_MS, waiting with nanosleep, poll, select
 *            and epoll_wait in turn; sends the signals thread "signals"
 *            waits for, and kicks thread "poller"'s endless poll
 *   sleeper  nanosleep (rem aliasing req), clock_nanosleep relative and
 *            absolute, usleep, and now and then sleep(1)
 *   poller   poll, ppoll, select, pselect, epoll_wait, epoll_pwait,
 *            epoll_pwait2 on a pipe nobody writes (they must time out), and
 *            poll with no timeout on a pipe the main thread writes
 *   signals  sigtimedwait on a signal nobody sends (must time out),
 *            sigwaitinfo and sigtimedwait for SIGUSR2, sigsuspend and pause
 *            for SIGUSR1 (which has a handler): they must return for that
 *            signal and no other reason
 * Checked (exit 3 otherwise): every wait returns what it returns on
 * timeout or for its event, never EINTR, and never before the time asked
 * on CLOCK_MONOTONIC (later is fine: a restart moves the clock on); each
 * thread keeps going.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/time.h>

#include "res_common.h"

enum { WANT_NONE, WANT_USR1, WANT_USR2 };

static struct {
    long ticks, ms;
    int idle[2];  /* a pipe nobody writes */
    int kick[2];  /* the main thread writes a byte when the poller asks */
    int ep;       /* epoll on idle[0] */
    pthread_t signals;
    int stop, finished;          /* atomic */
    int want_signal, want_kick;  /* atomic */
    long rounds[3];              /* atomic: sleeper, poller, signals */
} st;

static volatile sig_atomic_t n_usr1;

static void on_usr1(int sig)
{
    (void)sig;
    n_usr1++;
}

static long long now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static struct timespec ms_ts(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    return ts;
}

/* A wait asked for `ms` and began at `t0`: it must not have been shorter. */
static void check_time(const char *what, long long t0, long ms)
{
    long long took = now_ns() - t0;

    RES_CHECK(took >= ms * 1000000LL, "%s returned after %lld us of %ld ms", what, took / 1000,
              ms);
}

static void check_ok(const char *what, int r, int expected)
{
    RES_CHECK(r == expected, "%s returned %d (errno %d %s), not %d", what, r,
              r < 0 ? errno : 0, r < 0 ? strerror(errno) : "", expected);
}

/* One timed wait with nothing to wait for, by `kind`, of `ms`. */
static void idle_wait(int kind, long ms)
{
    struct pollfd pfd = { .fd = st.idle[0], .events = POLLIN };
    struct timespec ts = ms_ts(ms);
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    struct epoll_event ev[2];
    sigset_t mask;
    fd_set rfds;
    long long t0 = now_ns();
    const char *what = "?";
    int r = 0;

    FD_ZERO(&rfds);
    FD_SET(st.idle[0], &rfds);
    pthread_sigmask(SIG_SETMASK, NULL, &mask);
    switch (kind) {
    case 0:
        what = "poll";
        r = poll(&pfd, 1, (int)ms);
        break;
    case 1:
        what = "ppoll";
        r = ppoll(&pfd, 1, &ts, &mask);
        break;
    case 2:
        what = "select";
        r = select(st.idle[0] + 1, &rfds, NULL, NULL, &tv);
        RES_CHECK(r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0),
                  "select timed out with %ld.%06ld s left", (long)tv.tv_sec, (long)tv.tv_usec);
        RES_CHECK(r != 0 || !FD_ISSET(st.idle[0], &rfds), "select: the idle pipe set");
        break;
    case 3:
        what = "pselect";
        r = pselect(st.idle[0] + 1, &rfds, NULL, NULL, &ts, &mask);
        RES_CHECK(r != 0 || !FD_ISSET(st.idle[0], &rfds), "pselect: the idle pipe set");
        break;
    case 4:
        what = "epoll_wait";
        r = epoll_wait(st.ep, ev, 2, (int)ms);
        break;
    case 5:
        what = "epoll_pwait";
        r = epoll_pwait(st.ep, ev, 2, (int)ms, &mask);
        break;
    default:
        what = "epoll_pwait2";
        r = epoll_pwait2(st.ep, ev, 2, &ts, &mask);
        break;
    }
    check_ok(what, r, 0);
    check_time(what, t0, ms);
}

static void sleep_wait(int kind, long ms)
{
    struct timespec ts = ms_ts(ms), rem = { 0, 0 }, until;
    long long t0 = now_ns();
    const char *what = "?";
    int r = 0;

    switch (kind) {
    case 0:
        what = "nanosleep";
        r = nanosleep(&ts, &ts); /* rem over req, as programs do */
        break;
    case 1:
        what = "clock_nanosleep MONOTONIC";
        r = clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &rem);
        break;
    case 2:
        what = "clock_nanosleep REALTIME";
        r = clock_nanosleep(CLOCK_REALTIME, 0, &ts, &rem);
        break;
    case 3:
        what = "clock_nanosleep TIMER_ABSTIME";
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += ts.tv_sec;
        until.tv_nsec += ts.tv_nsec;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        r = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
        break;
    default:
        what = "usleep";
        r = usleep((useconds_t)(ms * 1000));
        break;
    }
    RES_CHECK(r == 0, "%s returned %d (errno %d)", what, r, errno);
    check_time(what, t0, ms);
}

static void *sleeper(void *unused)
{
    (void)unused;
    for (long i = 0; !__atomic_load_n(&st.stop, __ATOMIC_ACQUIRE); i++) {
        if (i % 50 == 49) {
            long long t0 = now_ns();
            unsigned left = sleep(1);

            RES_CHECK(left == 0, "sleep(1) returned %u", left);
            check_time("sleep(1)", t0, 1000);
        } else {
            sleep_wait((int)(i % 5), 3 + (i * 7) % 17);
        }
        __atomic_add_fetch(&st.rounds[0], 1, __ATOMIC_ACQ_REL);
    }
    __atomic_add_fetch(&st.finished, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

/* poll with no timeout until the main thread writes a byte. */
static void endless_poll(void)
{
    struct pollfd pfd = { .fd = st.kick[0], .events = POLLIN };
    char byte;
    int r;

    __atomic_store_n(&st.want_kick, 1, __ATOMIC_RELEASE);
    r = poll(&pfd, 1, -1);
    check_ok("poll with no timeout", r, 1);
    __atomic_store_n(&st.want_kick, 0, __ATOMIC_RELEASE);
    RES_CHECK(res_read_full(st.kick[0], &byte, 1) == 0, "read kick");
}

static void *poller(void *unused)
{
    (void)unused;
    for (long i = 0; !__atomic_load_n(&st.stop, __ATOMIC_ACQUIRE); i++) {
        if (i % 8 == 7)
            endless_poll();
        else
            idle_wait((int)(i % 8), 3 + (i * 5) % 13);
        __atomic_add_fetch(&st.rounds[1], 1, __ATOMIC_ACQ_REL);
    }
    __atomic_add_fetch(&st.finished, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

static void want(int what)
{
    __atomic_store_n(&st.want_signal, what, __ATOMIC_RELEASE);
}

static void signal_wait(int kind, long ms)
{
    struct timespec ts = ms_ts(ms), forever = { 60, 0 };
    sigset_t set, mask, usr1;
    siginfo_t si;
    long long t0 = now_ns();
    long before;
    int r;

    sigemptyset(&set);
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    switch (kind) {
    case 0: /* a signal nobody sends: times out */
        sigaddset(&set, SIGRTMIN + 3);
        r = sigtimedwait(&set, &si, &ts);
        RES_CHECK(r < 0 && errno == EAGAIN, "sigtimedwait returned %d (errno %d), not EAGAIN",
                  r, errno);
        check_time("sigtimedwait", t0, ms);
        break;
    case 1:
    case 2:
        sigaddset(&set, SIGUSR2);
        want(WANT_USR2);
        r = kind == 1 ? sigwaitinfo(&set, &si) : sigtimedwait(&set, &si, &forever);
        want(WANT_NONE);
        RES_CHECK(r == SIGUSR2 && si.si_signo == SIGUSR2 && si.si_pid == getpid(),
                  "%s returned %d (errno %d) signal %d from %d",
                  kind == 1 ? "sigwaitinfo" : "sigtimedwait", r, errno, si.si_signo,
                  (int)si.si_pid);
        break;
    case 3:
        pthread_sigmask(SIG_SETMASK, NULL, &mask);
        sigdelset(&mask, SIGUSR1);
        before = n_usr1;
        want(WANT_USR1);
        r = sigsuspend(&mask);
        want(WANT_NONE);
        RES_CHECK(r < 0 && errno == EINTR && n_usr1 > before,
                  "sigsuspend returned %d (errno %d) with %ld SIGUSR1 before, %ld after", r,
                  errno, before, (long)n_usr1);
        break;
    default:
        before = n_usr1;
        want(WANT_USR1);
        pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
        r = pause();
        pthread_sigmask(SIG_BLOCK, &usr1, NULL);
        want(WANT_NONE);
        RES_CHECK(r < 0 && errno == EINTR && n_usr1 > before,
                  "pause returned %d (errno %d) with %ld SIGUSR1 before, %ld after", r, errno,
                  before, (long)n_usr1);
        break;
    }
}

static void *signals(void *unused)
{
    (void)unused;
    for (long i = 0; !__atomic_load_n(&st.stop, __ATOMIC_ACQUIRE); i++) {
        signal_wait((int)(i % 5), 3 + (i * 3) % 11);
        __atomic_add_fetch(&st.rounds[2], 1, __ATOMIC_ACQ_REL);
    }
    __atomic_add_fetch(&st.finished, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

/* What the other threads wait for. */
static void serve_threads(void)
{
    int what = __atomic_load_n(&st.want_signal, __ATOMIC_ACQUIRE);

    if (what == WANT_USR1)
        RES_CHECK(pthread_kill(st.signals, SIGUSR1) == 0, "pthread_kill SIGUSR1");
    else if (what == WANT_USR2)
        RES_CHECK(pthread_kill(st.signals, SIGUSR2) == 0, "pthread_kill SIGUSR2");
    if (__atomic_load_n(&st.want_kick, __ATOMIC_ACQUIRE)) {
        char byte = 'k';
        struct pollfd pfd = { .fd = st.kick[0], .events = POLLIN };

        if (poll(&pfd, 1, 0) == 0) /* one byte at a time */
            RES_CHECK(res_write_full(st.kick[1], &byte, 1) == 0, "write kick");
    }
}

/* The tick's wait, of `ms`. */
static void tick_wait(long tick, long ms)
{
    switch (tick % 4) {
    case 0:
        sleep_wait(0, ms);
        break;
    case 1:
        idle_wait(0, ms);
        break;
    case 2:
        idle_wait(2, ms);
        break;
    default:
        idle_wait(4, ms);
        break;
    }
}

int main(int argc, char **argv)
{
    static const char *const names[3] = { "sleeper rounds", "poller rounds", "signals rounds" };
    struct res_progress progress[3];
    struct epoll_event ev = { .events = EPOLLIN };
    struct sigaction sa;
    pthread_t sleeper_t, poller_t;
    sigset_t block;
    long tick, patience;

    res_args(argc, argv, &st.ticks, &st.ms);
    RES_CHECK(pipe(st.idle) == 0 && pipe(st.kick) == 0, "pipe");
    st.ep = epoll_create1(EPOLL_CLOEXEC);
    RES_CHECK(st.ep >= 0 && epoll_ctl(st.ep, EPOLL_CTL_ADD, st.idle[0], &ev) == 0, "epoll");
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr1; /* no SA_RESTART: the program's signal interrupts */
    sigemptyset(&sa.sa_mask);
    RES_CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction SIGUSR1");
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGUSR2);
    sigaddset(&block, SIGRTMIN + 3);
    RES_CHECK(pthread_sigmask(SIG_BLOCK, &block, NULL) == 0, "block"); /* threads too */
    RES_CHECK(pthread_create(&sleeper_t, NULL, sleeper, NULL) == 0
                  && pthread_create(&poller_t, NULL, poller, NULL) == 0
                  && pthread_create(&st.signals, NULL, signals, NULL) == 0,
              "pthread_create");

    for (int i = 0; i < 3; i++)
        progress[i] = (struct res_progress){ names[i], 0, 0 };
    patience = 50 + 2500 / st.ms; /* ticks; sleep(1) is the longest wait */
    for (tick = 1; tick <= st.ticks; tick++) {
        long rounds[3];

        serve_threads();
        tick_wait(tick, st.ms);
        for (int i = 0; i < 3; i++) {
            rounds[i] = __atomic_load_n(&st.rounds[i], __ATOMIC_ACQUIRE);
            res_progress(&progress[i], rounds[i], tick, patience);
        }
        printf("tick %ld sleeper %ld poller %ld signals %ld\n", tick, rounds[0], rounds[1],
               rounds[2]);
    }
    __atomic_store_n(&st.stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; __atomic_load_n(&st.finished, __ATOMIC_ACQUIRE) < 3; i++) {
        RES_CHECK(i < 3000 / st.ms, "the threads did not finish");
        serve_threads();
        res_sleep_ms(st.ms);
    }
    pthread_join(sleeper_t, NULL);
    pthread_join(poller_t, NULL);
    pthread_join(st.signals, NULL);
    printf("done %ld sleeper %ld poller %ld signals %ld\n", st.ticks, st.rounds[0], st.rounds[1],
           st.rounds[2]);
    return 0;
}
