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

/*
 * One sleep, over at the first interruption.  A CRIU dump interrupts it:
 * its parasite ends with a sigreturn, which drops the kernel's restart of
 * the sleep, so the sleep fails with EINTR once CRIU lets the thread go.
 * pause_ms would then sleep the rest of it (measured: the processes of a
 * 32-process tree connected back to the agent 5-7 ms after the dump, with
 * the program still stopped); the reconnect loop wants to try at once.
 */
void nap_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    syscall(SYS_nanosleep, &ts, NULL);
}
