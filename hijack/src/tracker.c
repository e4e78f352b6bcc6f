/*
 * The tracker: a userfaultfd of this process's memory in asynchronous
 * write-protect mode (UFFD_FEATURE_WP_ASYNC, Linux 6.7), made at the
 * agent's TRACK and handed over to it.
 *
 * A userfaultfd belongs to the memory of the process that made it, so the
 * agent cannot make it; but CRIU cannot dump a process that holds one, and
 * the write protection lasts only as long as it is open: so the agent
 * keeps it, and registers the process's ranges through it before every
 * dump, and our CRIU reads which pages were written since the last one
 * (dmtcp_py/agent/tracking.py, scripts/criu-patches/0004).  Nothing
 * is ever delivered on it: asynchronous write protection resolves each
 * first write in the kernel.  Asked for while the process is suspended,
 * or, for a pre-copy (dmtcp_py/images/precopy.py), while it runs: the
 * number it takes, the lowest free one, is then in use for a moment only,
 * as the agent link's socket is before it moves up (channel.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15) /* Linux 6.7; older headers lack it */
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1 /* (no fault is ever handled: allowed to anyone) */
#endif

/* A new tracker's fd, for the caller to hand over and close; or -errno. */
int tracker_make(void)
{
    struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_WP_ASYNC };
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    int err;

    if (fd < 0)
        return -errno;
    if (syscall(SYS_ioctl, fd, UFFDIO_API, &api) < 0) {
        err = errno;
        syscall(SYS_close, fd);
        return -err;
    }
    return fd;
}
