/* A program that uses DMTCP's API (hijack/include/dmtcp.h) and checks what
 * it is told.  usage: api_user TICKS INTERVAL_MS
 * Prints "tick N" lines; at tick 5 it checkpoints itself with
 * dmtcp_checkpoint() and prints "returned R gen G ckpts C restarts S hooks
 * PRE POST RESTART": R is 1 in the run that asked, 2 in a copy restarted
 * from that checkpoint.  Any broken expectation: "FAIL ..." and exit 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dmtcp.h"

static volatile int pre_n, post_n, restart_n;

static void on_pre(void) { pre_n++; }
static void on_post(void) { post_n++; }
static void on_restart(void) { restart_n++; }

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL %s\n", what);
        exit(3);
    }
}

int main(int argc, char **argv)
{
    int ticks = argc > 1 ? atoi(argv[1]) : 100, ms = argc > 2 ? atoi(argv[2]) : 10;
    struct timespec pause = { ms / 1000, (ms % 1000) * 1000000L };

    setvbuf(stdout, NULL, _IOLBF, 0);
    check(DMTCP_IS_PRESENT(), "dmtcp_is_enabled under dmtcp-launch");
    check(dmtcp_get_ckpt_dir() && dmtcp_get_ckpt_dir()[0] == '/', "a checkpoint directory");
    check(dmtcp_get_generation() == 0, "generation 0 before any checkpoint");
    dmtcp_install_hooks(on_pre, on_post, on_restart);
    for (int i = 1; i <= ticks; i++) {
        printf("tick %d\n", i);
        if (i == 5) {
            int r = dmtcp_checkpoint(), ckpts, restarts;

            dmtcp_get_local_status(&ckpts, &restarts);
            printf("returned %d gen %d ckpts %d restarts %d hooks %d %d %d\n", r,
                   dmtcp_get_generation(), ckpts, restarts, pre_n, post_n, restart_n);
            check(dmtcp_get_generation() == 1, "generation 1 after the checkpoint");
            check(pre_n == 1, "the pre-checkpoint hook ran once");
            if (r == DMTCP_AFTER_CHECKPOINT) {
                check(post_n == 1 && restart_n == 0, "post-checkpoint hook, no restart hook");
                check(ckpts == 1 && restarts == 0, "local status after a checkpoint");
            } else {
                check(r == DMTCP_AFTER_RESTART, "dmtcp_checkpoint returns 1 or 2");
                check(post_n == 0 && restart_n == 1, "restart hook, no post-checkpoint hook");
                check(ckpts == 0 && restarts == 1, "local status after a restart");
            }
        }
        nanosleep(&pause, NULL);
    }
    printf("done\n");
    return 0;
}
