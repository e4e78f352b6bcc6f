/*
 * The address of a tree's agent, as the shim and the tree's init reach it.
 *
 * DMTCP_AGENT_SOCK names the agent's socket in the abstract namespace,
 * fixed for the tree ("@dmtcp-agent-<tree id>"), so that a restored tree
 * finds its new agent on any host.  Two copies of one checkpoint may run
 * on one host, each in a PID namespace of its own: the name alone would be
 * the same for both.  So the address is the name, '-', and the inode
 * number of the caller's PID namespace (readlink /proc/self/ns/pid:
 * "pid:[4026532177]"), which the agent reads the same way from its tree's
 * root (dmtcp_py/agent/shimlink.py).  It is built again at every connect:
 * a restore puts the same process into a new namespace.
 *
 * Needs _GNU_SOURCE (syscall()), as every unit of the shim defines it.
 * Raw system calls and the caller's memory only: the checkpoint thread
 * uses it while other threads may hold malloc's locks.
 */
#ifndef DMTCP_AGENT_ADDR_H
#define DMTCP_AGENT_ADDR_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* The digits of this process's PID namespace inode into out (NUL-ended);
 * 0, or -1 when /proc cannot tell (then no suffix: the agent cannot read
 * it either). */
static inline int dmtcp_pidns_digits(char *out, size_t size)
{
    char link[64];
    long n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/ns/pid", link, sizeof(link) - 1);
    size_t at = 0;
    char *p;

    if (n <= 0)
        return -1;
    link[n] = '\0';
    p = strchr(link, '[');
    if (p == NULL)
        return -1;
    for (p++; *p >= '0' && *p <= '9' && at + 1 < size; p++)
        out[at++] = *p;
    if (at == 0 || *p != ']')
        return -1;
    out[at] = '\0';
    return 0;
}

/* The agent's address for env_value ("@name", or a path: used as given);
 * 0, or -1 when env_value is empty or too long. */
static inline int dmtcp_agent_addr(const char *env_value, struct sockaddr_un *addr,
                                   socklen_t *len)
{
    char ns[24];
    size_t n, extra = 0;
    int abstract;

    if (env_value == NULL || env_value[0] == '\0')
        return -1;
    abstract = env_value[0] == '@';
    env_value += abstract;
    n = strlen(env_value);
    if (abstract && dmtcp_pidns_digits(ns, sizeof(ns)) == 0)
        extra = 1 + strlen(ns);
    if (n + extra + 1 >= sizeof(addr->sun_path))
        return -1;
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    memcpy(addr->sun_path + abstract, env_value, n);
    if (extra) {
        addr->sun_path[abstract + n] = '-';
        memcpy(addr->sun_path + abstract + n + 1, ns, extra - 1);
    }
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)abstract + n + extra
                       + (abstract ? 0 : 1));
    return 0;
}

/* The address the agent listens at for one round's processes coming back
 * from its dump (DMTCP_REC_CHECKPOINT's arg, token): the agent's address
 * and "~" and the token in 8 hex digits; 0, or -1 when there is no room
 * or the address is not abstract (the agent listens only there). */
static inline int dmtcp_agent_release_addr(const char *env_value, uint32_t token,
                                           struct sockaddr_un *addr, socklen_t *len)
{
    static const char hex[] = "0123456789abcdef";
    size_t at;

    if (env_value == NULL || env_value[0] != '@'
        || dmtcp_agent_addr(env_value, addr, len) < 0)
        return -1;
    at = *len - offsetof(struct sockaddr_un, sun_path);
    if (at + 9 > sizeof(addr->sun_path))
        return -1;
    addr->sun_path[at++] = '~';
    for (int shift = 28; shift >= 0; shift -= 4)
        addr->sun_path[at++] = hex[(token >> shift) & 0xf];
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + at);
    return 0;
}

#endif
