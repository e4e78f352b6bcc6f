/*
 * Starts children every way a program can, after clearing its own
 * environment: fork (no exec), vfork + execv, posix_spawn with an empty
 * environment, popen and system (a child left running in the background).
 * usage: spawner TICKS INTERVAL_MS      (as "spawner sleep": a child)
 * The parent prints "tick N"; every child is this program in sleep mode,
 * which exits when its parent (or, for orphans, the tree) goes away.
 */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void pause_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    char self[4096], cmd[4200];
    char *child_argv[] = { "spawner", "sleep", NULL };
    char *empty_env[] = { NULL };
    long ticks, ms;
    ssize_t n;
    pid_t pid;
    FILE *p;

    if (argc > 1 && strcmp(argv[1], "sleep") == 0) {
        for (;;)
            pause_ms(100);
    }
    ticks = argc > 1 ? atol(argv[1]) : 100;
    ms = argc > 2 ? atol(argv[2]) : 20;
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 2;
    self[n] = '\0';
    setvbuf(stdout, NULL, _IOLBF, 0);
    clearenv(); /* whatever the tool put there is gone */

    if ((pid = fork()) == 0) {
        for (;;)
            pause_ms(100);
    }
    if ((pid = vfork()) == 0) {
        execv(self, child_argv);
        _exit(127);
    }
    if (posix_spawn(&pid, self, NULL, NULL, child_argv, empty_env) != 0)
        return 2;
    snprintf(cmd, sizeof(cmd), "exec '%s' sleep", self);
    if ((p = popen(cmd, "r")) == NULL)
        return 2;
    snprintf(cmd, sizeof(cmd), "'%s' sleep >/dev/null 2>&1 &", self);
    if (system(cmd) != 0)
        return 2;
    for (long i = 1; i <= ticks; i++) {
        pause_ms(ms);
        printf("tick %ld\n", i);
    }
    printf("done %ld\n", ticks);
    fflush(stdout);
    _exit(0); /* the children are killed with the tree */
}
