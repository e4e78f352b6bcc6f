/*
 * FD_LEADER_ELECTION, DMTCP's trick: every process sharing a socket's open
 * file description calls F_SETOWN with its own pid; after the barrier, the
 * one whose pid F_GETOWN returns is that description's leader.  The owners
 * the program had set are saved at suspension and put back at resume.
 * Raw system calls and static memory only.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define MAX_SOCKETS 16384

static int sock_fd[MAX_SOCKETS];
static int sock_owner[MAX_SOCKETS];
static int n_sockets;

static void save_one(int fd, void *unused)
{
    struct stat st;

    (void)unused;
    if (fd == channel_agent_fd() || n_sockets >= MAX_SOCKETS)
        return;
    if (syscall(SYS_fstat, fd, &st) != 0 || !S_ISSOCK(st.st_mode))
        return;
    sock_fd[n_sockets] = fd;
    sock_owner[n_sockets] = (int)syscall(SYS_fcntl, fd, F_GETOWN);
    n_sockets++;
}

void fdowner_save(void)
{
    n_sockets = 0;
    procdir_each("/proc/self/fd", save_one, NULL);
}

void fdowner_elect(void)
{
    int pid = (int)syscall(SYS_getpid);

    for (int i = 0; i < n_sockets; i++)
        syscall(SYS_fcntl, sock_fd[i], F_SETOWN, pid);
}

void fdowner_restore(void)
{
    for (int i = 0; i < n_sockets; i++)
        syscall(SYS_fcntl, sock_fd[i], F_SETOWN, sock_owner[i]);
    n_sockets = 0;
}
