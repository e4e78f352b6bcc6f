/*
 * fork + exec in a tight loop.  usage: forkexec_loop ROUNDS
 * Each round forks a child that execs this program again ("child N"),
 * which exits with N % 100; the parent checks that status and prints
 * "tick N HASH" every 10 rounds (HASH: a chain kept in memory, checked
 * against its own recomputation).  A wrong status or chain: exit 3.  At
 * the end "done N HASH".  A checkpoint almost always lands while a child
 * is being forked, or is exec'ing.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t step(uint64_t h, uint64_t n) { return h * 6364136223846793005ull + n; }

int main(int argc, char **argv)
{
    char self[4096];
    ssize_t len;
    long rounds;
    uint64_t h = 1, again = 1;

    if (argc > 2 && strcmp(argv[1], "child") == 0)
        return (int)(atol(argv[2]) % 100);
    rounds = argc > 1 ? atol(argv[1]) : 1000;
    len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len < 0)
        return 2;
    self[len] = '\0';
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (long n = 1; n <= rounds; n++) {
        char arg[32];
        int status;
        pid_t pid;

        snprintf(arg, sizeof(arg), "%ld", n);
        pid = fork();
        if (pid < 0)
            return 2;
        if (pid == 0) {
            execl(self, self, "child", arg, (char *)NULL);
            _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
            ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != n % 100) {
            fprintf(stderr, "round %ld: child status %#x\n", n, status);
            return 3;
        }
        h = step(h, (uint64_t)n);
        again = step(again, (uint64_t)n);
        if (h != again)
            return 3;
        if (n % 10 == 0)
            printf("tick %ld %" PRIx64 "\n", n, h);
    }
    printf("done %ld %" PRIx64 "\n", rounds, h);
    return 0;
}
