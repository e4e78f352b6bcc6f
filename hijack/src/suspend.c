/*
 * Stopping every other thread of the process, and letting them go.
 *
 * The checkpoint thread takes the gate for writing (so no thread is being
 * created and no fork is under way), then sends the reserved signal to each
 * thread listed in /proc/self/task (by its id in this process's PID
 * namespace, which need not be /proc's: see nspid).  The handler counts itself in and
 * sleeps on a futex until the resume generation changes.  New threads
 * cannot appear while the gate is held, but a raw clone() could: the task
 * list is read again until every thread listed has stopped.
 *
 * Everything the checkpoint thread does here is a raw system call on static
 * memory: the stopped threads may hold malloc's or stdio's locks.
 *
 * Some calls fail with EINTR after any handler, SA_RESTART or not (sleeps,
 * poll and friends, pause, sigsuspend, sigtimedwait...).  The handler
 * counts, per thread, the calls it interrupted that way, so that the
 * wrappers in wrap_wait.c can tell our signal from the program's and call
 * again (see there).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "shim.h"

#define MAX_THREADS 8192
#define STOP_PATIENCE_MS 3000 /* a thread that will not stop in this time is reported */

static int sigckpt;
/* the link's hooks (ckpt_thread.c, which drives this unit: passed at
 * suspend_init, not called by name): a signal for it, and the gate let go
 * by a thread that had to leave it work */
static void (*link_signal)(const siginfo_t *info);
static void (*link_gate_left)(void);
static int requested;     /* 1 while a suspension is wanted */
static int resume_gen;    /* futex word the stopped threads sleep on */
static int stopped;       /* threads inside the handler */
static int suspended;     /* the checkpoint thread's view */
static pthread_rwlock_t gate SHIM_HOT_DATA = PTHREAD_RWLOCK_INITIALIZER;
static pid_t signalled[MAX_THREADS];
static int n_signalled;

/* Calls this thread had fail with EINTR; read only by the same thread.
 * initial-exec: no TLS allocation in the handler (the shim is preloaded). */
static __thread unsigned interruptions __attribute__((tls_model("initial-exec")));
/* How many times this thread holds the gate (the link must not suspend
 * the process from a signal that interrupted it there). */
static __thread int gate_depth __attribute__((tls_model("initial-exec")));

static long futex(int *word, int op, int val, const struct timespec *timeout)
{
    return syscall(SYS_futex, word, op, val, timeout, NULL, 0);
}

int suspend_signal(void)
{
    return sigckpt;
}

int suspend_active(void)
{
    return suspended;
}

unsigned suspend_interruptions(void)
{
    return __atomic_load_n(&interruptions, __ATOMIC_RELAXED);
}

/*
 * Did this signal make a system call fail with EINTR?  The kernel has put
 * the call's result in the saved registers before it built the handler's
 * frame.  Elsewhere than on x86-64: assume it did.
 */
static int interrupted_a_call(const ucontext_t *uc)
{
#if defined(__x86_64__)
    return uc->uc_mcontext.gregs[REG_RAX] == -EINTR;
#else
    (void)uc;
    return 1;
#endif
}

/*
 * Will a handler of the program run as soon as this one returns (a signal
 * that came while the thread was stopped, with all signals blocked)?  Then
 * that signal has as good a claim to the EINTR as ours, and the program
 * gets it: a retry would lose its wake-up.  When in doubt, say yes.
 */
static int program_handler_due(const ucontext_t *uc)
{
    sigset_t pending;

    if (sigpending(&pending) < 0)
        return 1;
    for (int s = 1; s < NSIG; s++) {
        struct sigaction sa;

        if (s == sigckpt || !sigismember(&pending, s) || sigismember(&uc->uc_sigmask, s))
            continue;
        if (real_sigaction(s, NULL, &sa) < 0)
            return 1;
        if (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN)
            return 1;
    }
    return 0;
}

static void handler(int sig, siginfo_t *info, void *ctx)
{
    int saved_errno = errno;
    int gen = __atomic_load_n(&resume_gen, __ATOMIC_ACQUIRE);

    (void)sig;
    if (__atomic_load_n(&requested, __ATOMIC_ACQUIRE)) {
        __atomic_add_fetch(&stopped, 1, __ATOMIC_ACQ_REL);
        futex(&stopped, FUTEX_WAKE_PRIVATE, 1, NULL);
        while (__atomic_load_n(&resume_gen, __ATOMIC_ACQUIRE) == gen)
            futex(&resume_gen, FUTEX_WAIT_PRIVATE, gen, NULL);
        __atomic_sub_fetch(&stopped, 1, __ATOMIC_ACQ_REL);
    }
    if (link_signal)
        link_signal(info); /* the agent's wake-up, or its writes */
    if (interrupted_a_call(ctx) && !program_handler_due(ctx))
        __atomic_add_fetch(&interruptions, 1, __ATOMIC_RELAXED);
    errno = saved_errno;
}

void suspend_init(void (*on_signal)(const siginfo_t *info), void (*after_gate)(void))
{
    struct sigaction sa;
    const char *env = getenv(DMTCP_ENV_SIGCKPT);
    sigset_t mine;

    link_signal = on_signal;
    link_gate_left = after_gate;
    sigckpt = env && atoi(env) > 0 && atoi(env) < NSIG ? atoi(env) : SIGRTMAX - 2;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    /* while stopped, no other handler of the program runs in this thread */
    sigfillset(&sa.sa_mask);
    real_sigaction(sigckpt, &sa, NULL);
    /* posix_spawn or the parent may have left it blocked */
    sigemptyset(&mine);
    sigaddset(&mine, sigckpt);
    real_sigprocmask(SIG_UNBLOCK, &mine, NULL);
}

static int was_signalled(pid_t tid)
{
    for (int i = 0; i < n_signalled; i++)
        if (signalled[i] == tid)
            return 1;
    return 0;
}

/*
 * The tree may run in a PID namespace of its own while /proc is the
 * host's: /proc/self/task then names the threads by the host's ids, but
 * gettid() and tgkill() use this namespace's.  The NSpid line of a
 * thread's status lists its id in each namespace from /proc's down to its
 * own: the last one is ours.  Returns how many it lists (0: the thread is
 * gone, or no NSpid line), and the last in *own.  Checkpoint thread only
 * (a static buffer: stdio and malloc are off limits here).
 */
static int nspid(const char *path, pid_t *own)
{
    static char buf[4096];
    int fields = 0;
    char *p;

    if (proc_read(path, buf, sizeof(buf)) <= 0)
        return 0;
    p = strstr(buf, "\nNSpid:");
    if (p == NULL)
        return 0;
    for (p += 7; *p != '\n' && *p != '\0';) {
        pid_t id = 0;

        while (*p == ' ' || *p == '\t')
            p++;
        if (*p < '0' || *p > '9')
            break;
        while (*p >= '0' && *p <= '9')
            id = id * 10 + (*p++ - '0');
        *own = id;
        fields++;
    }
    return fields;
}

/* Whether /proc names this process's threads by other ids than its own. */
static int ids_differ(void)
{
    pid_t own;

    return nspid("/proc/thread-self/status", &own) > 1;
}

/* Our id of the thread /proc calls proc_tid (-1: gone meanwhile). */
static pid_t own_tid(int proc_tid)
{
    char path[48] = "/proc/self/task/", digits[16];
    int len = 0, at = 16;
    pid_t own = -1;

    do
        digits[len++] = (char)('0' + proc_tid % 10);
    while ((proc_tid /= 10) > 0);
    while (len > 0)
        path[at++] = digits[--len];
    memcpy(path + at, "/status", 8);
    return nspid(path, &own) > 0 ? own : -1;
}

struct scan {
    pid_t self, pid;
    int others, translate;
};

static void signal_one(int tid, void *ctx)
{
    struct scan *scan = ctx;

    if (scan->translate && (tid = own_tid(tid)) < 0)
        return; /* ended meanwhile */
    if (tid == scan->self)
        return;
    scan->others++;
    if (!was_signalled(tid) && n_signalled < MAX_THREADS) {
        signalled[n_signalled++] = tid;
        syscall(SYS_tgkill, scan->pid, tid, sigckpt);
    }
}

static void count_one(int tid, void *ctx)
{
    (void)tid;
    (*(int *)ctx)++;
}

/* Signal the threads not yet signalled; return how many threads exist
 * besides this one. */
static int signal_new_threads(void)
{
    struct scan scan = { (pid_t)syscall(SYS_gettid), (pid_t)syscall(SYS_getpid), 0, 0 };
    int tasks = 0;

    /* one task: this thread, with no ids to translate (the status files
     * read for that cost most of a single-threaded process's suspend) */
    if (procdir_each("/proc/self/task", count_one, &tasks) < 0)
        return -1;
    if (tasks == 1)
        return 0;
    scan.translate = ids_differ();
    if (procdir_each("/proc/self/task", signal_one, &scan) < 0)
        return -1;
    return scan.others;
}

int suspend_all(void)
{
    struct timespec step = { 0, 1000000 }; /* 1 ms */
    int waited = 0, others = 0;

    if (suspended)
        return 0;
    pthread_rwlock_wrlock(&gate);
    n_signalled = 0;
    __atomic_store_n(&requested, 1, __ATOMIC_RELEASE);
    for (;;) {
        int now = __atomic_load_n(&stopped, __ATOMIC_ACQUIRE);

        others = signal_new_threads();
        if (others < 0 || now >= others || waited >= STOP_PATIENCE_MS)
            break;
        futex(&stopped, FUTEX_WAIT_PRIVATE, now, &step);
        waited++;
    }
    suspended = 1;
    return others > 0 && __atomic_load_n(&stopped, __ATOMIC_ACQUIRE) < others
               ? others - __atomic_load_n(&stopped, __ATOMIC_ACQUIRE) : 0;
}

void resume_all(void)
{
    if (!suspended)
        return;
    __atomic_store_n(&requested, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&resume_gen, 1, __ATOMIC_ACQ_REL);
    futex(&resume_gen, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL);
    suspended = 0;
    pthread_rwlock_unlock(&gate);
}

void gate_enter(void)
{
    pthread_rwlock_rdlock(&gate);
    gate_depth++;
}

void gate_leave(void)
{
    pthread_rwlock_unlock(&gate);
    if (--gate_depth == 0 && link_gate_left)
        link_gate_left();
}

int gate_held(void)
{
    return gate_depth > 0;
}

/* The child of a fork has one thread, which held the gate for reading. */
void gate_after_fork_child(void)
{
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;

    gate = fresh;
    gate_depth = 0;
    /* (written only when set: an untouched page costs the child nothing) */
    if (suspended)
        suspended = 0;
    if (__atomic_load_n(&requested, __ATOMIC_ACQUIRE))
        __atomic_store_n(&requested, 0, __ATOMIC_RELEASE);
    if (__atomic_load_n(&stopped, __ATOMIC_ACQUIRE))
        __atomic_store_n(&stopped, 0, __ATOMIC_RELEASE);
}
