/*
 * dmtcp.h: what a program may ask of the checkpointer, as in DMTCP.
 *
 * The functions live in libdmtcphijack.so, which dmtcp-launch preloads.
 * They are declared weak: a program built with this header also runs
 * without dmtcp, and DMTCP_IS_PRESENT() tells which case it is in.
 *
 *   if (DMTCP_IS_PRESENT()) {
 *       int r = dmtcp_checkpoint();   // blocks until the checkpoint is done
 *       if (r == DMTCP_AFTER_RESTART) ...   // we are a restarted copy
 *   }
 *
 * Hooks run on the shim's checkpoint thread while the program's other
 * threads run: pre-checkpoint just before they are stopped, post-checkpoint
 * and post-restart just after they are released.  A hook that does not
 * return holds the checkpoint up (the agent gives up after 10 s).
 */
#ifndef DMTCP_H
#define DMTCP_H

#ifdef __cplusplus
extern "C" {
#endif

#define DMTCP_NOT_PRESENT 0       /* not running under dmtcp */
#define DMTCP_AFTER_CHECKPOINT 1  /* the checkpoint is done; we go on */
#define DMTCP_AFTER_RESTART 2     /* we were restarted from that checkpoint */

typedef void (*DmtcpFunctionPointer)(void);

/* 1 when running under dmtcp-launch or dmtcp-restart, else 0 */
int dmtcp_is_enabled(void) __attribute__((weak));
/* Ask for a checkpoint of the whole computation and wait until every image
 * of it is published: DMTCP_AFTER_CHECKPOINT; DMTCP_AFTER_RESTART in a copy
 * restarted from it; -1 if it could not be asked for or failed */
int dmtcp_checkpoint(void) __attribute__((weak));
/* The generation of the last complete checkpoint this process took part in,
 * or restarted from (0: none) */
int dmtcp_get_generation(void) __attribute__((weak));
/* Where the images of this process's tree go */
const char *dmtcp_get_ckpt_dir(void) __attribute__((weak));
/* Checkpoints and restarts this process has seen (restarts count across
 * restarts: a restarted copy remembers its ancestors') */
int dmtcp_get_local_status(int *num_checkpoints, int *num_restarts) __attribute__((weak));
/* A critical section: a checkpoint waits until every disable is matched by
 * an enable (calls nest) */
int dmtcp_disable_ckpt(void) __attribute__((weak));
int dmtcp_enable_ckpt(void) __attribute__((weak));
/* Functions to call before a checkpoint, after it, and after a restart
 * (NULL: none); a later call replaces the earlier hooks */
int dmtcp_install_hooks(DmtcpFunctionPointer pre_checkpoint, DmtcpFunctionPointer post_checkpoint,
                        DmtcpFunctionPointer post_restart) __attribute__((weak));

#define DMTCP_IS_PRESENT() (dmtcp_is_enabled != 0 && dmtcp_is_enabled())

#ifdef __cplusplus
}
#endif

#endif
