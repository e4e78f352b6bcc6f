/*
 * The shim's own fd (its connection to the agent, at a high number) is not
 * the program's to close or to overwrite: daemons close every fd they did
 * not open, and a closed link would leave the process out of the next
 * checkpoint.  To the program that number looks unused: close() on it says
 * EBADF, dup2()/dup3() onto it say EBADF, and close_range()/closefrom()
 * close everything around it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

static int is_ours(int fd)
{
    int agent = channel_agent_fd();

    return fd >= 0 && fd == agent;
}

/* What inotify.c knows of an fd number (read by this process, events
 * kept) goes when the number does. */
static void forget(unsigned first, unsigned last)
{
    if (first == last) {
        if (first < INOTIFY_READ_FDS
            && (__atomic_load_n(&inotify_read_bits[first >> 6], __ATOMIC_RELAXED)
                & (1ull << (first & 63))))
            inotify_unnote_read(first, last);
    } else {
        inotify_unnote_read(first, last);
    }
    if (__builtin_expect(__atomic_load_n(&inotify_live, __ATOMIC_RELAXED) != 0, 0))
        inotify_forget(first, last);
}

SHIM_EXPORT int close(int fd)
{
    if (is_ours(fd)) {
        errno = EBADF;
        return -1;
    }
    if (fd >= 0)
        forget((unsigned)fd, (unsigned)fd);
    return real_close(fd);
}

SHIM_EXPORT int dup2(int oldfd, int newfd)
{
    if (is_ours(newfd) || (is_ours(oldfd) && oldfd != newfd)) {
        errno = EBADF;
        return -1;
    }
    if (newfd >= 0 && oldfd != newfd)
        forget((unsigned)newfd, (unsigned)newfd);
    return real_dup2(oldfd, newfd);
}

SHIM_EXPORT int dup3(int oldfd, int newfd, int flags)
{
    if (is_ours(newfd) || is_ours(oldfd)) {
        errno = EBADF;
        return -1;
    }
    if (newfd >= 0 && oldfd != newfd)
        forget((unsigned)newfd, (unsigned)newfd);
    return real_dup3(oldfd, newfd, flags);
}

static int raw_close_range(unsigned first, unsigned last, int flags)
{
    if (!(flags & CLOSE_RANGE_CLOEXEC))
        forget(first, last);
    return (int)syscall(SYS_close_range, first, last, flags);
}

SHIM_EXPORT int close_range(unsigned first, unsigned last, int flags)
{
    int agent = channel_agent_fd();
    int rc = 0;

    if (agent < 0 || (unsigned)agent < first || (unsigned)agent > last)
        return raw_close_range(first, last, flags);
    /* the two ranges around our fd; CLOSE_RANGE_UNSHARE once is enough */
    if ((unsigned)agent > first)
        rc = raw_close_range(first, (unsigned)agent - 1, flags);
    if (rc == 0 && (unsigned)agent < last && (unsigned)agent < UINT_MAX)
        rc = raw_close_range((unsigned)agent + 1, last, flags);
    return rc;
}

SHIM_EXPORT void closefrom(int lowfd)
{
    if (lowfd < 0)
        lowfd = 0;
    if (close_range((unsigned)lowfd, UINT_MAX, 0) != 0) {
        /* an old kernel: one by one, up to the limit */
        long max = sysconf(_SC_OPEN_MAX);

        for (long fd = lowfd; fd < max; fd++)
            if (!is_ours((int)fd))
                syscall(SYS_close, (int)fd);
    }
}

