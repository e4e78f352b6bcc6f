/*
 * One checkpoint thread per process.  It connects to the agent, says hello,
 * and obeys.  On CHECKPOINT it answers READY, drops the connection and
 * polls the agent's socket until it can connect again: after the dump when
 * the process keeps running, or after CRIU restored it, possibly on another
 * host, where the new agent listens on the same abstract name.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
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
static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;

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

static void end_orphaned_process(void)
{
    kill(getpid(), SIGKILL);
}

static void release_threads(void)
{
    mqueue_resume();
    fdowner_restore();
    resume_all();
}

static int connect_with_backoff(void)
{
    long waited = 0, step = 1;
    int fd;

    for (;;) {
        if (suspend_active() && waited >= ORPHANED_SUSPEND_MS)
            release_threads();
        if (agent_lost && die_with_agent && waited >= DMTCP_FATE_GRACE_MS)
            end_orphaned_process();
        pthread_mutex_lock(&conn_lock);
        if (first_fd >= 0) {
            fd = channel_connect_fd(first_fd);
            first_fd = -1;
        } else {
            fd = channel_connect();
        }
        if (fd >= 0)
            channel_set_agent_fd(fd);
        pthread_mutex_unlock(&conn_lock);
        if (fd >= 0) {
            agent_lost = 0;
            return fd;
        }
        pause_ms(step);
        waited += step;
        /* fast while a dump or restore is likely to be finishing, then
         * gently: an agent that is gone for good costs little */
        step = waited < 10000 ? (step * 2 > 20 ? 20 : step * 2) : 200;
    }
}

/* Serve one connection; returns when it is over. */
static void serve(int fd)
{
    static int32_t fds[DMTCP_PARK_MAX];
    struct dmtcp_record rec;
    int passed;

    /* back after a dump or a restore: the queues first, so that the agent
     * counts this process back only once they are */
    if (suspend_active())
        mqueue_reattach();
    if (channel_send(fd, DMTCP_REC_HELLO, (uint64_t)suspend_active()) < 0)
        goto out;
    for (;;) {
        if (channel_recv_fd(fd, &rec, &passed) <= 0)
            goto out;
        if (passed >= 0 && rec.type != DMTCP_REC_UNPARK_FD) {
            channel_close(passed);
            passed = -1;
        }
        switch (rec.type) {
        case DMTCP_REC_SUSPEND: {
            int stuck;

            api_before_checkpoint(); /* hooks, critical sections: threads still run */
            fdowner_save();
            stuck = suspend_all();
            if (channel_send(fd, DMTCP_REC_SUSPENDED, (uint64_t)stuck) < 0)
                goto out;
            break;
        }
        case DMTCP_REC_ELECT:
            fdowner_elect();
            if (channel_send(fd, DMTCP_REC_ELECTED, 0) < 0)
                goto out;
            break;
        case DMTCP_REC_PARK: {
            int n = rec.arg > DMTCP_PARK_MAX ? -1 : (int)rec.arg;

            if (n < 0 || channel_recv_payload(fd, fds, (size_t)n * sizeof(fds[0])) < 0)
                goto out;
            n = park_sockets(fd, fds, n);
            if (n < 0 || channel_send(fd, DMTCP_REC_PARKED, (uint64_t)n) < 0)
                goto out;
            break;
        }
        case DMTCP_REC_UNPARK_FD:
            if (passed >= 0)
                park_take_back((int)(uint32_t)rec.arg, passed);
            break;
        case DMTCP_REC_UNPARK:
            if (channel_send(fd, DMTCP_REC_UNPARKED, (uint64_t)park_finish()) < 0)
                goto out;
            break;
        case DMTCP_REC_CHECKPOINT:
            /* stay suspended: the agent dumps us, then we come back */
            mqueue_detach(); /* CRIU cannot dump a POSIX message queue */
            channel_send(fd, DMTCP_REC_READY, 0);
            pthread_mutex_lock(&conn_lock);
            channel_set_agent_fd(-1);
            channel_close(fd);
            pthread_mutex_unlock(&conn_lock);
            return;
        case DMTCP_REC_RESUME:
            release_threads();
            if (channel_send(fd, DMTCP_REC_RESUMED, 0) < 0)
                goto out;
            api_after_resume(rec.arg); /* hooks run with the threads going */
            break;
        case DMTCP_REC_DONE:
            api_generation_done(rec.arg);
            break;
        case DMTCP_REC_FATE:
            die_with_agent = rec.arg == 1;
            break;
        default:
            break; /* newer agent: ignore what we do not know */
        }
    }
out:
    /* the agent is gone in the middle: never leave the program stopped */
    agent_lost = 1;
    release_threads();
    pthread_mutex_lock(&conn_lock);
    channel_set_agent_fd(-1);
    channel_close(fd);
    pthread_mutex_unlock(&conn_lock);
}

static void *ckpt_thread_main(void *unused)
{
    sigset_t all;

    (void)unused;
    /* the program's signals are for the program's threads */
    sigfillset(&all);
    real_pthread_sigmask(SIG_BLOCK, &all, NULL); /* the wrapper would keep one */
    prctl(PR_SET_NAME, "dmtcp_ckpt", 0, 0, 0);
    for (;;)
        serve(connect_with_backoff());
    return NULL;
}

void ckpt_thread_start(void)
{
    pthread_t tid;
    pthread_attr_t attr;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    real_pthread_create(&tid, &attr, ckpt_thread_main, NULL);
    pthread_attr_destroy(&attr);
}

/* In a forked child only the forking thread exists: the parent's
 * connection is a copy that belongs to the parent, so drop it and give the
 * child a checkpoint thread of its own. */
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

static void atfork_child(void)
{
    pthread_mutex_unlock(&conn_lock);
    gate_after_fork_child();
    channel_after_fork_child();
    if (!shim_enabled)
        return;
    if (channel_agent_fd() >= 0) {
        channel_close(channel_agent_fd());
        channel_set_agent_fd(-1);
    }
    if (first_fd >= 0)
        channel_close(first_fd); /* the parent's, not yet used */
    first_fd = channel_socket();
    ckpt_thread_start();
}

__attribute__((constructor)) static void dmtcp_shim_init(void)
{
    if (channel_set_address(getenv(DMTCP_ENV_AGENT_SOCK)) < 0)
        return; /* not launched under an agent: stay inert */
    shim_enabled = 1;
    api_init();
    exec_env_capture();
    suspend_init();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    first_fd = channel_socket();
    ckpt_thread_start();
}
