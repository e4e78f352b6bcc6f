/*
 * The real libc functions behind our wrappers: the one place that calls
 * dlsym(RTLD_NEXT).  Resolved lazily, because another library's
 * constructor may call a wrapper before ours ran.  dlsym may allocate, so
 * the checkpoint thread only uses these outside a suspension.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define REAL(name) \
    static __typeof__(&name) real_##name##_fn; \
    static __typeof__(&name) resolve_##name(void) \
    { \
        if (real_##name##_fn == NULL) \
            real_##name##_fn = (__typeof__(&name))dlsym(RTLD_NEXT, #name); \
        return real_##name##_fn; \
    }

REAL(sigaction)
REAL(sigprocmask)
REAL(pthread_sigmask)
REAL(pthread_create)
REAL(execve)
REAL(execvpe)
REAL(posix_spawn)
REAL(posix_spawnp)
REAL(system)
REAL(popen)
REAL(nanosleep)
REAL(clock_nanosleep)
REAL(poll)
REAL(ppoll)
REAL(select)
REAL(pselect)
REAL(epoll_wait)
REAL(epoll_pwait)
REAL(epoll_pwait2)
REAL(pause)
REAL(sigsuspend)
REAL(sigtimedwait)
REAL(sigwaitinfo)
REAL(sigwait)
REAL(wait)
REAL(waitpid)
REAL(wait3)
REAL(wait4)
REAL(waitid)
REAL(kill)
REAL(killpg)
REAL(close)
REAL(dup2)
REAL(dup3)
REAL(open)
REAL(open64)
REAL(openat)
REAL(openat64)
REAL(fopen)
REAL(fopen64)
REAL(opendir)
REAL(readlink)
REAL(access)
REAL(stat)
REAL(lstat)

int real_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    return resolve_sigaction() ? resolve_sigaction()(sig, act, old) : (errno = ENOSYS, -1);
}

int real_sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    return resolve_sigprocmask() ? resolve_sigprocmask()(how, set, old) : (errno = ENOSYS, -1);
}

int real_pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    return resolve_pthread_sigmask() ? resolve_pthread_sigmask()(how, set, old) : ENOSYS;
}

int real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    return resolve_pthread_create() ? resolve_pthread_create()(t, attr, fn, arg) : ENOSYS;
}

int real_execve(const char *path, char *const argv[], char *const envp[])
{
    return resolve_execve() ? resolve_execve()(path, argv, envp) : (errno = ENOSYS, -1);
}

int real_execvpe(const char *file, char *const argv[], char *const envp[])
{
    return resolve_execvpe() ? resolve_execvpe()(file, argv, envp) : (errno = ENOSYS, -1);
}

int real_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                     const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    return resolve_posix_spawn() ? resolve_posix_spawn()(pid, path, fa, attr, argv, envp) : ENOSYS;
}

int real_posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                      const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    return resolve_posix_spawnp() ? resolve_posix_spawnp()(pid, file, fa, attr, argv, envp) : ENOSYS;
}

int real_system(const char *command)
{
    return resolve_system() ? resolve_system()(command) : (errno = ENOSYS, -1);
}

FILE *real_popen(const char *command, const char *type)
{
    return resolve_popen() ? resolve_popen()(command, type) : (errno = ENOSYS, NULL);
}

int real_nanosleep(const struct timespec *req, struct timespec *rem)
{
    return resolve_nanosleep() ? resolve_nanosleep()(req, rem) : (errno = ENOSYS, -1);
}

int real_clock_nanosleep(clockid_t clock, int flags, const struct timespec *req,
                         struct timespec *rem)
{
    return resolve_clock_nanosleep() ? resolve_clock_nanosleep()(clock, flags, req, rem) : ENOSYS;
}

int real_poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    return resolve_poll() ? resolve_poll()(fds, nfds, timeout) : (errno = ENOSYS, -1);
}

int real_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
               const sigset_t *mask)
{
    return resolve_ppoll() ? resolve_ppoll()(fds, nfds, timeout, mask) : (errno = ENOSYS, -1);
}

int real_select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *timeout)
{
    return resolve_select() ? resolve_select()(nfds, r, w, e, timeout) : (errno = ENOSYS, -1);
}

int real_pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *timeout,
                 const sigset_t *mask)
{
    return resolve_pselect() ? resolve_pselect()(nfds, r, w, e, timeout, mask)
                             : (errno = ENOSYS, -1);
}

int real_epoll_wait(int ep, struct epoll_event *events, int max, int timeout)
{
    return resolve_epoll_wait() ? resolve_epoll_wait()(ep, events, max, timeout)
                                : (errno = ENOSYS, -1);
}

int real_epoll_pwait(int ep, struct epoll_event *events, int max, int timeout,
                     const sigset_t *mask)
{
    return resolve_epoll_pwait() ? resolve_epoll_pwait()(ep, events, max, timeout, mask)
                                 : (errno = ENOSYS, -1);
}

int real_epoll_pwait2(int ep, struct epoll_event *events, int max,
                      const struct timespec *timeout, const sigset_t *mask)
{
    return resolve_epoll_pwait2() ? resolve_epoll_pwait2()(ep, events, max, timeout, mask)
                                  : (errno = ENOSYS, -1);
}

int real_pause(void)
{
    return resolve_pause() ? resolve_pause()() : (errno = ENOSYS, -1);
}

int real_sigsuspend(const sigset_t *mask)
{
    return resolve_sigsuspend() ? resolve_sigsuspend()(mask) : (errno = ENOSYS, -1);
}

int real_sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout)
{
    return resolve_sigtimedwait() ? resolve_sigtimedwait()(set, info, timeout)
                                  : (errno = ENOSYS, -1);
}

int real_sigwaitinfo(const sigset_t *set, siginfo_t *info)
{
    return resolve_sigwaitinfo() ? resolve_sigwaitinfo()(set, info) : (errno = ENOSYS, -1);
}

int real_sigwait(const sigset_t *set, int *sig)
{
    return resolve_sigwait() ? resolve_sigwait()(set, sig) : ENOSYS;
}

pid_t real_wait(int *status)
{
    return resolve_wait() ? resolve_wait()(status) : (errno = ENOSYS, -1);
}

pid_t real_waitpid(pid_t pid, int *status, int options)
{
    return resolve_waitpid() ? resolve_waitpid()(pid, status, options) : (errno = ENOSYS, -1);
}

pid_t real_wait3(int *status, int options, struct rusage *usage)
{
    return resolve_wait3() ? resolve_wait3()(status, options, usage) : (errno = ENOSYS, -1);
}

pid_t real_wait4(pid_t pid, int *status, int options, struct rusage *usage)
{
    return resolve_wait4() ? resolve_wait4()(pid, status, options, usage) : (errno = ENOSYS, -1);
}

int real_waitid(idtype_t type, id_t id, siginfo_t *info, int options)
{
    return resolve_waitid() ? resolve_waitid()(type, id, info, options) : (errno = ENOSYS, -1);
}

int real_kill(pid_t pid, int sig)
{
    return resolve_kill() ? resolve_kill()(pid, sig) : (errno = ENOSYS, -1);
}

int real_killpg(pid_t group, int sig)
{
    return resolve_killpg() ? resolve_killpg()(group, sig) : (errno = ENOSYS, -1);
}

/* Warm the cache while it is safe to allocate (from the constructor). */
__attribute__((constructor(101))) static void real_warm(void)
{
    resolve_sigaction();
    resolve_sigprocmask();
    resolve_pthread_sigmask();
    resolve_pthread_create();
    resolve_execve();
    resolve_execvpe();
    resolve_posix_spawn();
    resolve_posix_spawnp();
    resolve_system();
    resolve_popen();
    resolve_nanosleep();
    resolve_clock_nanosleep();
    resolve_poll();
    resolve_ppoll();
    resolve_select();
    resolve_pselect();
    resolve_epoll_wait();
    resolve_epoll_pwait();
    resolve_epoll_pwait2();
    resolve_pause();
    resolve_sigsuspend();
    resolve_sigtimedwait();
    resolve_sigwaitinfo();
    resolve_sigwait();
    resolve_wait();
    resolve_waitpid();
    resolve_wait3();
    resolve_wait4();
    resolve_waitid();
    resolve_kill();
    resolve_killpg();
    resolve_open();
    resolve_open64();
    resolve_openat();
    resolve_openat64();
    resolve_fopen();
    resolve_fopen64();
    resolve_opendir();
    resolve_readlink();
    resolve_access();
    resolve_stat();
    resolve_lstat();
}

int real_close(int fd)
{
    return resolve_close() ? resolve_close()(fd) : (errno = ENOSYS, -1);
}

int real_dup2(int oldfd, int newfd)
{
    return resolve_dup2() ? resolve_dup2()(oldfd, newfd) : (errno = ENOSYS, -1);
}

int real_dup3(int oldfd, int newfd, int flags)
{
    return resolve_dup3() ? resolve_dup3()(oldfd, newfd, flags) : (errno = ENOSYS, -1);
}

int real_open(const char *path, int flags, mode_t mode)
{
    return resolve_open() ? resolve_open()(path, flags, mode) : (errno = ENOSYS, -1);
}

int real_open64(const char *path, int flags, mode_t mode)
{
    return resolve_open64() ? resolve_open64()(path, flags, mode) : (errno = ENOSYS, -1);
}

int real_openat(int dir, const char *path, int flags, mode_t mode)
{
    return resolve_openat() ? resolve_openat()(dir, path, flags, mode) : (errno = ENOSYS, -1);
}

int real_openat64(int dir, const char *path, int flags, mode_t mode)
{
    return resolve_openat64() ? resolve_openat64()(dir, path, flags, mode) : (errno = ENOSYS, -1);
}

FILE *real_fopen(const char *path, const char *mode)
{
    return resolve_fopen() ? resolve_fopen()(path, mode) : (errno = ENOSYS, NULL);
}

FILE *real_fopen64(const char *path, const char *mode)
{
    return resolve_fopen64() ? resolve_fopen64()(path, mode) : (errno = ENOSYS, NULL);
}

DIR *real_opendir(const char *path)
{
    return resolve_opendir() ? resolve_opendir()(path) : (errno = ENOSYS, NULL);
}

ssize_t real_readlink(const char *path, char *buf, size_t size)
{
    return resolve_readlink() ? resolve_readlink()(path, buf, size) : (errno = ENOSYS, -1);
}

int real_access(const char *path, int mode)
{
    return resolve_access() ? resolve_access()(path, mode) : (errno = ENOSYS, -1);
}

int real_stat(const char *path, struct stat *st)
{
    return resolve_stat() ? resolve_stat()(path, st) : (errno = ENOSYS, -1);
}

int real_lstat(const char *path, struct stat *st)
{
    return resolve_lstat() ? resolve_lstat()(path, st) : (errno = ENOSYS, -1);
}
