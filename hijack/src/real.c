/*
 * The real libc functions behind our wrappers: the one place that calls
 * dlsym(RTLD_NEXT).  Resolved lazily, because another library's
 * constructor may call a wrapper before ours ran.  dlsym may allocate, so
 * the checkpoint thread only uses these outside a suspension.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>

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

/* Warm the cache while it is safe to allocate (from the constructor). */
__attribute__((constructor(101))) static void real_warm(void)
{
    resolve_sigaction();
    resolve_sigprocmask();
    resolve_pthread_sigmask();
    resolve_pthread_create();
}
