/*
 * DMTCP's public API (include/dmtcp.h) for the program, and what the
 * checkpoint thread tells it: the generation and restarts, from the
 * agent's RESUME record; the hooks; the critical-section count.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../include/dmtcp.h"
#include "shim.h"

/* how long dmtcp_checkpoint() waits for the images to be published */
#define DONE_WAIT_MS (10 * 60 * 1000L)

static int enabled;
static char ckpt_dir[4096];
static atomic_int generation, checkpoints, restarts, disabled;
static atomic_int done_gen, failed_gen; /* last generations the agent said complete, failed */
static DmtcpFunctionPointer hook_pre, hook_post, hook_restart;

/* what makes the process a checkpoint thread (ckpt_thread.c, which
 * drives this unit: passed, not called by name) */
static void (*wants_thread)(void);

static void thread_wanted(void)
{
    if (wants_thread)
        wants_thread();
}

void api_init(void (*start_thread)(void))
{
    const char *dir = getenv("DMTCP_CHECKPOINT_DIR");

    wants_thread = start_thread;
    enabled = 1;
    if (dir) /* (not strncpy: its padding would write all 4 KiB, at every program's start) */
        memcpy(ckpt_dir, dir, strnlen(dir, sizeof(ckpt_dir) - 1));
}

/* checkpoint thread, on SUSPEND: before the threads stop */
void api_before_checkpoint(void)
{
    /* a critical section in progress: wait for its end (bounded by the
     * agent's patience, which fails the checkpoint rather than wait) */
    for (int waited = 0; atomic_load(&disabled) > 0 && waited < 60000; waited++)
        pause_ms(1);
    if (hook_pre)
        hook_pre();
}

/* checkpoint thread, on RESUME: arg from the agent; the threads run again */
void api_after_resume(uint64_t arg)
{
    int restored = (arg & DMTCP_RESUME_RESTORED) != 0;

    /* the counters come last: a dmtcp_checkpoint() waiting on them
     * returns after the hooks ran */
    if (restored) {
        /* a restart comes from published images; after a checkpoint the
         * generation counts once its images are published (DONE) */
        atomic_store(&generation, (int)(arg & 0xFFFFFFFFu));
        atomic_store(&done_gen, (int)(arg & 0xFFFFFFFFu));
        if (hook_restart)
            hook_restart();
        atomic_fetch_add(&restarts, 1);
    } else {
        if (hook_post)
            hook_post();
        atomic_fetch_add(&checkpoints, 1);
    }
}

/* checkpoint thread, on DONE */
void api_generation_done(uint64_t arg)
{
    int gen = (int)(arg & 0xFFFFFFFFu);

    if (arg & DMTCP_DONE_FAILED) {
        atomic_store(&failed_gen, gen);
    } else {
        atomic_store(&generation, gen);
        atomic_store(&done_gen, gen);
    }
}

SHIM_EXPORT int dmtcp_is_enabled(void)
{
    return enabled;
}

SHIM_EXPORT int dmtcp_get_generation(void)
{
    return atomic_load(&generation);
}

SHIM_EXPORT const char *dmtcp_get_ckpt_dir(void)
{
    return ckpt_dir;
}

SHIM_EXPORT int dmtcp_get_local_status(int *num_checkpoints, int *num_restarts)
{
    if (num_checkpoints)
        *num_checkpoints = atomic_load(&checkpoints);
    if (num_restarts)
        *num_restarts = atomic_load(&restarts);
    return enabled ? 0 : -1;
}

/* A program that uses the API gets a checkpoint thread (its hooks and
 * critical sections must not be waited for inside a signal handler). */
SHIM_EXPORT int dmtcp_disable_ckpt(void)
{
    thread_wanted();
    atomic_fetch_add(&disabled, 1);
    return 0;
}

SHIM_EXPORT int dmtcp_enable_ckpt(void)
{
    if (atomic_fetch_sub(&disabled, 1) <= 0)
        atomic_fetch_add(&disabled, 1); /* unmatched: stay at 0 */
    return 0;
}

SHIM_EXPORT int dmtcp_install_hooks(DmtcpFunctionPointer pre, DmtcpFunctionPointer post,
                                    DmtcpFunctionPointer restart)
{
    thread_wanted();
    hook_pre = pre;
    hook_post = post;
    hook_restart = restart;
    return 0;
}

SHIM_EXPORT int dmtcp_checkpoint(void)
{
    struct dmtcp_record rec;
    int before_ckpt = atomic_load(&checkpoints), before_restart = atomic_load(&restarts);
    int before_done = atomic_load(&done_gen), before_failed = atomic_load(&failed_gen);
    int fd;

    if (!enabled)
        return DMTCP_NOT_PRESENT;
    thread_wanted();
    /* a short connection of its own: the agent answers, then sees it
     * closed, and only then asks the coordinator, so that it never leads
     * outside the tree during the dump */
    fd = channel_connect();
    if (fd < 0)
        return -1;
    if (channel_send(fd, DMTCP_REC_CKPT_REQUEST, 0) < 0 || channel_recv(fd, &rec) <= 0
        || rec.type != DMTCP_REC_CKPT_REQUESTED) {
        channel_close(fd);
        return -1;
    }
    channel_close(fd);
    if (rec.arg != 0)
        return -1;
    /* the checkpoint stops and releases this thread too; wait for the
     * RESUME that ends it (a restored copy wakes up here, restarted) */
    while (atomic_load(&checkpoints) == before_ckpt && atomic_load(&restarts) == before_restart)
        pause_ms(5);
    if (atomic_load(&restarts) != before_restart)
        return DMTCP_AFTER_RESTART;
    /* then until every image of the generation is published, or it failed */
    for (long waited = 0; waited < DONE_WAIT_MS; waited += 5) {
        if (atomic_load(&failed_gen) != before_failed)
            return -1;
        if (atomic_load(&done_gen) != before_done)
            return DMTCP_AFTER_CHECKPOINT;
        pause_ms(5);
    }
    return -1;
}
