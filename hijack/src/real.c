/*
 * The real libc functions behind our wrappers: the one place that calls
 * dlsym(RTLD_NEXT).  Resolved lazily, because another library's
 * constructor may call a wrapper before ours ran.  dlsym may allocate, so
 * the checkpoint thread only uses these outside a suspension.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
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
}
