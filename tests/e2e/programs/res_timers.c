/*
 * Timers across checkpoint and restart.  usage: res_timers TICKS INTERVAL_MS
 *
 * The main process ticks with nanosleep while two timers run at the tick
 * interval: ITIMER_REAL (setitimer, SIGALRM) and a POSIX timer
 * (timer_create, SIGEV_SIGNAL with SIGUSR1, overruns counted).  alarm()
 * shares ITIMER_REAL with setitimer, so a forked child uses it: alarm(1)
 * again and again, reporting each alarm through a pipe.
 *
 * Checked every tick (exit 3 otherwise): every handler count never goes
 * back and keeps moving; each is at most what the monotonic time since the
 * start allows and at least a quarter (SIGALRM) or half (POSIX timer,
 * overruns included) of what the ticks already slept imply; both timers
 * still have their interval; POSIX timer signals carry the timer's value;
 * the child's alarms arrive numbered 1, 2, 3, ...
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "res_common.h"

#define TIMER_MAGIC 0x7153

static volatile sig_atomic_t n_alrm, n_posix, bad_posix;

static void on_alrm(int sig)
{
    (void)sig;
    n_alrm++;
}

static void on_posix(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)ctx;
    if (info->si_code != SI_TIMER || info->si_value.sival_int != TIMER_MAGIC)
        bad_posix++;
    else
        n_posix += 1 + info->si_overrun;
}

static void handle(int sig, void (*fn)(int), void (*act)(int, siginfo_t *, void *))
{
    struct sigaction sa = { 0 };

    if (act) {
        sa.sa_sigaction = act;
        sa.sa_flags = SA_SIGINFO;
    } else {
        sa.sa_handler = fn;
    }
    sa.sa_flags |= SA_RESTART;
    sigemptyset(&sa.sa_mask);
    RES_CHECK(sigaction(sig, &sa, NULL) == 0, "sigaction %d", sig);
}

/* The child: alarm(1) forever, each alarm reported as its number. */
static void alarm_child(int out)
{
    int count = 0;
    sigset_t alrm, others;

    handle(SIGALRM, on_alrm, NULL);
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_BLOCK, &alrm, &others); /* SIGALRM only inside sigsuspend */
    for (;;) {
        long seen = n_alrm;

        RES_CHECK(alarm(1) == 0, "an alarm was still pending after alarm %d", count);
        while (n_alrm == seen)
            sigsuspend(&others); /* any signal, the shim's included, ends it */
        count++;
        if (res_write_full(out, &count, sizeof(count)) < 0)
            _exit(0); /* the parent is gone */
    }
}

static int read_alarms(int in, int alarms)
{
    int v;

    while (read(in, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
        RES_CHECK(v == alarms + 1, "alarm %d reported after alarm %d", v, alarms);
        alarms = v;
    }
    return alarms;
}

static void check_interval(long tick, struct timeval itv, struct timespec pts, long ms)
{
    RES_CHECK(itv.tv_sec * 1000L + itv.tv_usec / 1000 == ms,
              "ITIMER_REAL interval is %ld.%06ld s at tick %ld", (long)itv.tv_sec,
              (long)itv.tv_usec, tick);
    RES_CHECK(pts.tv_sec * 1000L + pts.tv_nsec / 1000000 == ms,
              "POSIX timer interval is %ld.%09ld s at tick %ld", (long)pts.tv_sec,
              pts.tv_nsec, tick);
}

int main(int argc, char **argv)
{
    long ticks, ms, start, tick, patience;
    struct res_progress alrm_p = { "SIGALRM count", 0, 0 };
    struct res_progress posix_p = { "POSIX timer count", 0, 0 };
    struct res_progress alarm_p = { "alarm() count", 0, 0 };
    struct sigevent sev = { 0 };
    struct itimerval itv;
    struct itimerspec its;
    timer_t timer;
    int report[2], alarms = 0, status;
    pid_t child;

    res_args(argc, argv, &ticks, &ms);
    RES_CHECK(pipe(report) == 0, "pipe");
    child = fork();
    RES_CHECK(child >= 0, "fork");
    if (child == 0) {
        close(report[0]);
        alarm_child(report[1]);
    }
    close(report[1]);
    RES_CHECK(fcntl(report[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");

    start = res_now_ms();
    handle(SIGALRM, on_alrm, NULL);
    handle(SIGUSR1, NULL, on_posix);
    itv.it_interval.tv_sec = ms / 1000;
    itv.it_interval.tv_usec = (ms % 1000) * 1000;
    itv.it_value = itv.it_interval;
    RES_CHECK(setitimer(ITIMER_REAL, &itv, NULL) == 0, "setitimer");
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGUSR1;
    sev.sigev_value.sival_int = TIMER_MAGIC;
    RES_CHECK(timer_create(CLOCK_MONOTONIC, &sev, &timer) == 0, "timer_create");
    its.it_interval.tv_sec = ms / 1000;
    its.it_interval.tv_nsec = (ms % 1000) * 1000000L;
    its.it_value = its.it_interval;
    RES_CHECK(timer_settime(timer, 0, &its, NULL) == 0, "timer_settime");

    patience = 50 + 2500 / ms; /* ticks; the alarm comes once a second */
    for (tick = 1; tick <= ticks; tick++) {
        long elapsed, slept, alrm, posix;

        res_sleep_ms(ms);
        alrm = n_alrm;
        posix = n_posix;
        alarms = read_alarms(report[0], alarms);
        elapsed = res_now_ms() - start;
        slept = tick * ms;
        RES_CHECK(bad_posix == 0, "%d POSIX timer signals without the timer's value",
                  (int)bad_posix);
        res_progress(&alrm_p, alrm, tick, patience);
        res_progress(&posix_p, posix, tick, patience);
        res_progress(&alarm_p, alarms, tick, patience);
        RES_CHECK(alrm <= elapsed / ms + 5 && posix <= elapsed / ms + 5
                      && alarms <= elapsed / 1000 + 2,
                  "more timer signals than time: %ld %ld %d in %ld ms", alrm, posix, alarms,
                  elapsed);
        RES_CHECK(alrm >= slept / ms / 4 - 3 && posix >= slept / ms / 2 - 3,
                  "too few timer signals: %ld %ld after %ld ticks", alrm, posix, tick);
        RES_CHECK(getitimer(ITIMER_REAL, &itv) == 0 && timer_gettime(timer, &its) == 0,
                  "getitimer/timer_gettime");
        check_interval(tick, itv.it_interval, its.it_interval, ms);
        printf("tick %ld alrm %ld posix %ld alarm %d\n", tick, alrm, posix, alarms);
    }
    ticks = tick - 1;

    /* the child's alarm works: at least two, waiting a little if need be */
    for (int i = 0; alarms < 2 && i < 3000 / ms; i++) {
        res_sleep_ms(ms);
        alarms = read_alarms(report[0], alarms);
    }
    RES_CHECK(alarms >= 2, "only %d alarms from the child", alarms);
    kill(child, SIGTERM);
    while (waitpid(child, &status, 0) < 0)
        RES_CHECK(errno == EINTR, "waitpid alarm child");
    RES_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM,
              "alarm child ended with status %#x", status);
    printf("done %ld alrm %ld posix %ld alarm %d\n", ticks, (long)n_alrm, (long)n_posix, alarms);
    return 0;
}
