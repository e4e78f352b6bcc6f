/* Internal interfaces between the shim's source files. */
#ifndef DMTCP_SHIM_H
#define DMTCP_SHIM_H

#include "dmtcp_record.h"

/*
 * The shim's own fds live at the top of the fd table, below the soft
 * RLIMIT_NOFILE, so that they do not take the numbers a program expects
 * from open() and friends.
 */
#define DMTCP_FD_HEADROOM 8

/* channel.c: the link to the agent, raw system calls only. */
int channel_set_address(const char *env_value);
int channel_connect(void);
int channel_send(int fd, uint16_t type, uint64_t arg);
int channel_recv(int fd, struct dmtcp_record *rec);
void channel_close(int fd);

/* ckpt_thread.c */
void ckpt_thread_start(void);

#endif
