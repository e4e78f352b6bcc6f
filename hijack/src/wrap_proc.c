/*
 * /proc/PID paths, with this PID namespace's ids.
 *
 * A tree may run in a PID namespace of its own (so that its pids are its
 * own at every restart), while /proc is the host's: /proc/self is right,
 * but /proc/<a pid from getpid(), fork(), a peer> names another process
 * there, or none.  Programs do that: UCX (MPICH's transport) opens a
 * peer's shared memory through /proc/<peer pid>/fd/N.  So the calls that
 * take a path turn a leading /proc/<id> into /proc/<the id /proc knows the
 * same process by>, found through a pidfd's fdinfo ("Pid:", in /proc's
 * namespace).  An id no process of the namespace has becomes one no
 * process has in /proc either (0): ENOENT, as it would be with a /proc of
 * the namespace's own.
 *
 * Only the first id of a path, and only in open, open64, openat,
 * openat64 (and their fortified forms), fopen, fopen64, opendir,
 * readlink, access, stat and lstat; raw system calls and glibc's internal
 * opens are not seen.  Without a namespace of the tree's own, nothing
 * changes (one readlink of /proc/self per process).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif

static int proc_is_ours; /* 0: not known yet, 1: /proc's ids are ours, 2: not */

static int ids_differ(void)
{
    int state = __atomic_load_n(&proc_is_ours, __ATOMIC_RELAXED);

    if (state == 0) {
        char link[32];
        long n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self", link, sizeof(link) - 1);
        long id = 0;

        for (long i = 0; i < n && link[i] >= '0' && link[i] <= '9'; i++)
            id = id * 10 + (link[i] - '0');
        /* (what a fork inherits holds for the child: the same namespace) */
        state = n <= 0 || id == (long)syscall(SYS_getpid) ? 1 : 2;
        __atomic_store_n(&proc_is_ours, state, __ATOMIC_RELAXED);
    }
    return state == 2;
}

static char *put_number(char *at, long num)
{
    char digits[24];
    int len = 0;

    do
        digits[len++] = (char)('0' + num % 10);
    while ((num /= 10) > 0);
    while (len > 0)
        *at++ = digits[--len];
    return at;
}

long proc_id_of(pid_t pid)
{
    char path[48], buf[512], *p;
    int fd = (int)syscall(SYS_pidfd_open, pid, 0), info;
    long n, id = 0;

    if (fd < 0 && errno == EINVAL) /* a thread's id, not a process's */
        fd = (int)syscall(SYS_pidfd_open, pid, PIDFD_THREAD);
    if (fd < 0)
        return errno == ESRCH ? -1 : pid; /* no pidfds here: take it as it is */
    memcpy(path, "/proc/self/fdinfo/", 18);
    *put_number(path + 18, fd) = '\0';
    info = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    n = info < 0 ? -1 : syscall(SYS_read, info, buf, sizeof(buf) - 1);
    if (info >= 0)
        syscall(SYS_close, info);
    syscall(SYS_close, fd);
    if (n <= 0)
        return pid;
    buf[n] = '\0';
    p = strstr(buf, "\nPid:");
    if (p == NULL)
        return pid;
    for (p += 5; *p == ' ' || *p == '\t'; p++)
        ;
    if (*p == '-')
        return -1; /* reaped meanwhile */
    while (*p >= '0' && *p <= '9')
        id = id * 10 + (*p++ - '0');
    return id > 0 ? id : pid;
}

const char *proc_path_of(const char *path, char *buf, size_t size)
{
    const char *rest;
    long pid = 0, id;
    int saved = errno;
    char *at;

    if (path == NULL || strncmp(path, "/proc/", 6) != 0 || path[6] < '0' || path[6] > '9')
        return path;
    for (rest = path + 6; *rest >= '0' && *rest <= '9' && pid < 0x7fffffff; rest++)
        pid = pid * 10 + (*rest - '0');
    if ((*rest != '/' && *rest != '\0') || !ids_differ() || strlen(rest) + 32 > size)
        return path;
    id = proc_id_of((pid_t)pid);
    memcpy(buf, "/proc/", 6);
    at = put_number(buf + 6, id < 0 ? 0 : id);
    memcpy(at, rest, strlen(rest) + 1);
    errno = saved;
    return buf;
}

#define TRANSLATED(path) \
    char translated_[4096]; \
    const char *real_path_ = proc_path_of((path), translated_, sizeof(translated_))

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

SHIM_EXPORT int open(const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;
    TRANSLATED(path);

    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return real_open(real_path_, flags, mode);
}

SHIM_EXPORT int open64(const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;
    TRANSLATED(path);

    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return real_open64(real_path_, flags, mode);
}

SHIM_EXPORT int openat(int dir, const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;
    TRANSLATED(path);

    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return real_openat(dir, real_path_, flags, mode);
}

SHIM_EXPORT int openat64(int dir, const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;
    TRANSLATED(path);

    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return real_openat64(dir, real_path_, flags, mode);
}

/* the _FORTIFY_SOURCE forms (no mode: they refuse O_CREAT without one) */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dir, const char *path, int flags);
int __openat64_2(int dir, const char *path, int flags);

SHIM_EXPORT int __open_2(const char *path, int flags)
{
    TRANSLATED(path);

    return real_open(real_path_, flags, 0);
}

SHIM_EXPORT int __open64_2(const char *path, int flags)
{
    TRANSLATED(path);

    return real_open64(real_path_, flags, 0);
}

SHIM_EXPORT int __openat_2(int dir, const char *path, int flags)
{
    TRANSLATED(path);

    return real_openat(dir, real_path_, flags, 0);
}

SHIM_EXPORT int __openat64_2(int dir, const char *path, int flags)
{
    TRANSLATED(path);

    return real_openat64(dir, real_path_, flags, 0);
}

SHIM_EXPORT FILE *fopen(const char *path, const char *mode)
{
    TRANSLATED(path);

    return real_fopen(real_path_, mode);
}

SHIM_EXPORT FILE *fopen64(const char *path, const char *mode)
{
    TRANSLATED(path);

    return real_fopen64(real_path_, mode);
}

SHIM_EXPORT DIR *opendir(const char *path)
{
    TRANSLATED(path);

    return real_opendir(real_path_);
}

SHIM_EXPORT ssize_t readlink(const char *path, char *buf, size_t size)
{
    TRANSLATED(path);

    return real_readlink(real_path_, buf, size);
}

SHIM_EXPORT int access(const char *path, int mode)
{
    TRANSLATED(path);

    return real_access(real_path_, mode);
}

SHIM_EXPORT int stat(const char *path, struct stat *st)
{
    TRANSLATED(path);

    return real_stat(real_path_, st);
}

SHIM_EXPORT int lstat(const char *path, struct stat *st)
{
    TRANSLATED(path);

    return real_lstat(real_path_, st);
}
