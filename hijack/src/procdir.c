/*
 * Listing a /proc directory of numbers (task ids, fds) with raw system
 * calls and a static buffer: usable by the checkpoint thread while the
 * program's threads are stopped.  Not reentrant; the checkpoint thread is
 * its only caller.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

int procdir_each(const char *path, void (*fn)(int num, void *ctx), void *ctx)
{
    static char buf[16384];
    int dir = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    /* a list of fds shows the one it is read through: not the caller's.
     * A list of tasks may hold a thread whose id is that number */
    int own = strstr(path, "/fd") != NULL ? dir : -1;
    long n;

    if (dir < 0)
        return -1;
    while ((n = syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0) {
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            int num = 0;
            const char *p = d->d_name;

            off += d->d_reclen;
            if (*p < '0' || *p > '9')
                continue; /* "." and ".." */
            while (*p >= '0' && *p <= '9')
                num = num * 10 + (*p++ - '0');
            if (num != own)
                fn(num, ctx);
        }
    }
    syscall(SYS_close, dir);
    return 0;
}

long proc_read(const char *path, char *buf, size_t size)
{
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    long n;

    if (fd < 0)
        return -1;
    n = syscall(SYS_read, fd, buf, size - 1);
    syscall(SYS_close, fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    return n;
}
