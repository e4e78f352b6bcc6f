/*
 * Thread creation waits while a checkpoint holds the process suspended, so
 * that the set of threads to stop cannot grow behind the checkpoint
 * thread's back.  (fork is held off the same way, by the atfork handlers
 * in ckpt_thread.c.)
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "shim.h"

SHIM_EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    int rc;

    gate_enter();
    rc = real_pthread_create(t, attr, fn, arg);
    gate_leave();
    return rc;
}
