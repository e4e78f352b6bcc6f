/*
 * FD_LEADER_ELECTION, DMTCP's trick: every process sharing an open file
 * description calls F_SETOWN with its own pid; after the barrier, the one
 * whose pid F_GETOWN returns is that description's leader.  One table for
 * every kind that needs a leader: the sockets (found here) and the inotify
 * instances a process reads (inotify.c claims them).  The owners the
 * program had set are saved at suspension and put back at resume.
 * Raw system calls and static memory only.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define MAX_CLAIMED 16448 /* sockets, and inotify.c's INQ_MAX instances */

static int claimed_fd[MAX_CLAIMED];
static int claimed_owner[MAX_CLAIMED];
static int n_claimed;

int fdowner_claim(int fd)
{
    if (fd == channel_agent_fd() || n_claimed >= MAX_CLAIMED)
        return -1;
    claimed_fd[n_claimed] = fd;
    claimed_owner[n_claimed] = (int)syscall(SYS_fcntl, fd, F_GETOWN);
    n_claimed++;
    return 0;
}

static void claim_socket(int fd, void *unused)
{
    struct stat st;

    (void)unused;
    if (syscall(SYS_fstat, fd, &st) == 0 && S_ISSOCK(st.st_mode))
        fdowner_claim(fd);
}

void fdowner_save(void)
{
    n_claimed = 0;
    procdir_each("/proc/self/fd", claim_socket, NULL);
}

void fdowner_elect(void)
{
    int pid = (int)syscall(SYS_getpid);

    for (int i = 0; i < n_claimed; i++)
        syscall(SYS_fcntl, claimed_fd[i], F_SETOWN, pid);
}

int fdowner_leads(int fd)
{
    return (int)syscall(SYS_fcntl, fd, F_GETOWN) == (int)syscall(SYS_getpid);
}

void fdowner_restore(void)
{
    for (int i = 0; i < n_claimed; i++)
        syscall(SYS_fcntl, claimed_fd[i], F_SETOWN, claimed_owner[i]);
    n_claimed = 0;
}
