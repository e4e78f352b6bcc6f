/*
 * A program that closes every fd it does not know, as daemons do, in every
 * way there is: close() on each number, close_range(), closefrom(), and
 * dup2() of /dev/null over a whole range.  The shim's link to its agent
 * must survive all of it, or the next checkpoint would miss this process.
 * Its own fds must really close (a pipe it opened is checked).
 *
 *   res_closeall TICKS INTERVAL_MS
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string.h>

#include "res_common.h"

static long limit(void)
{
    struct rlimit rl;

    getrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 65536 ? 65536 : (long)rl.rlim_cur;
}

int main(int argc, char **argv)
{
    long ticks, ms;

    res_args(argc, argv, &ticks, &ms);
    for (long t = 1; t <= ticks; t++) {
        int p[2];

        res_sleep_ms(ms);
        RES_CHECK(pipe(p) == 0, "pipe: %s", strerror(errno));
        switch (t % 4) {
        case 0:
            for (long fd = 3; fd < limit(); fd++)
                close((int)fd);
            break;
        case 1:
            RES_CHECK(close_range(3, ~0U, 0) == 0, "close_range: %s", strerror(errno));
            break;
        case 2:
            closefrom(3);
            break;
        case 3: {
            int null = open("/dev/null", O_RDWR);
            /* not up to the limit: a process with no fd left cannot reach
             * its agent again after a dump (a known limit) */
            for (long fd = 3; fd < limit() - 64; fd++)
                if (fd != null)
                    dup2(null, (int)fd);
            close_range(3, ~0U, 0);
            break;
        }
        }
        RES_CHECK(fcntl(p[0], F_GETFD) < 0 && fcntl(p[1], F_GETFD) < 0,
                  "fds %d and %d are still open after closing everything (way %ld)",
                  p[0], p[1], t % 4);
        printf("tick %ld\n", t);
    }
    printf("done %ld\n", ticks);
    return 0;
}
