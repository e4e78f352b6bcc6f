/*
 * A sleep for the shim's own waits (the checkpoint thread's reconnect
 * backoff, the API's polls).  A unit of its own, so that neither caller
 * depends on the other for it.
 */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

void pause_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    /* a raw system call: nanosleep() here would be our own wrapper
     * (wrap_wait.c).  It restarts by itself across a CRIU dump/restore;
     * cut short by a signal, it left the time still to sleep in ts. */
    while (syscall(SYS_nanosleep, &ts, &ts) < 0)
        ;
}
