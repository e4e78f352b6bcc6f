/*
 * The agent link.  Everything here is a raw system call on memory that is
 * static: the checkpoint thread may run while other threads hold malloc's
 * or stdio's locks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent_addr.h"
#include "shim.h"

/* DMTCP_AGENT_SOCK as the program was started with it; the address is
 * made of it at each connect (agent_addr.h) */
static char agent_env[sizeof(((struct sockaddr_un *)0)->sun_path) + 1] SHIM_HOT_DATA;
/* This process's connection, -1 when none.  Kept here, with the link, so
 * that the units that must not touch it (fdowner.c, wrap_fd.c) ask the
 * link, not the checkpoint thread that makes and drops it. */
static int agent_fd = -1;

int channel_agent_fd(void)
{
    return agent_fd;
}

void channel_set_agent_fd(int fd)
{
    agent_fd = fd;
}

/* Checked without the PID namespace's number, which the address gets at
 * each connect: reading /proc/self/ns/pid at every program's start cost
 * a fork+exec loop more than the rest of the start-up.  Room is left for
 * the longest number. */
int channel_set_address(const char *env_value)
{
    size_t n;

    if (env_value == NULL || env_value[0] == '\0')
        return -1;
    n = strlen(env_value);
    if (n >= sizeof(agent_env) || n + 1 + 20 + 1 >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return -1;
    memcpy(agent_env, env_value, n + 1);
    return 0;
}

/* Move fd to the top of the table, close-on-exec. */
static int protect_fd(int fd)
{
    struct rlimit rl;
    long base = 1024 - DMTCP_FD_HEADROOM;
    int high;

    if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl) == 0
        && rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur > DMTCP_FD_HEADROOM
        && (long)rl.rlim_cur < base + DMTCP_FD_HEADROOM)
        base = (long)rl.rlim_cur - DMTCP_FD_HEADROOM;
    high = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, base);
    if (high < 0)
        return fd; /* keep the low fd rather than fail */
    syscall(SYS_close, fd);
    return high;
}

/* A socket for the agent link, already at the top of the fd table. */
int channel_socket(void)
{
    int fd = (int)syscall(SYS_socket, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    return fd < 0 ? -1 : protect_fd(fd);
}

/* Connect fd (from channel_socket) to the agent; fd, or -1 with fd closed. */
int channel_connect_fd(int fd)
{
    struct sockaddr_un addr;
    socklen_t len;

    if (fd < 0)
        return -1;
    if (dmtcp_agent_addr(agent_env, &addr, &len) < 0
        || syscall(SYS_connect, fd, &addr, len) < 0) {
        syscall(SYS_close, fd);
        return -1;
    }
    return fd;
}

int channel_connect(void)
{
    return channel_connect_fd(channel_socket());
}

/* Connect to the agent's address for a round's early release
 * (dmtcp_agent_release_addr); the fd, or -1 when nobody listens there. */
int channel_connect_release(uint32_t token)
{
    struct sockaddr_un addr;
    socklen_t len;
    int fd;

    if (dmtcp_agent_release_addr(agent_env, token, &addr, &len) < 0)
        return -1;
    fd = channel_socket();
    if (fd >= 0 && syscall(SYS_connect, fd, &addr, len) < 0) {
        syscall(SYS_close, fd);
        fd = -1;
    }
    return fd;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        long n = syscall(SYS_sendto, fd, p, len, MSG_NOSIGNAL, NULL, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void record_init(struct dmtcp_record *rec, uint16_t type, uint64_t arg)
{
    memset(rec, 0, sizeof(*rec));
    rec->magic = DMTCP_RECORD_MAGIC;
    rec->version = DMTCP_RECORD_VERSION;
    rec->type = type;
    rec->pid = (int32_t)syscall(SYS_getpid);
    rec->ppid = (int32_t)syscall(SYS_getppid);
    rec->arg = arg;
}

int channel_send(int fd, uint16_t type, uint64_t arg)
{
    struct dmtcp_record rec;

    record_init(&rec, type, arg);
    return write_all(fd, &rec, sizeof(rec));
}

/*
 * 1 on a record, 0 on end of stream, -1 on error or a foreign record.
 * recvmsg, never read: a socket the agent passes with a record rides on
 * that record's bytes, and read() would silently drop it.  *passed gets
 * that socket (close-on-exec), or -1; NULL: none is expected, and one that
 * comes anyway is closed.
 */
int channel_recv_fd(int fd, struct dmtcp_record *rec, int *passed)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    char *p = (char *)rec;
    size_t got = 0;
    int received = -1;

    while (got < sizeof(*rec)) {
        struct iovec iov = { p + got, sizeof(*rec) - got };
        struct msghdr msg = { 0 };
        long n;

        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        n = syscall(SYS_recvmsg, fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto fail;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int one;

                memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (received < 0)
                    received = one;
                else
                    syscall(SYS_close, one);
            }
        }
        if (n == 0) {
            if (got == 0) {
                if (received >= 0)
                    syscall(SYS_close, received);
                return 0;
            }
            goto fail;
        }
        got += (size_t)n;
    }
    if (rec->magic != DMTCP_RECORD_MAGIC || rec->version != DMTCP_RECORD_VERSION)
        goto fail;
    if (passed)
        *passed = received;
    else if (received >= 0)
        syscall(SYS_close, received);
    return 1;
fail:
    if (received >= 0)
        syscall(SYS_close, received);
    return -1;
}

int channel_recv(int fd, struct dmtcp_record *rec)
{
    return channel_recv_fd(fd, rec, NULL);
}

/* Exactly len bytes that follow a record (its payload). */
int channel_recv_payload(int fd, void *buf, size_t len)
{
    char *p = buf;
    size_t got = 0;

    while (got < len) {
        long n = syscall(SYS_read, fd, p + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* A record with a socket riding on it (SCM_RIGHTS). */
int channel_send_fd(int fd, uint16_t type, uint64_t arg, int passed)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct dmtcp_record rec;
    struct iovec iov = { &rec, sizeof(rec) };
    struct msghdr msg = { 0 };
    struct cmsghdr *c;
    long n;

    record_init(&rec, type, arg);
    memset(&control, 0, sizeof(control));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passed, sizeof(int));
    do
        n = syscall(SYS_sendmsg, fd, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    /* the record is 24 bytes on a stream socket: the rest, if any, plainly */
    return (size_t)n == sizeof(rec) ? 0 : write_all(fd, (char *)&rec + n, sizeof(rec) - (size_t)n);
}

void channel_close(int fd)
{
    if (fd >= 0)
        syscall(SYS_close, fd);
}

/*
 * One record to the agent on a connection of its own, from any thread of
 * the program, outside a checkpoint (the caller holds the gate, so no dump
 * meets the connection): connect, send, close.  Never waits: the socket is
 * non-blocking, and a record the agent cannot take at once (no agent, its
 * backlog full, a second one under way in this process, say in a signal
 * handler that interrupted the first) is dropped.  Raw system calls only
 * (wait wrappers run in SIGCHLD handlers); errno as it was.  0 if sent.
 *
 * tell_fd is that connection while it exists: a fork meanwhile in another
 * thread gives the child a copy, which the child closes at once
 * (channel_after_fork_child) rather than take to its next dump.
 */
static int telling;
static int tell_fd = -1;

int channel_tell(uint16_t type, uint64_t arg)
{
    int saved = errno, fd, rc = -1;
    struct sockaddr_un addr;
    socklen_t len;

    if (agent_env[0] == '\0' || __atomic_exchange_n(&telling, 1, __ATOMIC_ACQUIRE))
        return -1;
    fd = channel_socket();
    __atomic_store_n(&tell_fd, fd, __ATOMIC_RELEASE);
    if (fd >= 0) {
        if (syscall(SYS_fcntl, fd, F_SETFL, O_NONBLOCK) == 0
            && dmtcp_agent_addr(agent_env, &addr, &len) == 0
            && syscall(SYS_connect, fd, &addr, len) == 0)
            rc = channel_send(fd, type, arg);
        __atomic_store_n(&tell_fd, -1, __ATOMIC_RELEASE);
        syscall(SYS_close, fd);
    }
    __atomic_store_n(&telling, 0, __ATOMIC_RELEASE);
    errno = saved;
    return rc;
}

void channel_after_fork_child(void)
{
    /* (written only when set: an untouched page costs the child nothing) */
    if (__atomic_load_n(&tell_fd, __ATOMIC_ACQUIRE) >= 0) {
        int fd = __atomic_exchange_n(&tell_fd, -1, __ATOMIC_ACQ_REL);

        if (fd >= 0)
            syscall(SYS_close, fd);
    }
    if (__atomic_load_n(&telling, __ATOMIC_ACQUIRE))
        __atomic_store_n(&telling, 0, __ATOMIC_RELEASE);
}
