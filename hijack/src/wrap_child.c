/*
 * Children killed by a failure, told to the agent.
 *
 * WHY: a tree is lost when its program is killed by a signal.  But what
 * dies is more often a process under the program (an MPI rank the OOM
 * killer takes, a worker that segfaults), and the program (mpirun, a
 * parent waiting for its worker) then exits by itself with a non-zero
 * status.  Only that process's parent learns how it ended: these wrappers
 * look at the status the real call gives back, and when it says "killed by
 * a failure signal" (one of DMTCP_FAILURE_SIGNALS, or any that dumped
 * core; not SIGPIPE, SIGTERM and the like, how programs end each other)
 * they tell the agent with one CHILD_KILLED record.  The coordinator
 * decides what it means once the program has ended (a program that still
 * exits 0 lost nothing).
 *
 * A child this process killed itself (kill, killpg) is no failure either:
 * its end is the program's own doing (MPICH's proxy SIGKILLs every rank
 * once one died; `timeout -s KILL`).  The last KILLED_KEPT such targets are
 * remembered.  One that was ending already when it was killed keeps its
 * own cause: a zombie, or a process in its exit (PF_EXITING in
 * /proc/PID/stat: the proxy sees a rank's pipes close, and kills them all,
 * before the rank is a zombie).
 *
 * The program gets the real call's result and errno.  A status pointer
 * given as NULL is replaced by one of ours, to look at; waitid with
 * WNOWAIT reaps nothing, and tells nothing (the same child comes again).
 *
 * The record goes on a connection of its own (channel_tell), as
 * dmtcp_checkpoint()'s request does, under the gate, so that no dump meets
 * it (a checkpoint waits for it to end, as for a fork).  It never waits for
 * the agent.  These wrappers may run in a SIGCHLD handler: what they do
 * after the call is raw system calls and the gate.
 *
 * Not seen: glibc's own waits (system(), pclose(), posix_spawn's), raw
 * syscall()s, and children reaped by a SIGCHLD set to SIG_IGN.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shim.h"

#define KILLED_KEPT 64
#define PF_EXITING 0x4 /* include/linux/sched.h: in do_exit() */

static pid_t killed_here[KILLED_KEPT]; /* 0: free */
static unsigned killed_next;

static int failure_signal(int sig)
{
    return sig > 0 && sig < 64 && ((DMTCP_FAILURE_SIGNALS >> sig) & 1);
}

/* "/proc/" (or any prefix), the number, the suffix; raw, no stdio. */
static void proc_path(char *path, const char *prefix, long num, const char *suffix)
{
    char digits[24];
    int len = 0;
    size_t at = strlen(prefix);

    memcpy(path, prefix, at);
    do
        digits[len++] = (char)('0' + num % 10);
    while ((num /= 10) > 0);
    while (len > 0)
        path[at++] = digits[--len];
    memcpy(path + at, suffix, strlen(suffix) + 1);
}

/* Whether pid runs and is not in its exit, from /proc/PID/stat ("pid
 * (comm) S ppid pgrp session tty tpgid flags ..."); raw system calls. */
static int running(pid_t pid)
{
    char path[48], buf[1024], *p;
    int field;
    long id = proc_id_of(pid);
    unsigned long flags = 0;

    if (id < 0) /* (the id /proc knows it by: the tree may have a PID namespace) */
        return 0;
    proc_path(path, "/proc/", id, "/stat");
    if (proc_read(path, buf, sizeof(buf)) <= 0)
        return 0;
    p = strrchr(buf, ')'); /* comm may hold anything */
    if (p == NULL || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X' || p[2] == 'x')
        return 0;
    for (field = 3, p += 2; field < 9; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return 0;
        p++;
    }
    while (*p >= '0' && *p <= '9')
        flags = flags * 10 + (unsigned long)(*p++ - '0');
    return !(flags & PF_EXITING);
}

/* Before this process sends sig to target (a pid, or -group: its leader). */
static void remember_kill(pid_t target, int sig)
{
    int saved = errno;
    pid_t pid = target > 0 ? target : -target;
    unsigned slot;

    /* (itself: never a child; and the checkpoint thread ends its process
     * so, holding the gate when it is suspended) */
    if (target == 0 || target == -1 || !failure_signal(sig) || pid == (pid_t)syscall(SYS_getpid))
        return;
    gate_enter(); /* no dump meets the /proc file open */
    if (running(pid)) {
        slot = __atomic_fetch_add(&killed_next, 1, __ATOMIC_RELAXED) % KILLED_KEPT;
        __atomic_store_n(&killed_here[slot], pid, __ATOMIC_RELEASE);
    }
    gate_leave();
    errno = saved;
}

/* Whether this process killed pid itself (forgotten once asked). */
static int killed_by_us(pid_t pid)
{
    for (int i = 0; i < KILLED_KEPT; i++) {
        pid_t seen = pid;

        if (__atomic_compare_exchange_n(&killed_here[i], &seen, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

SHIM_EXPORT int kill(pid_t pid, int sig)
{
    remember_kill(pid, sig);
    return real_kill(pid, sig);
}

SHIM_EXPORT int killpg(pid_t group, int sig)
{
    remember_kill(group > 0 ? -group : group, sig);
    return real_killpg(group, sig);
}

static void tell_killed(pid_t pid, int sig, int core)
{
    int saved = errno;
    uint64_t arg;

    if (pid <= 0 || sig <= 0 || sig >= 64)
        return;
    if (!core && !failure_signal(sig))
        return;
    if (killed_by_us(pid))
        return;
    arg = (uint64_t)(uint32_t)pid | (uint64_t)(sig & 0xFF) << DMTCP_KILLED_SIGNAL_SHIFT
          | (core ? DMTCP_KILLED_CORE : 0);
    gate_enter();
    channel_tell(DMTCP_REC_CHILD_KILLED, arg);
    gate_leave();
    errno = saved;
}

/* After wait, waitpid, wait3, wait4: what they returned, and where the
 * status went (read only when a child's status is there). */
static void child_ended(pid_t pid, const int *status)
{
    if (pid > 0 && WIFSIGNALED(*status))
        tell_killed(pid, WTERMSIG(*status), WCOREDUMP(*status) != 0);
}

SHIM_EXPORT pid_t wait(int *status)
{
    int own = 0, *st = status ? status : &own;
    pid_t pid = real_wait(st);

    child_ended(pid, st);
    return pid;
}

SHIM_EXPORT pid_t waitpid(pid_t which, int *status, int options)
{
    int own = 0, *st = status ? status : &own;
    pid_t pid = real_waitpid(which, st, options);

    child_ended(pid, st);
    return pid;
}

SHIM_EXPORT pid_t wait3(int *status, int options, struct rusage *usage)
{
    int own = 0, *st = status ? status : &own;
    pid_t pid = real_wait3(st, options, usage);

    child_ended(pid, st);
    return pid;
}

SHIM_EXPORT pid_t wait4(pid_t which, int *status, int options, struct rusage *usage)
{
    int own = 0, *st = status ? status : &own;
    pid_t pid = real_wait4(which, st, options, usage);

    child_ended(pid, st);
    return pid;
}

SHIM_EXPORT int waitid(idtype_t type, id_t id, siginfo_t *info, int options)
{
    siginfo_t own;
    siginfo_t *si = info ? info : &own;
    int r;

    if (!info)
        own.si_pid = 0; /* WNOHANG with nothing ended may leave it as it was */
    r = real_waitid(type, id, si, options);
    if (r == 0 && !(options & WNOWAIT) && si->si_pid > 0
        && (si->si_code == CLD_KILLED || si->si_code == CLD_DUMPED))
        tell_killed(si->si_pid, si->si_status, si->si_code == CLD_DUMPED);
    return r;
}
