/*
 * Blocking IPC across checkpoint and restart.
 *
 * usage: res_ipc TICKS INTERVAL_MS            (ping-pong)
 *        res_ipc TICKS INTERVAL_MS queue      (messages held in queues)
 *
 * Ping-pong: a parent and its child (fork) pass each tick's number both
 * ways through a System V semaphore set (semop, semtimedop), a System V
 * message queue (msgsnd, msgrcv), two POSIX message queues (mq_send;
 * mq_receive and mq_timedreceive, blocking; one queue linked, one unlinked
 * while both hold it) and a socketpair with SO_RCVTIMEO and SO_SNDTIMEO
 * (send, recv with MSG_WAITALL, read, write).  Each tick one side sleeps
 * before it sends on one of them (turn by turn), so that a checkpoint finds
 * the other blocked in that channel's call.  Every call is checked: an error, EINTR included, or a wrong
 * number is a failure.  Waits with a limit have 60 s, which only a lost
 * wake-up uses up.
 *
 * Queue: messages of several priorities wait in POSIX queues for the whole
 * run: queue a (the parent's alone, O_RDWR | O_NONBLOCK, with a copy of
 * the fd with FD_CLOEXEC, watched by an epoll set), queue b (full,
 * unlinked, held by the parent O_WRONLY and by the child O_RDONLY, each
 * through its own mq_open) and queue c (empty, an mq_notify registration
 * SIGEV_SIGNAL with a value).  Every tick checks the attributes, the
 * message counts, the fd flags and the epoll set's event for queue a; at
 * the end the parent receives queue a and prints it ("queue a ..."), the
 * child receives queue b ("queue b ..."), and a message sent to queue c
 * must bring the registered signal with its value.
 *
 * Both print "tick N ..." lines (the parent) and "done N"; on a broken
 * invariant "FAIL[pid]: ..." on stderr and exit 3 (res_common.h).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <mqueue.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "res_common.h"

#define LIMIT_S 60

static long ticks, interval;

/* The call's name and errno's text: "FAIL[pid]: semop: Interrupted system call". */
#define CALL_OK(ok, call) RES_CHECK(ok, "%s: %s", call, strerror(errno))

/* A child that ends before its time: the parent fails (after res_fail's
 * pause, as a tree being killed takes its processes one by one). */
static void on_sigchld(int sig)
{
    static const char msg[] = "FAIL: the child ended\n";
    struct timespec pause = { 0, 300000000L };

    (void)sig;
    nanosleep(&pause, NULL);
    if (write(2, msg, sizeof(msg) - 1) < 0)
        _exit(3);
    _exit(3);
}

static void watch_child(int on)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on ? on_sigchld : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    CALL_OK(sigaction(SIGCHLD, &sa, NULL) == 0, "sigaction");
}

static struct timespec deadline(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += LIMIT_S;
    return ts;
}

static void queue_name(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "/res_ipc.%d.%s", (int)getpid(), what);
}

static void end_child(pid_t child)
{
    int status;

    watch_child(0);
    CALL_OK(waitpid(child, &status, 0) == child, "waitpid");
    RES_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child ended with status %#x",
              status);
}

/* ---- ping-pong ---- */

struct channels {
    int sem, msq;
    mqd_t down, up; /* parent -> child, child -> parent */
    int sock[2];
};

struct number_msg {
    long type;
    long value;
};

/* P (op -1) or V (op +1) on semaphore n; timed: semtimedop. */
static void sem_step(const struct channels *c, int n, int op, int timed)
{
    struct sembuf b = { (unsigned short)n, (short)op, 0 };
    struct timespec limit = { LIMIT_S, 0 };

    if (timed)
        CALL_OK(semtimedop(c->sem, &b, 1, &limit) == 0, "semtimedop");
    else
        CALL_OK(semop(c->sem, &b, 1) == 0, "semop");
}

static void msg_send(const struct channels *c, long type, long value)
{
    struct number_msg m = { type, value };

    CALL_OK(msgsnd(c->msq, &m, sizeof(m.value), 0) == 0, "msgsnd");
}

static void msg_expect(const struct channels *c, long type, long value)
{
    struct number_msg m = { 0, 0 };
    ssize_t n = msgrcv(c->msq, &m, sizeof(m.value), type, 0);

    CALL_OK(n >= 0, "msgrcv");
    RES_CHECK(n == sizeof(m.value) && m.type == type && m.value == value,
              "msgrcv: %zd bytes, type %ld, %ld; not type %ld, %ld", n, m.type, m.value, type,
              value);
}

static void mq_put(mqd_t q, long value)
{
    CALL_OK(mq_send(q, (const char *)&value, sizeof(value), (unsigned)(value % 5)) == 0,
            "mq_send");
}

static void mq_expect(mqd_t q, long value, int timed)
{
    struct timespec limit = deadline();
    long got = 0;
    unsigned prio = 99;
    ssize_t n = timed ? mq_timedreceive(q, (char *)&got, 16, &prio, &limit)
                      : mq_receive(q, (char *)&got, 16, &prio);

    CALL_OK(n >= 0, timed ? "mq_timedreceive" : "mq_receive");
    RES_CHECK(n == sizeof(got) && got == value && prio == (unsigned)(value % 5),
              "mq: %zd bytes, %ld priority %u; not %ld", n, got, prio, value);
}

static void sock_put(int fd, long value, int use_write)
{
    ssize_t n = use_write ? write(fd, &value, sizeof(value)) : send(fd, &value, sizeof(value), 0);

    CALL_OK(n >= 0, use_write ? "write" : "send");
    RES_CHECK(n == sizeof(value), "%s: %zd bytes", use_write ? "write" : "send", n);
}

static void sock_expect(int fd, long value, int use_read)
{
    long got = 0;
    ssize_t n = use_read ? read(fd, &got, sizeof(got)) : recv(fd, &got, sizeof(got), MSG_WAITALL);

    CALL_OK(n >= 0, use_read ? "read" : "recv");
    RES_CHECK(n == sizeof(got) && got == value, "%s: %zd bytes, %ld; not %ld",
              use_read ? "read" : "recv", n, got, value);
}

/*
 * One tick: the number goes down and comes back up on each channel in
 * turn.  One side sleeps first, so that the other waits in that channel's
 * blocking call meanwhile: which side and which channel go round with the
 * ticks (a checkpoint then finds the waiting side in any of them).
 */
enum { SEM, MSG, MQ, SOCK, CHANNELS };

static int sleeper(long t)
{
    return (int)(t % 2); /* 0: the parent, 1: the child */
}

static int slow_channel(long t)
{
    return (int)(t / 2 % CHANNELS);
}

/* Which of a channel's two calls each side uses: alternate every round
 * of the sleeps, so that each call is the one waiting now and then. */
static int variant(long t)
{
    return (int)(t / (2 * CHANNELS) % 2);
}

static void parent_tick(const struct channels *c, long t)
{
    for (int ch = 0; ch < CHANNELS; ch++) {
        int v = variant(t);

        if (sleeper(t) == 0 && slow_channel(t) == ch)
            res_sleep_ms(interval);
        switch (ch) {
        case SEM:
            sem_step(c, 0, +1, 0);
            sem_step(c, 1, -1, !v);
            break;
        case MSG:
            msg_send(c, 1, t);
            msg_expect(c, 2, t);
            break;
        case MQ:
            mq_put(c->down, t);
            mq_expect(c->up, t, v);
            break;
        default:
            sock_put(c->sock[0], t, !v);
            sock_expect(c->sock[0], t, v);
            break;
        }
    }
}

static void child_tick(const struct channels *c, long t)
{
    for (int ch = 0; ch < CHANNELS; ch++) {
        int v = variant(t);

        switch (ch) {
        case SEM:
            sem_step(c, 0, -1, v);
            break;
        case MSG:
            msg_expect(c, 1, t);
            break;
        case MQ:
            mq_expect(c->down, t, !v);
            break;
        default:
            sock_expect(c->sock[1], t, !v);
            break;
        }
        if (sleeper(t) == 1 && slow_channel(t) == ch)
            res_sleep_ms(interval);
        switch (ch) {
        case SEM:
            sem_step(c, 1, +1, 0);
            break;
        case MSG:
            msg_send(c, 2, t);
            break;
        case MQ:
            mq_put(c->up, t);
            break;
        default:
            sock_put(c->sock[1], t, v);
            break;
        }
    }
}

static int ping_pong(void)
{
    struct mq_attr attr = { .mq_maxmsg = 4, .mq_msgsize = 16 };
    struct timeval limit = { LIMIT_S, 0 };
    struct channels c;
    char down[64], up[64];
    pid_t child;

    queue_name(down, sizeof(down), "down");
    queue_name(up, sizeof(up), "up");
    c.sem = semget(IPC_PRIVATE, 2, IPC_CREAT | 0600);
    CALL_OK(c.sem >= 0, "semget");
    c.msq = msgget(IPC_PRIVATE, IPC_CREAT | 0600);
    CALL_OK(c.msq >= 0, "msgget");
    c.up = mq_open(up, O_RDWR | O_CREAT | O_EXCL, 0600, &attr);
    CALL_OK(c.up != (mqd_t)-1, "mq_open up");
    CALL_OK(mq_unlink(up) == 0, "mq_unlink up"); /* both hold it, nobody can open it */
    c.down = mq_open(down, O_WRONLY | O_CREAT | O_EXCL, 0600, &attr);
    CALL_OK(c.down != (mqd_t)-1, "mq_open down");
    CALL_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, c.sock) == 0, "socketpair");
    for (int i = 0; i < 2; i++)
        CALL_OK(setsockopt(c.sock[i], SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)) == 0
                    && setsockopt(c.sock[i], SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit)) == 0,
                "setsockopt");

    watch_child(1);
    child = fork();
    CALL_OK(child >= 0, "fork");
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        CALL_OK(mq_close(c.down) == 0, "mq_close");
        c.down = mq_open(down, O_RDONLY); /* an open file description of its own */
        CALL_OK(c.down != (mqd_t)-1, "mq_open down (child)");
        for (long t = 1; t <= ticks; t++)
            child_tick(&c, t);
        sock_expect(c.sock[1], -1, 1); /* the parent's bye */
        _exit(0);
    }
    for (long t = 1; t <= ticks; t++) {
        parent_tick(&c, t);
        printf("tick %ld sem msg mq sock\n", t);
    }
    watch_child(0);
    sock_put(c.sock[0], -1, 1); /* bye */
    end_child(child);
    CALL_OK(mq_unlink(down) == 0, "mq_unlink down");
    printf("done %ld\n", ticks);
    return 0;
}

/* ---- queues that hold messages ---- */

#define A_COUNT 6
static const unsigned a_prio[A_COUNT] = { 0, 5, 2, 5, 0, 9 };
static const char *const a_text[A_COUNT] = { "a0", "a1", "a2", "a3", "a4", "a5" };
#define B_COUNT 4
static const unsigned b_prio[B_COUNT] = { 1, 3, 1, 3 };
static const char *const b_text[B_COUNT] = { "b0", "b1", "b2", "b3" };
#define C_VALUE 4242
#define EPOLL_DATA 0x5eed

static void expect_attr(mqd_t q, const char *what, long maxmsg, long msgsize, long cur,
                        long flags)
{
    struct mq_attr a;

    CALL_OK(mq_getattr(q, &a) == 0, "mq_getattr");
    RES_CHECK(a.mq_maxmsg == maxmsg && a.mq_msgsize == msgsize && a.mq_curmsgs == cur
                  && a.mq_flags == flags,
              "queue %s: maxmsg %ld msgsize %ld curmsgs %ld flags %#lx; not %ld %ld %ld %#lx",
              what, a.mq_maxmsg, a.mq_msgsize, a.mq_curmsgs, a.mq_flags, maxmsg, msgsize, cur,
              flags);
}

static void expect_fd(int fd, const char *what, int access, int cloexec)
{
    int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);

    CALL_OK(fl >= 0 && fdfl >= 0, "fcntl");
    RES_CHECK((fl & O_ACCMODE) == access && (fdfl & FD_CLOEXEC) == cloexec,
              "fd %d (%s): access %d cloexec %d; not %d %d", fd, what, fl & O_ACCMODE,
              fdfl & FD_CLOEXEC, access, cloexec);
}

/* Receive all of q and print it in the order it came: "queue NAME t1 t2 ...". */
static void print_queue(mqd_t q, const char *name, int count)
{
    char line[256];
    size_t len = (size_t)snprintf(line, sizeof(line), "queue %s", name);

    for (int i = 0; i < count; i++) {
        char buf[64];
        unsigned prio;
        ssize_t n = mq_receive(q, buf, sizeof(buf), &prio);

        CALL_OK(n >= 0, "mq_receive");
        len += (size_t)snprintf(line + len, sizeof(line) - len, " %.*s:%u", (int)n, buf, prio);
    }
    printf("%s\n", line);
}

static int hold_queues(void)
{
    struct mq_attr a_attr = { .mq_maxmsg = 8, .mq_msgsize = 64 };
    struct mq_attr b_attr = { .mq_maxmsg = B_COUNT, .mq_msgsize = 16 };
    struct mq_attr c_attr = { .mq_maxmsg = 2, .mq_msgsize = 8 };
    struct sigevent sev;
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = EPOLL_DATA };
    char a_name[64], b_name[64], c_name[64];
    int ep;
    int opened[2], end[2];
    mqd_t a, a_copy, b, c;
    char byte;
    pid_t child;
    sigset_t usr1;

    queue_name(a_name, sizeof(a_name), "a");
    queue_name(b_name, sizeof(b_name), "b");
    queue_name(c_name, sizeof(c_name), "c");
    a = mq_open(a_name, O_RDWR | O_NONBLOCK | O_CREAT | O_EXCL, 0640, &a_attr);
    b = mq_open(b_name, O_WRONLY | O_CREAT | O_EXCL, 0600, &b_attr);
    c = mq_open(c_name, O_RDWR | O_CREAT | O_EXCL, 0600, &c_attr);
    CALL_OK(a != (mqd_t)-1 && b != (mqd_t)-1 && c != (mqd_t)-1, "mq_open");
    /* glibc opens queues with O_CLOEXEC: a without it, its copy with it */
    CALL_OK(fcntl(a, F_SETFD, 0) == 0, "fcntl F_SETFD");
    a_copy = fcntl(a, F_DUPFD_CLOEXEC, 20);
    CALL_OK(a_copy >= 0, "fcntl F_DUPFD_CLOEXEC");
    for (int i = 0; i < A_COUNT; i++)
        CALL_OK(mq_send(a, a_text[i], strlen(a_text[i]), a_prio[i]) == 0, "mq_send a");
    ep = epoll_create1(EPOLL_CLOEXEC);
    CALL_OK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev) == 0, "epoll");
    for (int i = 0; i < B_COUNT; i++)
        CALL_OK(mq_send(b, b_text[i], strlen(b_text[i]), b_prio[i]) == 0, "mq_send b");
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    CALL_OK(sigprocmask(SIG_BLOCK, &usr1, NULL) == 0, "sigprocmask");
    memset(&sev, 0, sizeof(sev));
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGUSR1;
    sev.sigev_value.sival_int = C_VALUE;
    CALL_OK(mq_notify(c, &sev) == 0, "mq_notify");
    CALL_OK(pipe(opened) == 0 && pipe(end) == 0, "pipe");

    watch_child(1);
    child = fork();
    CALL_OK(child >= 0, "fork");
    if (child == 0) {
        mqd_t mine = mq_open(b_name, O_RDONLY);

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        CALL_OK(mine != (mqd_t)-1, "mq_open b (child)");
        CALL_OK(write(opened[1], "o", 1) == 1, "write");
        CALL_OK(read(end[0], &byte, 1) == 1, "read");
        expect_attr(mine, "b (child)", B_COUNT, 16, B_COUNT, 0);
        print_queue(mine, "b", B_COUNT);
        expect_attr(mine, "b (child)", B_COUNT, 16, 0, 0);
        _exit(0);
    }
    CALL_OK(read(opened[0], &byte, 1) == 1, "read");
    CALL_OK(mq_unlink(b_name) == 0, "mq_unlink b"); /* the child and we hold it */
    for (long t = 1; t <= ticks; t++) {
        res_sleep_ms(interval);
        expect_attr(a, "a", 8, 64, A_COUNT, O_NONBLOCK);
        expect_attr(a_copy, "a (copy)", 8, 64, A_COUNT, O_NONBLOCK);
        expect_attr(b, "b", B_COUNT, 16, B_COUNT, 0);
        expect_attr(c, "c", 2, 8, 0, 0);
        expect_fd(a, "a", O_RDWR, 0);
        expect_fd(a_copy, "a copy", O_RDWR, FD_CLOEXEC);
        expect_fd(b, "b", O_WRONLY, FD_CLOEXEC);
        {
            struct epoll_event got[2];
            int n = epoll_wait(ep, got, 2, 0);

            CALL_OK(n >= 0, "epoll_wait");
            RES_CHECK(n == 1 && got[0].data.u64 == EPOLL_DATA && (got[0].events & EPOLLIN),
                      "epoll: %d events, data %#llx; not queue a readable", n,
                      n > 0 ? (unsigned long long)got[0].data.u64 : 0ULL);
        }
        printf("tick %ld queues\n", t);
    }
    /* the copy shares its open file description: a flag set through it shows on a */
    {
        struct mq_attr blocking = { .mq_flags = 0 };

        CALL_OK(mq_setattr(a_copy, &blocking, NULL) == 0, "mq_setattr");
        expect_attr(a, "a after mq_setattr on its copy", 8, 64, A_COUNT, 0);
    }
    print_queue(a, "a", A_COUNT);
    watch_child(0);
    CALL_OK(write(end[1], "e", 1) == 1, "write");
    end_child(child);
    {
        siginfo_t si;
        struct timespec limit = { LIMIT_S, 0 };
        int sig;

        CALL_OK(mq_send(c, "c", 1, 0) == 0, "mq_send c");
        sig = sigtimedwait(&usr1, &si, &limit);
        CALL_OK(sig >= 0, "sigtimedwait");
        RES_CHECK(sig == SIGUSR1 && si.si_code == SI_MESGQ && si.si_value.sival_int == C_VALUE,
                  "mq_notify: signal %d code %d value %d", sig, si.si_code,
                  si.si_value.sival_int);
        printf("notified %d\n", si.si_value.sival_int);
    }
    CALL_OK(mq_unlink(a_name) == 0 && mq_unlink(c_name) == 0, "mq_unlink");
    printf("done %ld\n", ticks);
    return 0;
}

int main(int argc, char **argv)
{
    res_args(argc, argv, &ticks, &interval);
    if (argc > 3 && strcmp(argv[3], "queue") == 0)
        return hold_queues();
    return ping_pong();
}
