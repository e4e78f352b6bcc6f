/*
 * System V IPC, POSIX semaphores, AIO and socket calls with timeouts, made
 * blind to the checkpoint signal.
 *
 * WHY: as in wrap_wait.c, every checkpoint stops each thread with the
 * reserved signal, whose handler has SA_RESTART, and Linux never restarts
 * some calls once a handler ran (man 7 signal).  Measured here (kernel
 * 6.18, glibc 2.36; a thread blocked in the call, a SA_RESTART handler
 * run):
 *   fail with EINTR, so wrapped here: semop, semtimedop, msgrcv, msgsnd;
 *     sem_timedwait and sem_clockwait (glibc's futex wait with a time
 *     limit); io_getevents (glibc has none: libaio's, which returns
 *     -EINTR instead of setting errno); and on a socket with SO_RCVTIMEO
 *     or SO_SNDTIMEO: accept, accept4, connect (TCP and Unix), recv,
 *     recvfrom, recvmsg, recvmmsg, send, sendto, sendmsg, and read and
 *     write too (on a socket they are recv and send).
 *   restarted by the kernel, not wrapped: sem_wait (its futex wait has no
 *     limit), mq_send, mq_receive, mq_timedsend and mq_timedreceive (their
 *     limits are absolute), and the socket calls on sockets without those
 *     timeouts.
 * No wrapper of the shim covered any of these before (wrap_fd.c guards
 * close and dup2 only).
 *
 * The scheme is wrap_wait.c's, with its struct wait: the handler counts
 * per thread the calls it made fail with EINTR; a call that fails with
 * EINTR while the counter moved is made again for the time left, measured
 * on CLOCK_MONOTONIC from the wrapper's entry and never more than the
 * original timeout; errno is given back as it was on success; the
 * program's own signals still give EINTR.  The socket calls, read and
 * write among them, start their count on the coarse clock
 * (wait_begin_coarse): what every read and write now costs is that clock,
 * the counter and one more call, about 35 ns here (a 1-byte read of
 * /dev/zero: 210 ns without the shim, 245 ns with it).
 *
 * - semtimedop's timeout is relative (retry_ts); sem_timedwait's and
 *   sem_clockwait's are absolute: the same deadline again.  semop, msgrcv
 *   and msgsnd wait without limit: simply again.  An interrupted call did
 *   nothing (no operation applied, no message taken or queued).
 * - io_getevents: EINTR only when no event was taken; again for the time
 *   left.  Built for libaio's current interface (LIBAIO_0.4); a program
 *   linked against the 2002 one (LIBAIO_0.1, four arguments) would break.
 * - Sockets: the timeout is the socket's own (SO_RCVTIMEO or SO_SNDTIMEO,
 *   read once interrupted).  For its time left: poll for the socket to be
 *   ready, then the call again without blocking (MSG_DONTWAIT), so that it
 *   never waits longer than what was left; when nothing is there after all
 *   (another thread took it), poll again.  When the time is up: EAGAIN (a
 *   connect: EINPROGRESS), what the kernel gives on that timeout.  A
 *   stream send, and a recv with MSG_WAITALL, go on until everything moved
 *   or the time is up, as the blocking call does.  accept and connect have
 *   no per-call MSG_DONTWAIT: they are called as they were once poll says
 *   ready (a TCP connect under way then returns at once), so an accept
 *   that another thread beat to its connection, and a Unix connect waiting
 *   for room in its peer's backlog, wait their whole timeout again.
 *   sendmsg, recvmsg and recvmmsg return the count they got (no iovec is
 *   walked for the rest).  Out of reach: a stream transfer that had moved
 *   part of its data when the signal came returns that count, no EINTR,
 *   so nothing tells that the signal was ours (as after any signal).
 * - read and write on an fd that is not a socket, or a socket without a
 *   timeout (some driver that does not restart): called again, as
 *   SA_RESTART would have done.
 *
 * Also here: mq_notify, wrapped only to remember the sigev_value of a
 * registration, which a checkpoint must make again (mqueue.c).
 *
 * What these wrappers cannot see: calls glibc makes inside itself (stdio's
 * reads and writes), the -D_FORTIFY_SOURCE forms other than __read_chk,
 * __recv_chk and __recvfrom_chk, readv/writev, and raw syscall()s.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <mqueue.h>
#include <poll.h>
#include <semaphore.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/*
 * The libc (or libaio) functions behind these wrappers.  real.c is the
 * shim's one dlsym(RTLD_NEXT) cache; these resolvers belong there, and sit
 * here only because that file was outside this change (moving them is
 * mechanical: one REAL() line and one real_*() per call).
 */
static void *next_fn(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);

    if (fn == NULL) {
        fn = dlsym(RTLD_NEXT, name);
        __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

#define NEXT(name)                                                  \
    static __typeof__(&name) next_##name(void)                      \
    {                                                               \
        static void *slot;                                          \
        return (__typeof__(&name))next_fn(&slot, #name);            \
    }

NEXT(semop)
NEXT(semtimedop)
NEXT(msgrcv)
NEXT(msgsnd)
NEXT(sem_timedwait)
NEXT(sem_clockwait)
NEXT(accept)
NEXT(accept4)
NEXT(connect)
NEXT(recvfrom)
NEXT(recvmsg)
NEXT(recvmmsg)
NEXT(sendto)
NEXT(sendmsg)
NEXT(read)
NEXT(write)
NEXT(poll)
NEXT(mq_notify)

/* Resolved before the program runs: some of these are called from signal
 * handlers (write, for the self-pipe trick), where dlsym must not be. */
__attribute__((constructor)) static void wrap_ipc_resolve(void)
{
    next_semop();
    next_semtimedop();
    next_msgrcv();
    next_msgsnd();
    next_sem_timedwait();
    next_sem_clockwait();
    next_accept();
    next_accept4();
    next_connect();
    next_recvfrom();
    next_recvmsg();
    next_recvmmsg();
    next_sendto();
    next_sendmsg();
    next_read();
    next_write();
    next_poll();
    next_mq_notify();
}

/* ---- System V IPC ---- */

struct sysv_args {
    int id;
    struct sembuf *sops;
    size_t nsops;
    void *msg;
    size_t size;
    long type;
    int flags;
};

static long call_semop(void *ctx, const struct timespec *timeout)
{
    struct sysv_args *a = ctx;

    (void)timeout;
    return next_semop()(a->id, a->sops, a->nsops);
}

SHIM_EXPORT int semop(int id, struct sembuf *sops, size_t nsops)
{
    struct sysv_args a = { .id = id, .sops = sops, .nsops = nsops };

    return (int)retry_ts(NULL, call_semop, &a, NULL);
}

static long call_semtimedop(void *ctx, const struct timespec *timeout)
{
    struct sysv_args *a = ctx;

    return next_semtimedop()(a->id, a->sops, a->nsops, timeout);
}

SHIM_EXPORT int semtimedop(int id, struct sembuf *sops, size_t nsops,
                           const struct timespec *timeout)
{
    struct sysv_args a = { .id = id, .sops = sops, .nsops = nsops };

    /* a NULL timeout stays NULL: retry_ts never makes one up */
    return (int)retry_ts(timeout, call_semtimedop, &a, NULL);
}

static long call_msgrcv(void *ctx, const struct timespec *timeout)
{
    struct sysv_args *a = ctx;

    (void)timeout;
    return next_msgrcv()(a->id, a->msg, a->size, a->type, a->flags);
}

SHIM_EXPORT ssize_t msgrcv(int id, void *msg, size_t size, long type, int flags)
{
    struct sysv_args a = { .id = id, .msg = msg, .size = size, .type = type, .flags = flags };

    return retry_ts(NULL, call_msgrcv, &a, NULL);
}

static long call_msgsnd(void *ctx, const struct timespec *timeout)
{
    struct sysv_args *a = ctx;

    (void)timeout;
    return next_msgsnd()(a->id, a->msg, a->size, a->flags);
}

SHIM_EXPORT int msgsnd(int id, const void *msg, size_t size, int flags)
{
    struct sysv_args a = { .id = id, .msg = (void *)msg, .size = size, .flags = flags };

    return (int)retry_ts(NULL, call_msgsnd, &a, NULL);
}

/* ---- POSIX semaphores: an absolute deadline, the same again ---- */

SHIM_EXPORT int sem_timedwait(sem_t *sem, const struct timespec *abstime)
{
    struct wait w;
    int r;

    wait_begin(&w);
    do {
        wait_snapshot(&w);
        r = next_sem_timedwait()(sem, abstime);
    } while (wait_again(&w, r < 0 && errno == EINTR));
    return (int)wait_done(&w, r);
}

SHIM_EXPORT int sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *abstime)
{
    struct wait w;
    int r;

    wait_begin(&w);
    do {
        wait_snapshot(&w);
        r = next_sem_clockwait()(sem, clock, abstime);
    } while (wait_again(&w, r < 0 && errno == EINTR));
    return (int)wait_done(&w, r);
}

/* ---- io_getevents (libaio) ---- */

struct io_args {
    void *ctx;
    long min_nr, nr;
    void *events;
};

typedef int (*io_getevents_fn)(void *ctx, long min_nr, long nr, void *events,
                               struct timespec *timeout);

static long call_io_getevents(void *ctx, const struct timespec *timeout)
{
    static void *slot;
    io_getevents_fn fn = (io_getevents_fn)next_fn(&slot, "io_getevents");
    struct io_args *a = ctx;
    struct timespec copy, *t = NULL;
    long r;

    if (timeout) { /* libaio's prototype is not const */
        copy = *timeout;
        t = &copy;
    }
    if (fn) {
        r = fn(a->ctx, a->min_nr, a->nr, a->events, t);
    } else { /* no libaio loaded: what it would do, the system call, -errno */
        r = syscall(SYS_io_getevents, a->ctx, a->min_nr, a->nr, a->events, t);
        if (r < 0)
            r = -errno;
    }
    if (r < 0) { /* errno's way, for retry_ts */
        errno = (int)-r;
        return -1;
    }
    return r;
}

/* libaio's io_getevents(io_context_t, long, long, struct io_event *,
 * struct timespec *), declared here without its header. */
SHIM_EXPORT int io_getevents(void *ctx, long min_nr, long nr, void *events,
                             struct timespec *timeout)
{
    struct io_args a = { ctx, min_nr, nr, events };
    int saved = errno;
    long r = retry_ts(timeout, call_io_getevents, &a, NULL);

    if (r < 0)
        r = -errno;
    errno = saved; /* libaio leaves errno alone */
    return (int)r;
}

/* ---- sockets with SO_RCVTIMEO / SO_SNDTIMEO ---- */

/*
 * The call once more; dontwait: without blocking (MSG_DONTWAIT), for the
 * time left.  done: what moved already (a stream send, MSG_WAITALL).
 */
struct sock_args {
    int fd, out, flags;
    void *buf;
    size_t len, done;
    int keep_going; /* until len moved: a stream send, MSG_WAITALL */
    __SOCKADDR_ARG from;
    socklen_t *fromlen;
    __CONST_SOCKADDR_ARG to;
    socklen_t tolen;
    struct msghdr *msg;
    struct mmsghdr *vec;
    unsigned vlen;
    struct timespec *vtimeout;
    int accept4_flags, accepting;
    int plain; /* read or write: as they were unless dontwait */
};

static long sock_call(struct sock_args *a, int dontwait)
{
    int flags = a->flags | (dontwait ? MSG_DONTWAIT : 0);
    char *p = (char *)a->buf + a->done;
    size_t n = a->len - a->done;

    if (a->plain && !dontwait)
        return a->out ? next_write()(a->fd, p, n) : next_read()(a->fd, p, n);
    if (a->accepting == 1)
        return next_accept()(a->fd, a->from, a->fromlen);
    if (a->accepting == 2)
        return next_accept4()(a->fd, a->from, a->fromlen, a->accept4_flags);
    if (a->vec)
        return next_recvmmsg()(a->fd, a->vec, a->vlen, flags, a->vtimeout);
    if (a->msg)
        return a->out ? next_sendmsg()(a->fd, a->msg, flags) : next_recvmsg()(a->fd, a->msg, flags);
    if (a->out)
        return next_sendto()(a->fd, p, n, flags, a->to, a->tolen);
    return next_recvfrom()(a->fd, p, n, flags, a->from, a->fromlen);
}

/* poll's timeout for what is left of w->limit (ms, rounded up, capped). */
static int poll_ms(const struct wait *w)
{
    struct timespec left;

    time_left(w, &left);
    if (left.tv_sec >= INT_MAX / 1000 - 1)
        return INT_MAX;
    return (int)(left.tv_sec * 1000 + (left.tv_nsec + 999999) / 1000000);
}

/*
 * After our signal made the call fail with EINTR (w has seen it): the rest
 * of the call, for the time left of the socket's timeout.
 */
static long sock_again(struct wait *w, struct sock_args *a)
{
    struct timeval tv;
    socklen_t tvlen = sizeof(tv);
    long n;

    if (getsockopt(a->fd, SOL_SOCKET, a->out ? SO_SNDTIMEO : SO_RCVTIMEO, &tv, &tvlen) != 0
        || (tv.tv_sec == 0 && tv.tv_usec == 0)) {
        /* not a socket, or no timeout any more: again, as it was */
        do {
            wait_snapshot(w);
            n = sock_call(a, 0);
        } while (wait_again(w, n < 0 && errno == EINTR));
        return wait_done(w, n);
    }
    w->limit = timeval_limit(&tv);
    if (a->keep_going && !a->out) { /* MSG_WAITALL means something on a stream only */
        int type = 0;
        socklen_t typelen = sizeof(type);

        if (getsockopt(a->fd, SOL_SOCKET, SO_TYPE, &type, &typelen) != 0 || type != SOCK_STREAM)
            a->keep_going = 0;
    }
    for (;;) {
        struct pollfd p = { a->fd, (short)(a->out ? POLLOUT : POLLIN), 0 };
        int r;

        wait_snapshot(w);
        r = next_poll()(&p, 1, poll_ms(w));
        if (r < 0 && wait_again(w, errno == EINTR))
            continue;
        if (r <= 0) {
            if (a->done > 0) /* what moved before: the count, as the kernel does */
                return wait_done(w, (long)a->done);
            if (r == 0)
                errno = EAGAIN; /* the socket's timeout */
            return -1;        /* the program's signal: EINTR */
        }
        wait_snapshot(w);
        n = sock_call(a, !a->accepting);
        if (n > 0 && a->keep_going && a->done + (size_t)n < a->len) {
            a->done += (size_t)n;
            continue;
        }
        if (n >= 0)
            return wait_done(w, n + (long)a->done);
        if ((errno == EAGAIN || errno == EWOULDBLOCK) || wait_again(w, errno == EINTR))
            continue; /* taken by another thread first, or our signal again */
        if (a->done > 0)
            return wait_done(w, (long)a->done);
        return -1;
    }
}

/* The first call as the program made it; on our EINTR, sock_again. */
static long sock_first(struct sock_args *a)
{
    struct wait w;
    long n;

    wait_begin_coarse(&w);
    wait_snapshot(&w);
    n = sock_call(a, 0);
    if (!wait_again(&w, n < 0 && errno == EINTR))
        return n;
    return sock_again(&w, a);
}

SHIM_EXPORT int accept(int fd, __SOCKADDR_ARG addr, socklen_t *restrict len)
{
    struct sock_args a = { .fd = fd, .from = addr, .fromlen = len, .accepting = 1 };

    return (int)sock_first(&a);
}

SHIM_EXPORT int accept4(int fd, __SOCKADDR_ARG addr, socklen_t *restrict len, int flags)
{
    struct sock_args a = { .fd = fd, .from = addr, .fromlen = len, .accepting = 2,
                           .accept4_flags = flags };

    return (int)sock_first(&a);
}

/*
 * connect: interrupted, a TCP connection goes on being made; a Unix one
 * is not under way.  Wait for the socket to be writable for the time
 * left, then connect again: that reports how the TCP attempt ended (0, or
 * its error), or makes the Unix attempt again.  Time up: EINPROGRESS, as
 * the kernel's own timeout.
 */
SHIM_EXPORT int connect(int fd, __CONST_SOCKADDR_ARG addr, socklen_t len)
{
    struct wait w;
    struct timeval tv;
    socklen_t tvlen = sizeof(tv);
    int r;

    wait_begin(&w);
    wait_snapshot(&w);
    r = next_connect()(fd, addr, len);
    if (!wait_again(&w, r < 0 && errno == EINTR))
        return r;
    if (getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tvlen) != 0)
        tv.tv_sec = tv.tv_usec = 0;
    w.limit = timeval_limit(&tv);
    for (;;) {
        struct pollfd p = { fd, POLLOUT, 0 };
        int ready;

        wait_snapshot(&w);
        ready = tv.tv_sec == 0 && tv.tv_usec == 0 ? next_poll()(&p, 1, -1)
                                                 : next_poll()(&p, 1, poll_ms(&w));
        if (ready < 0 && wait_again(&w, errno == EINTR))
            continue;
        if (ready < 0)
            return -1; /* the program's signal: the connection goes on, as after EINTR */
        if (ready == 0) {
            errno = EINPROGRESS;
            return -1;
        }
        wait_snapshot(&w);
        r = next_connect()(fd, addr, len);
        if (r < 0 && errno == EISCONN) /* made meanwhile, and seen by another call */
            r = 0;
        if (!wait_again(&w, r < 0 && errno == EINTR))
            return (int)wait_done(&w, r);
    }
}

SHIM_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    struct sock_args a = { .fd = fd, .buf = buf, .len = len, .flags = flags,
                           .keep_going = (flags & MSG_WAITALL) != 0 };

    return sock_first(&a);
}

SHIM_EXPORT ssize_t recvfrom(int fd, void *restrict buf, size_t len, int flags,
                             __SOCKADDR_ARG from, socklen_t *restrict fromlen)
{
    struct sock_args a = { .fd = fd, .buf = buf, .len = len, .flags = flags, .from = from,
                           .fromlen = fromlen, .keep_going = (flags & MSG_WAITALL) != 0 };

    return sock_first(&a);
}

SHIM_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    struct sock_args a = { .fd = fd, .msg = msg, .flags = flags };

    return sock_first(&a);
}

SHIM_EXPORT int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags,
                         struct timespec *timeout)
{
    struct sock_args a = { .fd = fd, .vec = vec, .vlen = vlen, .flags = flags,
                           .vtimeout = timeout };

    return (int)sock_first(&a);
}

/* A stream send moves everything unless its timeout ends it; a datagram
 * goes whole or not at all, so going on never applies to it. */
SHIM_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    struct sock_args a = { .fd = fd, .out = 1, .buf = (void *)buf, .len = len, .flags = flags,
                           .keep_going = 1 };

    return sock_first(&a);
}

SHIM_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags,
                           __CONST_SOCKADDR_ARG to, socklen_t tolen)
{
    struct sock_args a = { .fd = fd, .out = 1, .buf = (void *)buf, .len = len, .flags = flags,
                           .to = to, .tolen = tolen, .keep_going = 1 };

    return sock_first(&a);
}

SHIM_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    struct sock_args a = { .fd = fd, .out = 1, .msg = (struct msghdr *)msg, .flags = flags };

    return sock_first(&a);
}

/* read and write: on a socket, recv and send with no flags; elsewhere
 * (when our signal interrupted them at all) simply again.  The most
 * frequent calls of all: nothing on their way but the call and the
 * bookkeeping (the coarse clock, the counter). */
/* inlined into read(): the most frequent call of all */
static inline __attribute__((always_inline)) ssize_t read_plain(int fd, void *buf, size_t len)
{
    struct wait w;
    ssize_t n;

    wait_begin_coarse(&w);
    wait_snapshot(&w);
    n = next_read()(fd, buf, len);
    if (!wait_again(&w, n < 0 && errno == EINTR))
        return n;
    {
        struct sock_args a = { .fd = fd, .buf = buf, .len = len, .plain = 1 };

        return sock_again(&w, &a);
    }
}

/* An inotify fd may have events kept across a checkpoint (inotify.c):
 * they come first.  Otherwise a load of the fd's read bit and one of a
 * flag, before and after. */
SHIM_EXPORT ssize_t read(int fd, void *buf, size_t len)
{
    ssize_t n;

    inotify_note_read(fd);
    if (__builtin_expect(__atomic_load_n(&inotify_live, __ATOMIC_RELAXED) != 0, 0))
        return inotify_read(fd, buf, len, read_plain);
    n = read_plain(fd, buf, len);
    /* a read under way when the checkpoint came */
    if (__builtin_expect(n > 0 && __atomic_load_n(&inotify_live, __ATOMIC_RELAXED) != 0, 0))
        return inotify_read_done(fd, buf, len, n, read_plain);
    return n;
}

SHIM_EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
    struct wait w;
    ssize_t n;

    wait_begin_coarse(&w);
    wait_snapshot(&w);
    n = next_write()(fd, buf, len);
    if (!wait_again(&w, n < 0 && errno == EINTR))
        return n;
    {
        struct sock_args a = { .fd = fd, .out = 1, .buf = (void *)buf, .len = len,
                               .keep_going = 1, .plain = 1 };

        return sock_again(&w, &a);
    }
}

/* What -D_FORTIFY_SOURCE programs call instead (glibc's own go to its
 * internal read and recvfrom, out of reach). */
extern void __chk_fail(void) __attribute__((noreturn));

SHIM_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
    if (len > buflen)
        __chk_fail();
    return read(fd, buf, len);
}

SHIM_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
    if (len > buflen)
        __chk_fail();
    return recv(fd, buf, len, flags);
}

SHIM_EXPORT ssize_t __recvfrom_chk(int fd, void *restrict buf, size_t len, size_t buflen,
                                   int flags, __SOCKADDR_ARG from, socklen_t *restrict fromlen)
{
    if (len > buflen)
        __chk_fail();
    return recvfrom(fd, buf, len, flags, from, fromlen);
}

/* ---- mq_notify: remembered, for mqueue.c to make again ---- */

SHIM_EXPORT int mq_notify(mqd_t fd, const struct sigevent *sev)
{
    int r = next_mq_notify()(fd, sev);

    if (r == 0)
        mqueue_note_notify(fd, sev);
    return r;
}
