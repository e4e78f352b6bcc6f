/*
 * SIGCHLD and waitpid across checkpoint and restart.
 * usage: res_sigchld TICKS INTERVAL_MS
 *
 * Every tick forks KIDS short-lived children, each told the status to exit
 * with (1 to 127) and to live a few milliseconds, so that some are running
 * and some are zombies when a checkpoint comes; a SIGCHLD handler
 * (SA_NOCLDSTOP) counts.  waitpid collects them, the last forked first.
 * Two more children exit at once with 100 and 200 and stay zombies through
 * every checkpoint and restart, collected only at the end (a status above
 * 127 is one a restored zombie must keep too).
 * Checked (exit 3 otherwise): every child exited normally with the status
 * it was told; no child is left over; the SIGCHLD count never exceeds the
 * children collected (plus a margin for a restore) and is at least half of
 * them (signals may merge).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>

#include "res_common.h"

#define KIDS 3

static volatile sig_atomic_t n_sigchld;

static void on_chld(int sig)
{
    (void)sig;
    n_sigchld++;
}

/* A child that lives `ms` milliseconds, then exits with `status`. */
static pid_t child(int status, long ms)
{
    pid_t pid = fork();

    RES_CHECK(pid >= 0, "fork: errno %d", errno);
    if (pid == 0) {
        res_sleep_ms(ms);
        _exit(status);
    }
    return pid;
}

static int told(long tick, int i)
{
    return (int)((tick * KIDS + i) % 127) + 1;
}

static void collect(pid_t pid, int want, const char *what, long tick)
{
    int status;
    pid_t got;

    while ((got = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    RES_CHECK(got == pid, "waitpid(%d) for %s (tick %ld): %d, errno %d", (int)pid, what, tick,
              (int)got, errno);
    RES_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == want,
              "%s (tick %ld): wait status %#x, told to exit %d", what, tick, status, want);
}

int main(int argc, char **argv)
{
    static const int lingering[2] = { 100, 200 };
    long ticks, ms, tick, reaped = 0;
    struct sigaction sa = { 0 };
    pid_t zombie[2];

    res_args(argc, argv, &ticks, &ms);
    sa.sa_handler = on_chld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    RES_CHECK(sigaction(SIGCHLD, &sa, NULL) == 0, "sigaction");
    for (int z = 0; z < 2; z++)
        zombie[z] = child(lingering[z], 0);
    for (tick = 1; tick <= ticks; tick++) {
        pid_t kids[KIDS];
        long seen;

        for (int i = 0; i < KIDS; i++)
            kids[i] = child(told(tick, i), i);
        for (int i = KIDS - 1; i >= 0; i--, reaped++)
            collect(kids[i], told(tick, i), "a child", tick);
        seen = n_sigchld;
        RES_CHECK(seen <= reaped + 2 + 8 && seen >= reaped / 2,
                  "%ld SIGCHLD for %ld children at tick %ld", seen, reaped, tick);
        printf("tick %ld reaped %ld sigchld %ld\n", tick, reaped, seen);
        res_sleep_ms(ms);
    }
    for (int z = 0; z < 2; z++)
        collect(zombie[z], lingering[z], "a zombie kept since the start", ticks);
    RES_CHECK(waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD, "a child too many");
    printf("done %ld reaped %ld sigchld %ld\n", ticks, reaped + 2, (long)n_sigchld);
    return 0;
}
