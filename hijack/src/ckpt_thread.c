/*
 * The link to the agent: served from the reserved signal in a process
 * that has no checkpoint thread (see link_on_signal), or by a checkpoint
 * thread.  Either connects to the agent, says hello,
 * and obeys.  On CHECKPOINT it answers READY, drops the connection and
 * polls the agent's socket until it can connect again: after the dump when
 * the process keeps running, or after CRIU restored it, possibly on another
 * host, where the new agent listens on the same abstract name.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

static int shim_enabled;
/*
 * The first connection's socket, made before the program goes on (in the
 * constructor, in a fork child's handler): socket() reserves the lowest
 * free fd number for a moment, and a program thread's dup2() onto that
 * number meanwhile fails with EBUSY (MPICH's mpiexec, dup2'ing a pipe onto
 * 1 in its child, did).  Later connections are made while the program is
 * suspended, or after a failure.
 */
static int first_fd = -1;

/*
 * Held while the connection is being made or dropped, and across fork()
 * (atfork prepare/parent).  Without it, a fork between socket() and
 * channel_set_agent_fd() gives the child an unknown copy of the parent's
 * connection: the agent then never sees that connection close.  Never held
 * while the process is suspended for a checkpoint.
 */
static pthread_mutex_t conn_lock SHIM_HOT_DATA = PTHREAD_MUTEX_INITIALIZER;

/* A process left suspended by a checkpoint whose agent never comes back
 * must not stay frozen for ever: after this much time spent running and
 * retrying, it lets its threads go. */
#define ORPHANED_SUSPEND_MS 30000

/* FATE 1 from the agent: the coordinator restarts lost trees, so a process
 * whose agent went away ends instead of running on beside its restored
 * copy.  agent_lost: the connection broke outside a checkpoint (a
 * checkpoint's reconnect loop is no loss: the agent is dumping us). */
static volatile int die_with_agent;
static int agent_lost;

/*
 * CHECKPOINT's arg: nonzero when the agent lets this process run again as
 * soon as CRIU has let it go, without waiting for the round's RESUME (a
 * tree alone in its round, with no socket to give back: nobody to wait
 * for, nothing to refill).  Its agent then listens, from the dump's end,
 * at an address of that round's own (dmtcp_agent_release_addr): reaching
 * it proves that this is the same process after the same dump.  A
 * restored process has the token in its memory too, but its new agent
 * never listens there: it connects as usual and waits for the release.
 * released_early: this connection was made there (say_hello releases).
 */
static uint32_t release_token;
static int released_early;

static void end_orphaned_process(void)
{
    kill(getpid(), SIGKILL);
}

static void release_threads(void)
{
    mqueue_resume();
    fdowner_restore();
    inotify_resume();
    timers_resume();
    resume_all();
}

/* After a stop longer than the sleep asked for (CRIU froze the process
 * for its dump, or it was just restored), the agent listens again within
 * milliseconds: retry every millisecond for this long.  The backoff alone
 * left the agent waiting up to its 20 ms step for each process, with the
 * program still stopped (the largest part of a small checkpoint's stop
 * beyond CRIU's own frozen time). */
#define FAST_AFTER_STOP_MS 200
#define STOPPED_SLACK_MS 5

/* After CHECKPOINT the agent listens again only once CRIU has dumped the
 * process, and CRIU's freeze cuts a sleep short (nap_ms): so the first
 * sleep is long and no connection is tried before it.  Trying every
 * millisecond or two, the processes that had detached took the CPU from
 * those still detaching and from the agent, while the program waited for
 * all of them (two cores here).  A dump that fails before CRIU froze the
 * tree lets its processes come back up to this much later. */
#define DUMP_NAP_MS 50
static int dump_coming; /* CHECKPOINT came: the next connection follows a dump */

static long monotonic_ms(void)
{
    struct timespec ts;

    if (syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (long)ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* The reconnect loop's sleeps: how long the next one is, how long they
 * took in all, and how much longer to retry fast. */
struct backoff {
    long step, waited, fast;
};

/* One sleep of the reconnect loop; sets the length of the next. */
static void backoff_nap(struct backoff *b)
{
    long before = monotonic_ms(), slept;

    nap_ms(b->step); /* (back from a dump: at once) */
    slept = monotonic_ms() - before;
    b->waited += b->step;
    /* stopped meanwhile, or cut short: a dump or a restore.  (A clock
     * gone back: restored on another host or boot.)  No signal of the
     * program's cuts it: the thread that serves blocks them all */
    if (slept < 0 || slept > b->step + STOPPED_SLACK_MS || slept + 1 < b->step)
        b->fast = FAST_AFTER_STOP_MS;
    if (b->fast > 0) {
        b->fast -= b->step;
        b->step = 1;
        return;
    }
    /* fast while a dump or restore is likely to be finishing, then
     * gently: an agent that is gone for good costs little */
    b->step = b->waited < 10000 ? (b->step * 2 > 20 ? 20 : b->step * 2) : 200;
}

/* Connect, retrying while the agent dumps or restores us; the fd.
 * give_up: after releasing an orphaned suspension, return -1 (a program
 * thread serving from a signal goes back to the program then). */
static int connect_with_backoff(int give_up)
{
    struct backoff b = { 1, 0, 0 };
    int fd;

    if (dump_coming) { /* nobody listens before the dump: no try before it */
        dump_coming = 0;
        b.step = DUMP_NAP_MS;
        backoff_nap(&b);
    }
    for (;;) {
        if (suspend_active() && b.waited >= ORPHANED_SUSPEND_MS) {
            release_threads();
            if (give_up)
                return -1;
        }
        if (agent_lost && die_with_agent && b.waited >= DMTCP_FATE_GRACE_MS)
            end_orphaned_process();
        pthread_mutex_lock(&conn_lock);
        if (first_fd >= 0) {
            fd = channel_connect_fd(first_fd);
            first_fd = -1;
        } else if (release_token != 0 && (fd = channel_connect_release(release_token)) >= 0) {
            released_early = 1;
        } else {
            fd = channel_connect();
        }
        if (fd >= 0) {
            release_token = 0; /* (spent: the next dump brings its own) */
            channel_set_agent_fd(fd);
        }
        pthread_mutex_unlock(&conn_lock);
        if (fd >= 0) {
            agent_lost = 0;
            return fd;
        }
        backoff_nap(&b);
    }
}

/* What one record from the agent left the link in. */
enum outcome {
    GO_ON,    /* served; the connection goes on */
    DETACHED, /* CHECKPOINT: answered and closed, the dump comes */
    LOST,     /* the agent is gone, or spoke nonsense */
};

/* Obey one record (its socket, if one rode on it, in passed). */
static enum outcome obey(int fd, const struct dmtcp_record *rec, int passed)
{
    static int32_t fds[DMTCP_PARK_MAX];

    if (passed >= 0 && rec->type != DMTCP_REC_UNPARK_FD) {
        channel_close(passed);
        passed = -1;
    }
    switch (rec->type) {
    case DMTCP_REC_SUSPEND: {
        int stuck;

        api_before_checkpoint(); /* hooks, critical sections: threads still run */
        fdowner_save();
        stuck = suspend_all();
        timers_save();
        inotify_save();
        return channel_send(fd, DMTCP_REC_SUSPENDED, (uint64_t)stuck) < 0 ? LOST : GO_ON;
    }
    case DMTCP_REC_ELECT:
        fdowner_elect();
        return channel_send(fd, DMTCP_REC_ELECTED, 0) < 0 ? LOST : GO_ON;
    case DMTCP_REC_PARK: {
        int n = rec->arg > DMTCP_PARK_MAX ? -1 : (int)rec->arg;

        if (n < 0 || channel_recv_payload(fd, fds, (size_t)n * sizeof(fds[0])) < 0)
            return LOST;
        n = park_sockets(fd, fds, n);
        return n < 0 || channel_send(fd, DMTCP_REC_PARKED, (uint64_t)n) < 0 ? LOST : GO_ON;
    }
    case DMTCP_REC_UNPARK_FD:
        if (passed >= 0)
            park_take_back((int)(uint32_t)rec->arg, passed);
        return GO_ON;
    case DMTCP_REC_UNPARK:
        return channel_send(fd, DMTCP_REC_UNPARKED, (uint64_t)park_finish()) < 0 ? LOST : GO_ON;
    case DMTCP_REC_CHECKPOINT: {
        int queues;

        /* stay suspended: the agent dumps us, then we come back */
        release_token = (uint32_t)rec->arg;
        dump_coming = 1;
        released_early = 0;
        queues = mqueue_detach(); /* CRIU cannot dump a POSIX message queue */
        inotify_keep_queued(); /* nor the events queued on an inotify instance */
        channel_send(fd, DMTCP_REC_READY, (uint64_t)queues);
        pthread_mutex_lock(&conn_lock);
        channel_set_agent_fd(-1);
        channel_close(fd);
        pthread_mutex_unlock(&conn_lock);
        return DETACHED;
    }
    case DMTCP_REC_RESUME:
        if (suspend_active()) /* (not if released at the dump's end) */
            release_threads();
        if (channel_send(fd, DMTCP_REC_RESUMED, 0) < 0)
            return LOST;
        api_after_resume(rec->arg); /* hooks run with the threads going */
        return GO_ON;
    case DMTCP_REC_TRACK: {
        int made = tracker_make(), sent;

        if (made < 0)
            return channel_send(fd, DMTCP_REC_TRACKER, (uint64_t)-made) < 0 ? LOST : GO_ON;
        sent = channel_send_fd(fd, DMTCP_REC_TRACKER, 0, made);
        channel_close(made); /* the agent's copy is the one */
        return sent < 0 ? LOST : GO_ON;
    }
    case DMTCP_REC_DONE:
        api_generation_done(rec->arg);
        return GO_ON;
    case DMTCP_REC_FATE:
        die_with_agent = rec->arg == 1;
        return GO_ON;
    default:
        return GO_ON; /* newer agent: ignore what we do not know */
    }
}

/* The first record on a (re)made connection.  Back after a dump or a
 * restore: the queues first, so that the agent counts this process back
 * only once they are. */
static int say_hello(int fd)
{
    uint64_t link = (uint64_t)(fd + 1) << DMTCP_HELLO_FD_SHIFT;

    if (suspend_active())
        mqueue_reattach();
    if (released_early) {
        released_early = 0;
        if (suspend_active()) {
            release_threads(); /* the round's RESUME still comes, for the hooks */
            return channel_send(fd, DMTCP_REC_HELLO, DMTCP_HELLO_RELEASED | link);
        }
    }
    return channel_send(fd, DMTCP_REC_HELLO, (uint64_t)suspend_active() | link);
}

/* The agent is gone in the middle: never leave the program stopped. */
static void drop_lost(int fd)
{
    agent_lost = 1;
    release_threads();
    pthread_mutex_lock(&conn_lock);
    channel_set_agent_fd(-1);
    channel_close(fd);
    pthread_mutex_unlock(&conn_lock);
}

/* Serve one connection on the checkpoint thread; returns when it is over.
 * hello: 0 for a connection that said it already (taken over). */
static void serve(int fd, int hello)
{
    struct dmtcp_record rec;
    int passed;

    if (hello && say_hello(fd) < 0) {
        drop_lost(fd);
        return;
    }
    for (;;) {
        enum outcome got = LOST;

        if (channel_recv_fd(fd, &rec, &passed) > 0)
            got = obey(fd, &rec, passed);
        if (got == DETACHED)
            return;
        if (got == LOST) {
            drop_lost(fd);
            return;
        }
    }
}

/*
 * The link served from the reserved signal, for a process with no
 * checkpoint thread (the default: most processes of a tree never see a
 * checkpoint, and a thread made at every start and fork cost a fork+exec
 * loop most of its time).  The agent wakes such a process with the
 * reserved signal, sent to its main thread (tgkill: SI_TKILL from another
 * process); the handler connects and says hello, and the connection then
 * signals the thread that serves it whenever the agent writes (O_ASYNC,
 * F_SETSIG: the same signal; F_OWNER_TID).  The handler serves what came;
 * from SUSPEND until the round is over it stays in the handler, serving,
 * exactly as the checkpoint thread would, while the other threads are
 * stopped: raw system calls only, on static memory.
 *
 * Each of these signals goes to one thread, never to the whole process.
 * A process-directed signal wakes the thread the kernel picks for it, and
 * another thread may take it first: the woken thread then finds no
 * signal to handle, and an epoll_wait it was in fails with EINTR (epoll
 * returns EINTR itself, where poll or select would be restarted), with no
 * handler run that wrap_wait.c could count (seen: res_waits, about once
 * in thirty launches checkpointed at once).  The thread that serves takes
 * the notifications over (it is alive: it is serving); if the one that
 * had them ended meanwhile, an unanswered request makes the agent wake the
 * main thread again (shimlink.py).
 *
 * One thread serves at a time (serving); a signal that finds another one
 * serving leaves it the work, and that one looks again before it stops.
 * A thread interrupted while it holds the gate (in fork, pthread_create)
 * cannot suspend the process: it leaves the work owed, and serves when it
 * lets the gate go (link_after_gate).  A vfork child shares its parent's
 * memory: it never serves (the agent wakes it again after its exec).
 *
 * A process that uses the API (hooks, critical sections, its own
 * checkpoint request) gets a real checkpoint thread at that call, which
 * takes the link over: hooks must not run inside a signal handler.
 */
enum { LINK_SIGNAL, LINK_THREAD };
static int link_mode = LINK_SIGNAL;
static int serving;   /* 1 while a thread serves the link */
static int wake_owed; /* the agent asked this process to connect */
static int link_owed; /* a signal came to a thread that held the gate */
static pid_t own_pid SHIM_HOT_DATA; /* getpid() at start or fork: a vfork child differs */
static pid_t notified; /* the thread the connection's notifications go to */
static int thread_started;

static int readable(int fd)
{
    struct pollfd p = { fd, POLLIN, 0 };
    struct timespec none = { 0, 0 };

    return syscall(SYS_ppoll, &p, 1, &none, NULL, sizeof(sigset_t)) > 0;
}

/* The agent's writes signal this thread (see above: never the process). */
static void notify_this_thread(int fd)
{
    pid_t tid = (pid_t)syscall(SYS_gettid);
    struct f_owner_ex owner = { F_OWNER_TID, tid };

    if (tid != notified && syscall(SYS_fcntl, fd, F_SETOWN_EX, &owner) == 0)
        notified = tid;
}

static void make_async(int fd)
{
    long flags;

    notified = 0;
    notify_this_thread(fd);
    syscall(SYS_fcntl, fd, F_SETSIG, suspend_signal());
    flags = syscall(SYS_fcntl, fd, F_GETFL);
    if (flags >= 0)
        syscall(SYS_fcntl, fd, F_SETFL, flags | O_ASYNC);
}

/* Connect and say hello, outside a round: the fd, or -1. */
static int connect_now(void)
{
    int fd;

    pthread_mutex_lock(&conn_lock);
    fd = channel_connect();
    if (fd >= 0) {
        make_async(fd);
        channel_set_agent_fd(fd);
    }
    pthread_mutex_unlock(&conn_lock);
    if (fd >= 0 && say_hello(fd) < 0) {
        drop_lost(fd);
        return -1;
    }
    return fd;
}

/* Back after a dump, or the agent back after a loss (connect_with_backoff
 * ends the process if it was told to and none comes). */
static int reconnect(void)
{
    int fd = connect_with_backoff(1);

    if (fd < 0)
        return -1;
    make_async(fd);
    if (say_hello(fd) < 0) {
        drop_lost(fd);
        return -1;
    }
    return fd;
}

/* With the serving token: connect if asked, then obey what the agent
 * wrote; in a round, until it is over. */
static void serve_by_signal(void)
{
    struct dmtcp_record rec;
    int fd = channel_agent_fd(), passed;

    if (fd < 0) {
        if (!__atomic_exchange_n(&wake_owed, 0, __ATOMIC_ACQ_REL))
            return;
        fd = connect_now();
        if (fd < 0)
            return; /* not listening (a dump): the agent asks again */
    }
    notify_this_thread(fd);
    for (;;) {
        enum outcome got = LOST;

        if (!suspend_active() && !readable(fd))
            return;
        if (channel_recv_fd(fd, &rec, &passed) > 0)
            got = obey(fd, &rec, passed);
        if (got == DETACHED && (fd = reconnect()) >= 0)
            continue;
        if (got == LOST) {
            drop_lost(fd);
            if (!die_with_agent)
                return; /* unconnected until an agent wakes it again */
            fd = reconnect();
        }
        if (fd < 0)
            return;
    }
}

static int work_waiting(void)
{
    int fd = channel_agent_fd();

    return fd >= 0 ? readable(fd) : __atomic_load_n(&wake_owed, __ATOMIC_ACQUIRE);
}

/* From the reserved signal's handler (suspend.c), all signals blocked,
 * once the thread is not (or no longer) to stop.  The agent's wake-up is
 * the signal sent from another process (si_pid 0 when the agent is
 * outside the tree's PID namespace); this process's own are the stops of
 * suspend.c and the link's re-sends to itself. */
static void link_on_signal(const siginfo_t *info)
{
    if (!shim_enabled || __atomic_load_n(&link_mode, __ATOMIC_ACQUIRE) != LINK_SIGNAL)
        return;
    if ((pid_t)syscall(SYS_getpid) != own_pid)
        return;
    if ((info->si_code == SI_USER || info->si_code == SI_TKILL) && info->si_pid != own_pid)
        __atomic_store_n(&wake_owed, 1, __ATOMIC_RELEASE);
    if (gate_held()) {
        __atomic_store_n(&link_owed, 1, __ATOMIC_RELEASE);
        return;
    }
    do {
        if (__atomic_exchange_n(&serving, 1, __ATOMIC_ACQ_REL))
            return; /* the one serving looks again before it stops */
        if (__atomic_load_n(&link_mode, __ATOMIC_ACQUIRE) == LINK_SIGNAL)
            serve_by_signal();
        __atomic_store_n(&serving, 0, __ATOMIC_RELEASE);
    } while (__atomic_load_n(&link_mode, __ATOMIC_ACQUIRE) == LINK_SIGNAL && work_waiting());
}

/* This thread let the gate go: serve what came meanwhile. */
static void link_after_gate(void)
{
    if (__atomic_load_n(&link_owed, __ATOMIC_ACQUIRE)
        && __atomic_exchange_n(&link_owed, 0, __ATOMIC_ACQ_REL))
        syscall(SYS_tgkill, own_pid, (pid_t)syscall(SYS_gettid), suspend_signal());
}

static int link_dies_with_agent(void)
{
    return die_with_agent;
}

static void *ckpt_thread_main(void *unused)
{
    sigset_t all;
    int fd;

    (void)unused;
    /* the program's signals are for the program's threads */
    sigfillset(&all);
    real_pthread_sigmask(SIG_BLOCK, &all, NULL); /* the wrapper would keep one */
    prctl(PR_SET_NAME, "dmtcp_ckpt", 0, 0, 0);
    /* take the link over from the signal handlers, between two rounds */
    while (__atomic_exchange_n(&serving, 1, __ATOMIC_ACQ_REL))
        pause_ms(1);
    __atomic_store_n(&link_mode, LINK_THREAD, __ATOMIC_RELEASE);
    __atomic_store_n(&serving, 0, __ATOMIC_RELEASE);
    fd = channel_agent_fd();
    if (fd >= 0) {
        long flags = syscall(SYS_fcntl, fd, F_GETFL);

        if (flags >= 0)
            syscall(SYS_fcntl, fd, F_SETFL, flags & ~O_ASYNC);
        serve(fd, 0);
    }
    for (;;)
        serve(connect_with_backoff(0), 1);
    return NULL;
}

static void ckpt_thread_start(void)
{
    pthread_t tid;
    pthread_attr_t attr;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    real_pthread_create(&tid, &attr, ckpt_thread_main, NULL);
    pthread_attr_destroy(&attr);
}

/* The program uses the API: from now on a thread of our own serves the
 * link (made at this call, from the program's own code: never from a
 * signal handler). */
static void ckpt_thread_ensure(void)
{
    if (!shim_enabled || __atomic_exchange_n(&thread_started, 1, __ATOMIC_ACQ_REL))
        return;
    gate_enter(); /* not while the process is suspended */
    pthread_mutex_lock(&conn_lock);
    if (first_fd < 0)
        first_fd = channel_socket(); /* (see first_fd) */
    pthread_mutex_unlock(&conn_lock);
    ckpt_thread_start();
    gate_leave();
}

/* Connect from the program's own code (start-up, a fork child), holding
 * the serving token so that a signal meanwhile does not serve on top of
 * it; what came meanwhile is served by a signal to this thread after. */
static void connect_eagerly(void)
{
    if (__atomic_exchange_n(&serving, 1, __ATOMIC_ACQ_REL))
        return;
    if (channel_agent_fd() < 0)
        connect_now();
    __atomic_store_n(&serving, 0, __ATOMIC_RELEASE);
    if (work_waiting())
        syscall(SYS_tgkill, own_pid, (pid_t)syscall(SYS_gettid), suspend_signal());
}

/* fork waits while the process is suspended (the gate), and never copies
 * a half-made agent connection (conn_lock); always in this order. */
static void atfork_prepare(void)
{
    gate_enter();
    pthread_mutex_lock(&conn_lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&conn_lock);
    gate_leave();
}

/* In a forked child only the forking thread exists, and the parent's
 * connection is a copy that belongs to the parent: drop it.  The child
 * connects when the agent wakes it, or at once if it is to die with its
 * agent (it must hear the agent go); a child of a process with a
 * checkpoint thread gets one of its own. */
static void atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;

    conn_lock = fresh; /* held by this thread, the only one: as unlocked */
    gate_after_fork_child();
    channel_after_fork_child();
    inotify_after_fork_child();
    if (!shim_enabled)
        return;
    if (channel_agent_fd() >= 0) {
        channel_close(channel_agent_fd());
        channel_set_agent_fd(-1);
    }
    own_pid = getpid(); /* (not syscall(): its page of libc would fault in every child) */
    if (serving | wake_owed | link_owed | notified) /* (an untouched page costs nothing) */
        serving = wake_owed = link_owed = notified = 0;
    if (link_mode == LINK_THREAD) {
        link_mode = LINK_SIGNAL; /* until the thread takes over */
        first_fd = channel_socket();
        ckpt_thread_start();
    } else if (die_with_agent) {
        connect_eagerly();
    }
}

__attribute__((constructor)) static void dmtcp_shim_init(void)
{
    const char *fate = getenv(DMTCP_ENV_FATE);

    if (channel_set_address(getenv(DMTCP_ENV_AGENT_SOCK)) < 0)
        return; /* not launched under an agent: stay inert */
    own_pid = (pid_t)syscall(SYS_getpid);
    shim_enabled = 1;
    api_init(ckpt_thread_ensure);
    exec_env_capture(link_dies_with_agent);
    suspend_init(link_on_signal, link_after_gate);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    /* no thread, no connection: the agent wakes us when it needs us, but
     * a process that is to die with its agent must hear it go */
    if (fate && fate[0] == '1') {
        die_with_agent = 1;
        connect_eagerly();
    }
}
