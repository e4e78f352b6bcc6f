/*
 * fork+exec and popen across checkpoint and restart.
 * usage: res_exec TICKS INTERVAL_MS
 *
 * Every tick: popen("echo N") (a /bin/sh -c 'echo N' child) and read its
 * answer; then fork + execv of /bin/true (odd ticks) or /bin/false (even
 * ticks) and waitpid.  Checked (exit 3 otherwise): popen's answer is
 * exactly "N\n" and pclose reports exit 0; the exec'd child exits 0 or 1 as
 * the program it ran must; waitpid returns that child.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/wait.h>

#include "res_common.h"

static void check_popen(long tick)
{
    char cmd[64], want[64], got[64] = "";
    FILE *p;
    int status;

    snprintf(cmd, sizeof(cmd), "echo %ld", tick);
    snprintf(want, sizeof(want), "%ld\n", tick);
    p = popen(cmd, "r");
    RES_CHECK(p != NULL, "popen at tick %ld: errno %d", tick, errno);
    while (fgets(got, sizeof(got), p) == NULL && ferror(p) && errno == EINTR)
        clearerr(p);
    status = pclose(p);
    RES_CHECK(strcmp(got, want) == 0, "sh -c 'echo %ld' answered \"%s\"", tick, got);
    RES_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "pclose at tick %ld: status %#x", tick, status);
}

static void check_exec(long tick)
{
    char *path = tick % 2 ? "/bin/true" : "/bin/false";
    char *args[] = { path, NULL };
    int status, want = tick % 2 ? 0 : 1;
    pid_t child = fork(), got;

    RES_CHECK(child >= 0, "fork at tick %ld", tick);
    if (child == 0) {
        execv(path, args);
        _exit(127);
    }
    while ((got = waitpid(child, &status, 0)) < 0 && errno == EINTR)
        ;
    RES_CHECK(got == child, "waitpid(%d) returned %d at tick %ld", (int)child, (int)got, tick);
    RES_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == want,
              "%s at tick %ld: status %#x, want exit %d", path, tick, status, want);
}

int main(int argc, char **argv)
{
    long ticks, ms, tick;

    res_args(argc, argv, &ticks, &ms);
    for (tick = 1; tick <= ticks; tick++) {
        check_popen(tick);
        check_exec(tick);
        printf("tick %ld echo and %s ok\n", tick, tick % 2 ? "true" : "false");
        res_sleep_ms(ms);
    }
    printf("done %ld\n", ticks);
    return 0;
}
