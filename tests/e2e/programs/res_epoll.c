/*
 * Event file descriptors in one epoll loop, across checkpoint and restart.
 * usage: res_epoll TICKS INTERVAL_MS
 *
 * Sources, each with its own counter:
 *   timerfd   periodic at INTERVAL_MS; each expiry read is one tick
 *   eventfd   a helper thread adds 1 every INTERVAL_MS (and counts it first)
 *   signalfd  SIGUSR1, blocked, sent to itself with sigqueue and a serial
 *             number, the next one only once the last one is read
 *   inotify   IN_CLOSE_WRITE on a file in a temporary directory it creates;
 *             it rewrites the file with a serial number, the next only once
 *             the event for the last one is read
 * Checked (exit 3 otherwise): no counter goes back and each keeps moving
 * (the timerfd: while the thread writes the eventfd, ticks must come);
 * expirations >= ticks and no more than the monotonic time allows; the
 * eventfd total never exceeds what the thread wrote and equals it at the
 * end; signals arrive numbered 1, 2, 3, ... with SI_QUEUE; each inotify
 * event is the next one, on our watch, and the file then holds its number.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>

#include "res_common.h"

enum { SRC_TIMER, SRC_EVENT, SRC_SIGNAL, SRC_INOTIFY, N_SRC };

static struct state {
    long ticks, ms, tick, start;
    int fd[N_SRC], wd;
    char dir[256], file[300];
    long timer_exp, efd_total, sig_sent, sig_got, file_written, file_seen;
    long thread_wrote; /* atomic: the helper thread's count */
    long wrote_at_tick; /* its value at the last tick */
    int stop;          /* atomic */
    struct res_progress efd_p, sig_p, file_p;
} st;

static void *helper(void *unused)
{
    uint64_t one = 1;

    (void)unused;
    while (!__atomic_load_n(&st.stop, __ATOMIC_ACQUIRE)) {
        res_sleep_ms(st.ms);
        __atomic_add_fetch(&st.thread_wrote, 1, __ATOMIC_ACQ_REL); /* counted before sent */
        RES_CHECK(res_write_full(st.fd[SRC_EVENT], &one, sizeof(one)) == 0, "eventfd write");
    }
    return NULL;
}

static void rewrite_file(long serial)
{
    char text[32];
    int fd = open(st.file, O_WRONLY | O_TRUNC | O_CLOEXEC);

    snprintf(text, sizeof(text), "%ld\n", serial);
    RES_CHECK(fd >= 0 && res_write_full(fd, text, strlen(text)) == 0, "write %s", st.file);
    close(fd);
}

/* The number in the file; -1: the file is empty. */
static long file_number(void)
{
    char text[32] = "";
    int fd = open(st.file, O_RDONLY | O_CLOEXEC);

    RES_CHECK(fd >= 0 && read(fd, text, sizeof(text) - 1) >= 0, "read %s", st.file);
    close(fd);
    return text[0] ? atol(text) : -1;
}

static void on_timer(void)
{
    uint64_t exp;
    long elapsed;

    if (read(st.fd[SRC_TIMER], &exp, sizeof(exp)) != (ssize_t)sizeof(exp))
        return; /* nothing after all */
    st.timer_exp += (long)exp;
    if (st.tick == st.ticks)
        return; /* the last tick is done: only the stragglers are awaited */
    st.tick++;
    st.wrote_at_tick = __atomic_load_n(&st.thread_wrote, __ATOMIC_ACQUIRE);
    if (st.sig_sent == st.sig_got) {
        union sigval v = { .sival_int = (int)++st.sig_sent };
        RES_CHECK(sigqueue(getpid(), SIGUSR1, v) == 0, "sigqueue");
    }
    if (st.file_written == st.file_seen)
        rewrite_file(++st.file_written);
    elapsed = res_now_ms() - st.start;
    RES_CHECK(st.timer_exp >= st.tick && st.timer_exp <= elapsed / st.ms + 5,
              "%ld timerfd expirations at tick %ld after %ld ms", st.timer_exp, st.tick, elapsed);
    RES_CHECK(st.efd_total <= __atomic_load_n(&st.thread_wrote, __ATOMIC_ACQUIRE),
              "eventfd total %ld is more than the thread wrote", st.efd_total);
    res_progress(&st.efd_p, st.efd_total, st.tick, 50);
    res_progress(&st.sig_p, st.sig_got, st.tick, 50);
    res_progress(&st.file_p, st.file_seen, st.tick, 50);
    printf("tick %ld timer %ld eventfd %ld signal %ld inotify %ld\n", st.tick, st.timer_exp,
           st.efd_total, st.sig_got, st.file_seen);
}

/* The thread writes once an interval: far more writes than that since the
 * last tick mean the timerfd stopped (it is not in a stall of the whole
 * process: the thread would be stopped too). */
static void check_timer_alive(void)
{
    long wrote = __atomic_load_n(&st.thread_wrote, __ATOMIC_ACQUIRE);
    struct itimerspec its = { 0 };

    if (wrote - st.wrote_at_tick <= 50 + 3000 / st.ms)
        return;
    timerfd_gettime(st.fd[SRC_TIMER], &its);
    res_fail("timerfd stopped after tick %ld: the thread wrote %ld times since; "
             "it_value %ld.%09ld it_interval %ld.%09ld", st.tick, wrote - st.wrote_at_tick,
             (long)its.it_value.tv_sec, its.it_value.tv_nsec, (long)its.it_interval.tv_sec,
             its.it_interval.tv_nsec);
}

static void on_eventfd(void)
{
    uint64_t v;

    if (read(st.fd[SRC_EVENT], &v, sizeof(v)) == (ssize_t)sizeof(v))
        st.efd_total += (long)v;
    if (st.tick < st.ticks)
        check_timer_alive();
}

static void on_signal(void)
{
    struct signalfd_siginfo si;

    while (read(st.fd[SRC_SIGNAL], &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        RES_CHECK(si.ssi_signo == SIGUSR1 && si.ssi_code == SI_QUEUE
                      && si.ssi_int == st.sig_got + 1 && st.sig_got + 1 == st.sig_sent,
                  "signal %u code %d value %d after %ld of %ld", si.ssi_signo, si.ssi_code,
                  si.ssi_int, st.sig_got, st.sig_sent);
        st.sig_got = si.ssi_int;
    }
}

static void on_inotify(void)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n = read(st.fd[SRC_INOTIFY], buf, sizeof(buf));

    for (char *p = buf; n > 0 && p < buf + n;) {
        struct inotify_event *ev = (struct inotify_event *)p;

        RES_CHECK(ev->wd == st.wd && ev->mask == IN_CLOSE_WRITE,
                  "inotify event wd %d mask %#x", ev->wd, ev->mask);
        st.file_seen++;
        /* The file is not open between writes, so a restart does not roll
         * it back: after a kill it may hold a number written after the
         * checkpoint, or be empty (the killed run was cut off between its
         * O_TRUNC and its write, and this event is one the checkpoint
         * caught before it was read).  Never an older number. */
        long number = file_number();

        RES_CHECK(st.file_seen == st.file_written && (number >= st.file_seen || number == -1),
                  "inotify event %ld: wrote %ld, the file says %ld", st.file_seen,
                  st.file_written, number);
        p += sizeof(*ev) + ev->len;
    }
}

static void (*const handlers[N_SRC])(void) = { on_timer, on_eventfd, on_signal, on_inotify };

/* Everything set up and running; returns the epoll descriptor. */
static int setup(void)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    struct timespec every = { st.ms / 1000, (st.ms % 1000) * 1000000L };
    struct itimerspec its = { every, every };
    sigset_t usr1;
    int ep;

    snprintf(st.dir, sizeof(st.dir), "%s/res_epoll.XXXXXX", tmp);
    RES_CHECK(mkdtemp(st.dir) != NULL, "mkdtemp %s", st.dir);
    snprintf(st.file, sizeof(st.file), "%s/watched", st.dir);
    close(open(st.file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    RES_CHECK(sigprocmask(SIG_BLOCK, &usr1, NULL) == 0, "block SIGUSR1"); /* thread too */
    st.fd[SRC_TIMER] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    st.fd[SRC_EVENT] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    st.fd[SRC_SIGNAL] = signalfd(-1, &usr1, SFD_NONBLOCK | SFD_CLOEXEC);
    st.fd[SRC_INOTIFY] = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    st.wd = inotify_add_watch(st.fd[SRC_INOTIFY], st.file, IN_CLOSE_WRITE);
    ep = epoll_create1(EPOLL_CLOEXEC);
    RES_CHECK(ep >= 0 && st.wd >= 0, "epoll_create1 / inotify_add_watch");
    for (int i = 0; i < N_SRC; i++) {
        struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };

        RES_CHECK(st.fd[i] >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, st.fd[i], &ev) == 0,
                  "source %d", i);
    }
    st.efd_p.what = "eventfd total";
    st.sig_p.what = "signalfd count";
    st.file_p.what = "inotify count";
    st.start = res_now_ms();
    RES_CHECK(timerfd_settime(st.fd[SRC_TIMER], 0, &its, NULL) == 0, "timerfd_settime");
    return ep;
}

/* Serve events until done() says so; give up after `idle` empty seconds. */
static void serve(int ep, int (*done)(void), int idle)
{
    struct epoll_event evs[N_SRC];

    while (!done()) {
        int n = epoll_wait(ep, evs, N_SRC, 1000);

        if (n < 0) {
            RES_CHECK(errno == EINTR, "epoll_wait: errno %d", errno);
            continue; /* the shim stopped us for a checkpoint */
        }
        RES_CHECK(n > 0 || --idle > 0, "epoll_wait: no event from any source for long");
        for (int i = 0; i < n; i++)
            handlers[evs[i].data.u32]();
    }
}

static int all_ticks(void)
{
    return st.tick == st.ticks;
}

static int all_in(void)
{
    return st.sig_got == st.sig_sent && st.file_seen == st.file_written
           && st.efd_total == __atomic_load_n(&st.thread_wrote, __ATOMIC_ACQUIRE);
}

int main(int argc, char **argv)
{
    pthread_t thread;
    int ep;

    res_args(argc, argv, &st.ticks, &st.ms);
    ep = setup();
    RES_CHECK(pthread_create(&thread, NULL, helper, NULL) == 0, "pthread_create");
    serve(ep, all_ticks, 3);
    __atomic_store_n(&st.stop, 1, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
    serve(ep, all_in, 3); /* the last signal, inotify event and eventfd writes */
    unlink(st.file);
    rmdir(st.dir);
    printf("done %ld timer %ld eventfd %ld signal %ld inotify %ld\n", st.tick, st.timer_exp,
           st.efd_total, st.sig_got, st.file_seen);
    return 0;
}
