/*
 * An alarm that fires while CRIU dumps the process must not be lost.
 *
 * WHY: CRIU 4.2.1 reads a task's pending signals (dump_task_signals) before
 * it infects it and reads its interval timers through the parasite
 * (parasite_dump_itimers_seized, cr-dump.c).  ITIMER_REAL keeps running
 * while the process is stopped; a one-shot one (alarm(), setitimer with no
 * interval) that expires between those two reads is in the image neither
 * as a pending SIGALRM nor as a timer: the restored program never gets its
 * alarm.  Seen as res_timers' alarm() child waiting for ever after a
 * restart, about once in six full test runs.
 *
 * So: at SUSPEND, with every other thread stopped (nothing of the program
 * can arm or disarm the timer until RESUME), whether ITIMER_REAL was armed
 * is noted.  At RESUME (after the dump, or in the restored process), a
 * timer armed then and disarmed now has expired meanwhile; its SIGALRM
 * must then be pending (no handler of the program ran: the threads were
 * stopped, this one has every signal blocked).  If it is not, CRIU lost it,
 * and it is sent again, to the process, as the kernel sends it.  A
 * periodic timer re-arms itself and loses at most one tick that way; an
 * ignored SIGALRM is never pending, and sending it again is discarded as
 * the first one was.
 *
 * Checkpoint thread (or the handler that serves the link), program
 * suspended: raw system calls on static memory.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "shim.h"

static int armed; /* ITIMER_REAL was armed when the process was suspended */

static int alarm_armed(void)
{
    struct itimerval now;

    if (syscall(SYS_getitimer, ITIMER_REAL, &now) < 0)
        return -1;
    return now.it_value.tv_sec != 0 || now.it_value.tv_usec != 0;
}

void timers_save(void)
{
    armed = alarm_armed() == 1;
}

void timers_resume(void)
{
    uint64_t pending = 0; /* the kernel's sigset: 64 bits on Linux */

    if (!armed)
        return;
    armed = 0;
    if (alarm_armed() != 0)
        return; /* still running (or unknown): it fires by itself */
    if (syscall(SYS_rt_sigpending, &pending, sizeof(pending)) < 0)
        return;
    if (!(pending & (1ull << (SIGALRM - 1))))
        syscall(SYS_kill, (pid_t)syscall(SYS_getpid), SIGALRM);
}
