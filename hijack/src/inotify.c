/*
 * inotify events queued when a checkpoint comes.
 *
 * WHY: CRIU saves an inotify instance's watches, not the events queued on
 * it.  A program checkpointed between a file's close() and its read of the
 * IN_CLOSE_WRITE waits for that event for ever after a restart (seen:
 * tests/e2e/programs/res_epoll.c, about once in twenty runs).  The kernel
 * has no way to put an event back into a queue, so the process keeps them
 * itself and hands them out before the kernel's:
 *
 * Out (checkpoint thread, the program's threads stopped):
 *  1. SUSPEND: a process lists the inotify fds (/proc/self/fd link
 *     "anon_inode:inotify") among those it has read through read() since
 *     it got them (a bit per fd number, set by the read wrapper), with the
 *     F_GETOWN the program had set.  Reading is what counts: the kept
 *     events are handed out by the read wrapper, so a process that reads
 *     otherwise (raw system calls: Go), or holds an instance it does not
 *     read (a fork child, an exec'd program that inherited it), must not
 *     take them.  Instances no process of the tree has read yet keep their
 *     events in the kernel (lost at a restart, as before).
 *  2. ELECT: it makes itself their owner (F_SETOWN), with the sockets
 *     (SUSPEND claimed them in fdowner.c's table): of
 *     the processes that read one instance, the one F_GETOWN names after
 *     the barrier is its leader and alone takes its events.
 *  3. CHECKPOINT: the leader reads what is queued (FIONREAD, then one read
 *     of that many bytes: it never waits) into anonymous memory of its own,
 *     part of its image, after what it kept already.
 * Back (RESUME, after a restart as after a checkpoint the program goes on):
 *  4. Owners as they were (fdowner_restore).  An instance with events kept is made readable
 *     again: a private watch on the instance's own inode (its
 *     /proc/self/fd link; nothing ever happens to that inode) is added and
 *     removed at once, which queues one IN_IGNORED for that watch's wd.
 *     poll, select and epoll, level- or edge-triggered, see the fd readable.
 *  5. read() (and __read_chk: wrap_ipc.c) on that fd first takes what
 *     the kernel has queued meanwhile (it is newer: it goes after what is
 *     kept), drops the private watch's event, then hands out the kept
 *     events in order, whole, as many as fit (EINVAL if the first does not,
 *     as the kernel says).  If some are left, it makes the fd readable
 *     again (4).  Once nothing is kept and no private event is queued, the
 *     fd is the kernel's alone again and reads take the fast path.
 *  A read that was blocked in the kernel when the checkpoint came returns
 *  after the resume with what the kernel had (the private event at least):
 *  it hands out the kept events first, and what it read goes after them.
 *  One order is not kept: a thread stopped in the few instructions between
 *  its read's return and the wrapper's look at this unit hands out the
 *  events it had read, which are older, after the kept ones (none is
 *  lost).
 *
 * Not kept (README, known limits): instances no process has read yet;
 * more than INQ_MAX instances in one process; readv().  An instance read
 * by two processes: its kept events go to the leader.
 *
 * Locks: program threads change the kept events only inside the gate
 * (suspend.c), so that the checkpoint thread never finds them half done,
 * and never hold it while blocked in the kernel.  The checkpoint thread
 * uses raw system calls, static and mmap'ed memory only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define INQ_MAX 64
#define LINK "anon_inode:inotify"

#ifndef IN_MASK_CREATE
#define IN_MASK_CREATE 0x10000000
#endif

/* An instance with events kept, or a private event still queued. */
struct inq {
    int key;        /* the fd + 1; 0: a free slot */
    int fd;
    int private_wd; /* the private watch whose IN_IGNORED is queued; 0: none */
    char *buf;      /* mmap'ed; kept events from head to tail */
    size_t cap, head, tail;
};

int inotify_live; /* slots in use: read() looks no further while 0 */
uint64_t inotify_read_bits[INOTIFY_READ_FDS / 64];
unsigned inotify_read_end;
static struct inq slots[INQ_MAX];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Listed at SUSPEND, with the owners the program had set. */
static int listed_fd[INQ_MAX];
static int n_listed;

void inotify_unnote_read(unsigned first, unsigned last)
{
    if (first >= INOTIFY_READ_FDS)
        return;
    if (last >= INOTIFY_READ_FDS)
        last = INOTIFY_READ_FDS - 1;
    for (unsigned fd = first; fd <= last; fd++) {
        uint64_t *word = &inotify_read_bits[fd >> 6];

        if ((fd & 63) == 0 && fd + 63 <= last) { /* a whole word */
            if (__atomic_load_n(word, __ATOMIC_RELAXED))
                __atomic_store_n(word, 0, __ATOMIC_RELAXED);
            fd += 63;
        } else if (__atomic_load_n(word, __ATOMIC_RELAXED) & (1ull << (fd & 63))) {
            __atomic_fetch_and(word, ~(1ull << (fd & 63)), __ATOMIC_RELAXED);
        }
    }
}

/* The slot of fd (-1: a free one), or NULL. */
static struct inq *find(int fd)
{
    for (int i = 0; i < INQ_MAX; i++)
        if (__atomic_load_n(&slots[i].key, __ATOMIC_ACQUIRE) == fd + 1)
            return &slots[i];
    return NULL;
}

static struct inq *take_slot(int fd)
{
    struct inq *e = find(fd);

    if (e != NULL || (e = find(-1)) == NULL)
        return e;
    e->fd = fd;
    e->private_wd = 0;
    e->head = e->tail = 0;
    /* counted before it is keyed: a copy of memory with the key has the
     * count (inotify_after_fork_child looks at the keys only then) */
    __atomic_add_fetch(&inotify_live, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&e->key, fd + 1, __ATOMIC_RELEASE);
    return e;
}

static void free_slot(struct inq *e)
{
    if (e->buf != NULL)
        syscall(SYS_munmap, e->buf, e->cap);
    e->buf = NULL;
    e->cap = e->head = e->tail = 0;
    e->private_wd = 0;
    __atomic_store_n(&e->key, 0, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&inotify_live, 1, __ATOMIC_RELEASE);
}

/* Room for more bytes after tail: kept events moved to the front, the
 * buffer made larger if need be.  0, or -1 (no memory). */
static int make_room(struct inq *e, size_t more)
{
    size_t kept = e->tail - e->head, want;
    char *bigger;

    if (e->head > 0) {
        memmove(e->buf, e->buf + e->head, kept);
        e->head = 0;
        e->tail = kept;
    }
    if (e->cap - e->tail >= more)
        return 0;
    want = (kept + more + 2 * 4096 - 1) & ~(size_t)4095;
    bigger = (char *)syscall(SYS_mmap, NULL, want, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bigger == MAP_FAILED)
        return -1;
    if (e->buf != NULL) {
        memcpy(bigger, e->buf, kept);
        syscall(SYS_munmap, e->buf, e->cap);
    }
    e->buf = bigger;
    e->cap = want;
    return 0;
}

/* Drop the private watch's events from n bytes of events, in place; the
 * bytes left. */
static size_t drop_private(struct inq *e, char *events, size_t n)
{
    size_t in = 0, out = 0;

    while (in + sizeof(struct inotify_event) <= n) {
        struct inotify_event ev;
        size_t len;

        memcpy(&ev, events + in, sizeof(ev));
        len = sizeof(ev) + ev.len;
        if (in + len > n)
            break; /* not an event: never from the kernel */
        if (e->private_wd != 0 && ev.wd == e->private_wd) {
            if (ev.mask & IN_IGNORED)
                e->private_wd = 0; /* its last event */
        } else {
            memmove(events + out, events + in, len);
            out += len;
        }
        in += len;
    }
    return out;
}

/* Everything the kernel has queued, after what is kept; never waits (what
 * FIONREAD counts is there, unless another thread reads the same fd at
 * the same instant). */
static void pull(struct inq *e)
{
    int avail = 0;
    long n;

    if (syscall(SYS_ioctl, e->fd, FIONREAD, &avail) < 0 || avail <= 0
        || make_room(e, (size_t)avail) < 0)
        return;
    n = syscall(SYS_read, e->fd, e->buf + e->tail, (size_t)avail);
    if (n > 0)
        e->tail += drop_private(e, e->buf + e->tail, (size_t)n);
}

/* Events a read gave, to go after what is kept; 0, or -1 (no memory). */
static int keep(struct inq *e, const char *events, size_t n)
{
    if (make_room(e, n) < 0)
        return -1;
    memcpy(e->buf + e->tail, events, n);
    e->tail += n;
    return 0;
}

/* Kept events into buf, whole, as many as fit: the bytes given. */
static size_t hand_out(struct inq *e, char *buf, size_t size)
{
    size_t out = 0;

    while (e->head < e->tail) {
        struct inotify_event ev;
        size_t len;

        memcpy(&ev, e->buf + e->head, sizeof(ev));
        len = sizeof(ev) + ev.len;
        if (out + len > size)
            break;
        memcpy(buf + out, e->buf + e->head, len);
        out += len;
        e->head += len;
    }
    if (e->head == e->tail)
        e->head = e->tail = 0;
    return out;
}

/* "/proc/self/fd/N" */
static void fd_path(int fd, char *path)
{
    char digits[12];
    int len = 0, at = 14;

    memcpy(path, "/proc/self/fd/", 14);
    do
        digits[len++] = (char)('0' + fd % 10);
    while ((fd /= 10) > 0);
    while (len > 0)
        path[at++] = digits[--len];
    path[at] = '\0';
}

/* Queue one private event (see 4), unless one is queued already. */
static void make_readable(struct inq *e)
{
    char path[32];
    long wd;

    if (e->private_wd != 0)
        return;
    fd_path(e->fd, path);
    wd = syscall(SYS_inotify_add_watch, e->fd, path, IN_DELETE_SELF | IN_MASK_CREATE);
    if (wd < 0 && errno == EINVAL) /* before Linux 4.18 */
        wd = syscall(SYS_inotify_add_watch, e->fd, path, IN_DELETE_SELF);
    if (wd <= 0)
        return;
    e->private_wd = (int)wd;
    syscall(SYS_inotify_rm_watch, e->fd, (int)wd);
}

/* After a slot's events went out: readable again while some are kept; the
 * slot free once nothing is kept and no private event is queued. */
static void settle(struct inq *e)
{
    if (e->head < e->tail)
        make_readable(e);
    else if (e->private_wd == 0)
        free_slot(e);
}

static void enter(void)
{
    gate_enter();
    pthread_mutex_lock(&lock);
}

static void leave(void)
{
    pthread_mutex_unlock(&lock);
    gate_leave();
}

/* What a read on fd returns when it found events kept, or -2: not an fd
 * of ours, or nothing kept any more (read the kernel's). */
static ssize_t read_kept(int fd, void *buf, size_t size)
{
    struct inq *e;
    ssize_t got = -2;

    if (find(fd) == NULL)
        return -2;
    enter();
    e = find(fd);
    if (e != NULL && (e->head < e->tail || e->private_wd != 0)) {
        pull(e);
        got = (ssize_t)hand_out(e, buf, size);
        if (got == 0 && e->head < e->tail) {
            errno = EINVAL; /* the next event does not fit */
            got = -1;
        } else if (got == 0) {
            got = -2;
        }
        settle(e);
    }
    leave();
    return got;
}

/* A read on fd gave n bytes while some fds have events kept: what it is to
 * return instead (the kept events first), or -2: nothing, read again. */
static ssize_t after_read(int fd, void *buf, size_t size, ssize_t n)
{
    struct inq *e;

    if (find(fd) == NULL)
        return n;
    enter();
    e = find(fd);
    if (e != NULL) {
        n = (ssize_t)drop_private(e, buf, (size_t)n);
        /* anything kept, or the private event still queued: all of it
         * (so that no private event stays behind to wake a poll for
         * nothing), kept events first */
        if ((e->head < e->tail || e->private_wd != 0) && keep(e, buf, (size_t)n) == 0) {
            pull(e);
            n = (ssize_t)hand_out(e, buf, size);
        }
        settle(e);
    }
    leave();
    return n > 0 ? n : -2;
}

static int nonblocking(int fd)
{
    long flags = syscall(SYS_fcntl, fd, F_GETFL);

    return flags >= 0 && (flags & O_NONBLOCK);
}

/* A read gave only the private event: nothing for the program, which
 * waits for the next event if its fd blocks (-2), as any read would. */
static ssize_t nothing_read(int fd)
{
    if (!nonblocking(fd))
        return -2;
    errno = EAGAIN;
    return -1;
}

ssize_t inotify_read(int fd, void *buf, size_t len, inotify_read_fn plain)
{
    for (;;) {
        ssize_t n = read_kept(fd, buf, len);

        if (n != -2)
            return n;
        n = plain(fd, buf, len);
        if (n <= 0)
            return n;
        n = after_read(fd, buf, len, n);
        if (n != -2 || (n = nothing_read(fd)) != -2)
            return n;
    }
}

ssize_t inotify_read_done(int fd, void *buf, size_t len, ssize_t n, inotify_read_fn plain)
{
    n = after_read(fd, buf, len, n);
    if (n != -2 || (n = nothing_read(fd)) != -2)
        return n;
    return inotify_read(fd, buf, len, plain);
}

/* fds first..last are closed or replaced: what was kept for them goes. */
void inotify_forget(unsigned first, unsigned last)
{
    int any = 0;

    for (int i = 0; i < INQ_MAX; i++) {
        int fd = __atomic_load_n(&slots[i].key, __ATOMIC_ACQUIRE) - 1;

        any |= fd >= 0 && (unsigned)fd >= first && (unsigned)fd <= last;
    }
    if (!any)
        return;
    enter();
    for (int i = 0; i < INQ_MAX; i++)
        if (slots[i].key != 0 && (unsigned)slots[i].fd >= first && (unsigned)slots[i].fd <= last)
            free_slot(&slots[i]);
    leave();
}

/* A fork child: the instance's kept events stay with the parent; the
 * child has read no fd yet.  (Each page is only looked at or written when
 * there is something to undo: every fork child of every process pays for
 * the pages it touches; issue 17's fork+exec loop.) */
void inotify_after_fork_child(void)
{
    unsigned end = __atomic_load_n(&inotify_read_end, __ATOMIC_ACQUIRE);

    if (__atomic_load_n(&inotify_live, __ATOMIC_ACQUIRE) != 0)
        for (int i = 0; i < INQ_MAX; i++)
            if (slots[i].key != 0)
                free_slot(&slots[i]);
    if (n_listed != 0)
        n_listed = 0;
    if (end != 0) {
        inotify_unnote_read(0, end - 1);
        __atomic_store_n(&inotify_read_end, 0, __ATOMIC_RELEASE);
    }
}

static void list_one(int fd)
{
    char link[sizeof(LINK) + 1];
    char path[32];
    long n;

    if (n_listed >= INQ_MAX)
        return;
    fd_path(fd, path);
    n = syscall(SYS_readlinkat, AT_FDCWD, path, link, sizeof(link));
    if (n != (long)sizeof(LINK) - 1 || memcmp(link, LINK, sizeof(LINK) - 1) != 0)
        return;
    if (fdowner_claim(fd) == 0) /* elected with the sockets */
        listed_fd[n_listed++] = fd;
}

/* (1): the numbers read (a number closed behind the wrappers' back, by
 * fclose or a raw system call, is simply not an inotify fd, or not one
 * this process reads: at worst it claims it too) */
void inotify_save(void)
{
    unsigned words = (__atomic_load_n(&inotify_read_end, __ATOMIC_ACQUIRE) + 63) / 64;

    n_listed = 0;
    for (unsigned w = 0; w < words; w++) {
        uint64_t bits = __atomic_load_n(&inotify_read_bits[w], __ATOMIC_RELAXED);

        for (int b = 0; bits != 0; b++, bits >>= 1)
            if (bits & 1)
                list_one(w * 64 + b);
    }
}

/* (3) */
void inotify_keep_queued(void)
{
    for (int i = 0; i < n_listed; i++) {
        struct inq *e;
        int avail = 0;

        if (!fdowner_leads(listed_fd[i]))
            continue; /* another process leads this instance */
        if (find(listed_fd[i]) == NULL
            && (syscall(SYS_ioctl, listed_fd[i], FIONREAD, &avail) < 0 || avail <= 0))
            continue; /* nothing queued, nothing kept */
        e = take_slot(listed_fd[i]);
        if (e == NULL)
            continue; /* too many: its events stay in the kernel */
        pull(e);
        if (e->head == e->tail && e->private_wd == 0)
            free_slot(e);
    }
}

void inotify_resume(void)
{
    n_listed = 0; /* their owners: fdowner_restore */
    for (int i = 0; i < INQ_MAX; i++)
        if (slots[i].key != 0 && slots[i].head < slots[i].tail)
            make_readable(&slots[i]);
}
