/*
 * The reserved signal belongs to the shim: the program may neither block
 * it, ignore it, nor install its own handler for it.  What the program asks
 * for that signal is remembered and reported back, so it sees a consistent
 * picture; every other signal passes through untouched.
 */
#define _GNU_SOURCE
#define _DEFAULT_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "shim.h"

static struct sigaction programs_view; /* what the program believes is installed */

static const sigset_t *without_reserved(int how, const sigset_t *set, sigset_t *copy)
{
    if (set == NULL || suspend_signal() == 0 || how == SIG_UNBLOCK
        || !sigismember(set, suspend_signal()))
        return set;
    *copy = *set;
    sigdelset(copy, suspend_signal());
    return copy;
}

SHIM_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    sigset_t copy;

    return real_sigprocmask(how, without_reserved(how, set, &copy), old);
}

SHIM_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    sigset_t copy;

    return real_pthread_sigmask(how, without_reserved(how, set, &copy), old);
}

SHIM_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (suspend_signal() != 0 && sig == suspend_signal()) {
        if (old)
            *old = programs_view;
        if (act)
            programs_view = *act;
        return 0;
    }
    if (act && suspend_signal() != 0 && sigismember(&act->sa_mask, suspend_signal())) {
        struct sigaction copy = *act;

        sigdelset(&copy.sa_mask, suspend_signal());
        return real_sigaction(sig, &copy, old);
    }
    return real_sigaction(sig, act, old);
}

static sighandler_t install(int sig, sighandler_t handler, int flags)
{
    struct sigaction sa, old;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    if (sigaction(sig, &sa, &old) < 0)
        return SIG_ERR;
    return old.sa_handler;
}

/* glibc's signal() has BSD semantics; in strict POSIX mode its header
 * redirects signal() to __sysv_signal, hence the SysV variants too. */
SHIM_EXPORT sighandler_t signal(int sig, sighandler_t handler)
{
    return install(sig, handler, SA_RESTART);
}

SHIM_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler)
{
    return install(sig, handler, SA_RESTART);
}

SHIM_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler)
{
    return install(sig, handler, (int)(SA_RESETHAND | SA_NODEFER));
}

SHIM_EXPORT sighandler_t __sysv_signal(int sig, sighandler_t handler)
{
    return install(sig, handler, (int)(SA_RESETHAND | SA_NODEFER));
}
