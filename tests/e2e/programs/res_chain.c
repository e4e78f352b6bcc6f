/*
 * A ring of three processes joined by pipes, across checkpoint and restart.
 * usage: res_chain TICKS INTERVAL_MS
 *
 * The parent sends N to its child, the child sends 2N to the grandchild,
 * the grandchild sends 2N+1 back to the parent.  Every process keeps its
 * own count of what it has seen and checks each value against it (exit 3
 * otherwise); the parent prints "tick N".  At the end the parent sends an
 * END marker round the ring: each process must have seen exactly TICKS
 * values before it; then the parent closes its pipe, the child reaps the
 * grandchild and the parent the child, both exits must be 0.
 */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "res_common.h"

#define END (-1L) /* sent after the last value; end of file alone means killed */

/* Relay values from `in` to `out` until END, which is passed on too; the
 * k-th value must be k * mult, and goes on as 2k + add.  Returns how many
 * values came before END; leaves quietly (status 4) if `in` just ends: the
 * process before it in the ring is gone, as when the tree is killed. */
static long relay(int in, int out, long mult, long add, const char *who)
{
    long v, k = 0;

    for (;;) {
        if (res_read_full(in, &v, sizeof(v)) < 0)
            _exit(4);
        if (v != END) {
            k++;
            RES_CHECK(v == k * mult, "%s got %ld as value %ld", who, v, k);
            v = 2 * k + add;
        }
        RES_CHECK(res_write_full(out, &v, sizeof(v)) == 0, "%s cannot pass %ld on", who, v);
        if (v == END)
            return k;
    }
}

static void reap(pid_t pid, const char *who)
{
    int status;

    while (waitpid(pid, &status, 0) < 0)
        RES_CHECK(errno == EINTR, "waitpid %s", who);
    RES_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s ended with status %#x", who,
              status);
}

/* The child: reads from the parent, feeds the grandchild it forks, which
 * answers the parent on `back`. */
static void child(int from_parent, int back, long ticks)
{
    int mid[2];
    pid_t grandchild;
    long n;

    RES_CHECK(pipe(mid) == 0, "pipe");
    grandchild = fork();
    RES_CHECK(grandchild >= 0, "fork grandchild");
    if (grandchild == 0) {
        close(mid[1]);
        close(from_parent);
        n = relay(mid[0], back, 2, 1, "grandchild");
        RES_CHECK(n == ticks, "grandchild saw %ld values, not %ld", n, ticks);
        _exit(0);
    }
    close(mid[0]);
    close(back);
    n = relay(from_parent, mid[1], 1, 0, "child");
    RES_CHECK(n == ticks, "child saw %ld values, not %ld", n, ticks);
    close(mid[1]);
    reap(grandchild, "grandchild");
    _exit(0);
}

int main(int argc, char **argv)
{
    long ticks, ms, tick, end = END;
    int down[2], up[2];
    char extra;
    pid_t kid;

    res_args(argc, argv, &ticks, &ms);
    RES_CHECK(pipe(down) == 0 && pipe(up) == 0, "pipe");
    kid = fork();
    RES_CHECK(kid >= 0, "fork child");
    if (kid == 0) {
        close(down[1]);
        close(up[0]);
        child(down[0], up[1], ticks);
    }
    close(down[0]);
    close(up[1]);
    for (tick = 1; tick <= ticks; tick++) {
        long answer;

        RES_CHECK(res_write_full(down[1], &tick, sizeof(tick)) == 0, "send %ld", tick);
        RES_CHECK(res_read_full(up[0], &answer, sizeof(answer)) == 0,
                  "no answer to %ld: the ring is broken", tick);
        RES_CHECK(answer == 2 * tick + 1, "ring answered %ld to %ld", answer, tick);
        printf("tick %ld ring %ld\n", tick, answer);
        res_sleep_ms(ms);
    }
    RES_CHECK(res_write_full(down[1], &end, sizeof(end)) == 0
                  && res_read_full(up[0], &end, sizeof(end)) == 0 && end == END,
              "END did not come round the ring");
    close(down[1]);
    RES_CHECK(read(up[0], &extra, 1) == 0, "the ring sent more than it was given");
    reap(kid, "child");
    printf("done %ld\n", ticks);
    return 0;
}
