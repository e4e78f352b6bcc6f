/*
 * POSIX message queues across a checkpoint.
 *
 * WHY: a queue lives on its IPC namespace's internal mqueue mount, which
 * CRIU neither saves nor finds: it refuses to dump a tree holding an mq fd
 * ("Can't lookup mount=... for fd=N path=/name (deleted)"), and a tree
 * restarted in a fresh IPC namespace would find no queue anyway.  So each
 * process takes its queues out of CRIU's sight at CHECKPOINT, and puts
 * them back when it reconnects to its agent: after the dump (the program
 * goes on) or after the restore.
 *
 * Out (mqueue_detach, CHECKPOINT, before READY):
 *  1. Every fd on a queue (fstatfs: MQUEUE_MAGIC) is noted: its number,
 *     F_GETFL (access mode, O_NONBLOCK), FD_CLOEXEC and F_GETOWN; and its
 *     queue: name (readlink of /proc/self/fd/N), inode, mode, owner,
 *     mq_maxmsg, mq_msgsize.  Fds of this process that share one open file
 *     description (kcmp) are noted as copies of the first.  Nothing is
 *     recorded at mq_open: what the kernel shows is enough, and also covers
 *     queues opened before exec or by a raw system call.
 *  2. One process per queue empties it, in order (priority, then arrival),
 *     into anonymous memory of its own: part of its image, so the messages
 *     survive a restart too.  Which process: the first to take flock()
 *     on an open file description of its own on the queue (an open of
 *     /proc/self/fd/N, O_NONBLOCK: it never waits for a message).  The
 *     others find the queue empty.  F_SETOWN, the sockets' election
 *     (fdowner.c), does work on an mq fd, but elects one process per open
 *     file description: two processes that each mq_open()ed the queue would
 *     both lead and empty it at the same time, mixing up its order.
 *  3. Each fd is taken out of the epoll sets that watch it (park.c's
 *     epoll_watches_take: closing it would drop those registrations),
 *     closed, and its number held by /dev/null (as park.c does) so that
 *     nothing else takes it.
 * Back (mqueue_reattach, on reconnecting; also when released without an
 * agent):
 *  4. Each queue is opened again by name, O_CREAT with its saved
 *     attributes, mode (umask cleared) and owner, so that in a restarted
 *     tree's fresh IPC namespace it exists again; the new fd goes on the
 *     old number with its flags, owner and FD_CLOEXEC, copies are dup'ed,
 *     and each goes back into the epoll sets it was in.
 *     A queue that was unlinked while open comes back under a name of
 *     ours, "/dmtcp.mq.<inode at the checkpoint>": every process that held
 *     it computes the same one.
 *  5. The process that emptied a queue sends its messages back, through a
 *     descriptor of its own with O_NONBLOCK: a queue full after all loses
 *     the rest rather than stopping the checkpoint thread.
 * Resume (mqueue_resume, RESUME: every process of the tree is back):
 *  6. Closing an fd dropped this process's mq_notify registration: it is
 *     made again (SIGEV_SIGNAL with the signal and, if the program
 *     registered through the wrapper in wrap_ipc.c, its sigev_value;
 *     SIGEV_NONE), after the messages went back, so their return notifies
 *     nobody.  SIGEV_THREAD registrations (glibc's helper thread and
 *     netlink socket) are not made again.
 *  7. Our names for unlinked queues are unlinked.
 *
 * Not kept: an open file description shared between processes (each
 * comes back with its own, so O_NONBLOCK set later by one is not seen by
 * the other); queues no process holds open at the checkpoint.
 *
 * Runs on the checkpoint thread while every other thread is stopped: raw
 * system calls, static and mmap'ed memory only (the notes that the
 * mq_notify wrapper writes are read without waiting for their lock).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <mqueue.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define MQ_MAX_FDS 256
#define MQ_MAX_QUEUES 64
#define MQ_NAME 272             /* "/" NAME_MAX " (deleted)" */
#define LOCK_PATIENCE_MS 2000   /* a queue another holder never unlocks: emptied anyway */
#define NOTE_MAX 64
#define MQ_MAX_WATCHES 1024
#define MQUEUE_MAGIC 0x19800202 /* ipc/mqueue.c: the file system's f_type */

struct mq_queue {
    unsigned long ino;   /* at the checkpoint */
    char name[MQ_NAME];  /* "/name": the program's, or ours if it was unlinked */
    int unlinked;
    long maxmsg, msgsize;
    unsigned mode, uid, gid;
    int notify;          /* this process's registration: SIGEV_*, or -1 */
    int signo;
    union sigval value;
    char *stash;         /* the messages this process emptied out of it */
    size_t stash_size;
    long stashed;
};

struct mq_fd {
    int fd, queue;
    int copy_of;         /* index of an fd sharing its open file description, or -1 */
    int status_flags, fd_flags, owner;
};

/* A message in a stash: this header, then len bytes, padded to 8. */
struct stashed {
    uint32_t len, prio;
};

static struct mq_queue queues[MQ_MAX_QUEUES];
static struct mq_fd fds[MQ_MAX_FDS];
static int n_queues, n_fds;
static struct epoll_watch watches[MQ_MAX_WATCHES];
static int n_watches;
static int detached, reattached;

/* mq_notify's sigev_value, by queue inode (wrap_ipc.c writes, under
 * note_lock; the checkpoint thread reads only when it is free). */
struct note {
    unsigned long ino;
    union sigval value;
};
static struct note notes[NOTE_MAX];
static int note_lock;

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* prefix followed by the decimal n, into buf (no stdio here). */
static char *with_number(char *buf, const char *prefix, unsigned long n)
{
    char digits[24];
    size_t len = strlen(prefix);
    int nd = 0;

    memcpy(buf, prefix, len);
    do
        digits[nd++] = (char)('0' + n % 10);
    while ((n /= 10) > 0);
    while (nd > 0)
        buf[len++] = digits[--nd];
    buf[len] = '\0';
    return buf;
}

static long raw_mq_open(const char *name, int flags, unsigned mode, struct mq_attr *attr)
{
    return syscall(SYS_mq_open, name + 1, flags, mode, attr); /* the kernel's name: no '/' */
}

/* ---- the mq_notify notes ---- */

void mqueue_note_notify(mqd_t fd, const struct sigevent *sev)
{
    struct stat st;
    int free_slot = -1, i;

    if (syscall(SYS_fstat, fd, &st) != 0)
        return;
    while (__atomic_test_and_set(&note_lock, __ATOMIC_ACQUIRE))
        ; /* held a few instructions at a time */
    for (i = 0; i < NOTE_MAX; i++) {
        if (notes[i].ino == (unsigned long)st.st_ino)
            break;
        if (notes[i].ino == 0 && free_slot < 0)
            free_slot = i;
    }
    if (i == NOTE_MAX)
        i = free_slot;
    if (i >= 0) {
        int keep = sev && sev->sigev_notify == SIGEV_SIGNAL;

        notes[i].ino = keep ? (unsigned long)st.st_ino : 0;
        notes[i].value = keep ? sev->sigev_value : (union sigval){ 0 };
    }
    __atomic_clear(&note_lock, __ATOMIC_RELEASE);
}

/* The noted sigev_value of a queue (0 if none or the notes are busy);
 * with update, the note moves to the queue's new inode. */
static union sigval noted_value(unsigned long ino, unsigned long update)
{
    union sigval v = { 0 };

    if (__atomic_test_and_set(&note_lock, __ATOMIC_ACQUIRE))
        return v; /* a stopped thread was writing them */
    for (int i = 0; i < NOTE_MAX; i++)
        if (notes[i].ino == ino) {
            v = notes[i].value;
            if (update)
                notes[i].ino = update;
            break;
        }
    __atomic_clear(&note_lock, __ATOMIC_RELEASE);
    return v;
}

/* ---- out ---- */

/* An fd of this process on queue index q, as it is now. */
static int fd_of(int q)
{
    for (int i = 0; i < n_fds; i++)
        if (fds[i].queue == q)
            return fds[i].fd;
    return -1;
}

static int is_mqueue(int fd, struct stat *st)
{
    struct statfs sfs;

    return syscall(SYS_fstat, fd, st) == 0 && S_ISREG(st->st_mode)
           && syscall(SYS_fstatfs, fd, &sfs) == 0 && sfs.f_type == MQUEUE_MAGIC;
}

/* A linked queue's name: the last component of the link (a queue opened
 * through a mounted mqueue file system shows the mount's path); 0 if
 * there is none. */
static int read_name(int fd, struct mq_queue *q)
{
    char path[40], link[MQ_NAME];
    long n = syscall(SYS_readlinkat, AT_FDCWD, with_number(path, "/proc/self/fd/", (unsigned)fd),
                     link, sizeof(link) - 1);
    const char *base;

    if (n <= 1)
        return 0;
    link[n] = '\0';
    base = strrchr(link, '/');
    if (base == NULL || base[1] == '\0')
        return 0;
    memcpy(q->name, base, strlen(base) + 1);
    return 1;
}

static int find_queue(unsigned long ino)
{
    for (int i = 0; i < n_queues; i++)
        if (queues[i].ino == ino)
            return i;
    return -1;
}

static int new_queue(int fd, const struct stat *st)
{
    struct mq_queue *q = &queues[n_queues];
    struct mq_attr attr;

    memset(q, 0, sizeof(*q));
    q->ino = (unsigned long)st->st_ino;
    q->unlinked = st->st_nlink == 0;
    q->mode = st->st_mode & 07777;
    q->uid = st->st_uid;
    q->gid = st->st_gid;
    q->notify = -1;
    if (syscall(SYS_mq_getsetattr, fd, NULL, &attr) != 0)
        return -1;
    q->maxmsg = attr.mq_maxmsg;
    q->msgsize = attr.mq_msgsize;
    if (q->unlinked)
        with_number(q->name, "/dmtcp.mq.", q->ino);
    else if (!read_name(fd, q))
        return -1;
    return n_queues++;
}

static void note_fd(int fd, void *unused)
{
    struct stat st;
    struct mq_fd *f = &fds[n_fds];
    int pid = (int)syscall(SYS_getpid);

    (void)unused;
    if (n_fds >= MQ_MAX_FDS || fd == channel_agent_fd() || !is_mqueue(fd, &st))
        return;
    f->fd = fd;
    f->queue = find_queue((unsigned long)st.st_ino);
    if (f->queue < 0 && (n_queues >= MQ_MAX_QUEUES || (f->queue = new_queue(fd, &st)) < 0))
        return; /* left open: CRIU will say why it cannot dump */
    f->status_flags = (int)syscall(SYS_fcntl, fd, F_GETFL);
    f->fd_flags = (int)syscall(SYS_fcntl, fd, F_GETFD);
    f->owner = (int)syscall(SYS_fcntl, fd, F_GETOWN);
    f->copy_of = -1;
    for (int i = 0; i < n_fds && f->copy_of < 0; i++)
        if (fds[i].queue == f->queue && fds[i].copy_of < 0
            && syscall(SYS_kcmp, pid, pid, KCMP_FILE, fds[i].fd, fd) == 0)
            f->copy_of = i;
    n_fds++;
}

/* For epoll_watches_take: an fd noted here, still on the same queue. */
static int is_noted(int fd, unsigned long ino)
{
    for (int i = 0; i < n_fds; i++)
        if (fds[i].fd == fd)
            return queues[fds[i].queue].ino == ino;
    return 0;
}

/* "NOTIFY:n SIGNO:n NOTIFY_PID:n", what reading a queue's fd says. */
static long field(const char *text, const char *name)
{
    const char *s = strstr(text, name);
    long v = 0;

    if (s == NULL)
        return -1;
    for (s += strlen(name); *s >= '0' && *s <= '9'; s++)
        v = v * 10 + (*s - '0');
    return v;
}

/* This process's registration on the queue, if any (before any close
 * drops it). */
static void read_notify(int own, struct mq_queue *q)
{
    char text[160];
    long n = syscall(SYS_pread64, own, text, sizeof(text) - 1, 0);

    if (n <= 0)
        return;
    text[n] = '\0';
    if (field(text, "NOTIFY_PID:") != syscall(SYS_getpid))
        return;
    q->notify = (int)field(text, "NOTIFY:");
    q->signo = (int)field(text, "SIGNO:");
    if (q->notify == SIGEV_SIGNAL)
        q->value = noted_value(q->ino, 0);
}

/* Take every message out of the queue into a stash of this process's. */
static void empty_queue(struct mq_queue *q, int fd)
{
    char path[40];
    int own = (int)syscall(SYS_openat, AT_FDCWD, with_number(path, "/proc/self/fd/", (unsigned)fd),
                           O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct mq_attr attr;
    size_t slot = sizeof(struct stashed) + pad8((size_t)q->msgsize), used = 0;

    if (own < 0)
        return; /* no read access: another holder empties it, or nobody */
    read_notify(own, q);
    for (int waited = 0; syscall(SYS_flock, own, LOCK_EX | LOCK_NB) != 0; waited++) {
        if (errno != EWOULDBLOCK || waited >= LOCK_PATIENCE_MS)
            break;
        pause_ms(1);
    }
    if (syscall(SYS_mq_getsetattr, own, NULL, &attr) == 0 && attr.mq_curmsgs > 0) {
        void *m;

        q->stash_size = (size_t)attr.mq_curmsgs * slot;
        m = (void *)syscall(SYS_mmap, NULL, q->stash_size, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        q->stash = m == MAP_FAILED ? NULL : m;
    }
    while (q->stash && used + slot <= q->stash_size) {
        struct stashed *h = (struct stashed *)(q->stash + used);
        unsigned prio;
        long n = syscall(SYS_mq_timedreceive, own, (char *)(h + 1), (size_t)q->msgsize, &prio,
                         NULL);

        if (n < 0)
            break; /* EAGAIN: empty */
        h->len = (uint32_t)n;
        h->prio = prio;
        used += sizeof(*h) + pad8((size_t)n);
        q->stashed++;
    }
    syscall(SYS_close, own); /* and its lock */
}

int mqueue_detach(void)
{
    int null;

    n_fds = n_queues = 0;
    detached = reattached = 0;
    procdir_each("/proc/self/fd", note_fd, NULL);
    if (n_fds == 0)
        return 0;
    n_watches = epoll_watches_take(is_noted, watches, MQ_MAX_WATCHES);
    for (int i = 0; i < n_queues; i++)
        empty_queue(&queues[i], fd_of(i));
    null = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR | O_CLOEXEC);
    for (int i = 0; i < n_fds; i++) {
        int cloexec = fds[i].fd_flags > 0 && (fds[i].fd_flags & FD_CLOEXEC);

        if (null >= 0)
            syscall(SYS_dup3, null, fds[i].fd, cloexec ? O_CLOEXEC : 0);
        else
            syscall(SYS_close, fds[i].fd);
    }
    if (null >= 0)
        syscall(SYS_close, null);
    detached = 1;
    return n_fds;
}

/* ---- back ---- */

static int reopen(const struct mq_fd *f)
{
    struct mq_queue *q = &queues[f->queue];
    struct mq_attr attr = { .mq_maxmsg = q->maxmsg, .mq_msgsize = q->msgsize };
    int flags = (f->status_flags & (O_ACCMODE | O_NONBLOCK)) | O_CREAT | O_CLOEXEC;
    int fd = (int)raw_mq_open(q->name, flags, q->mode, &attr);

    if (fd < 0)
        return -1;
    syscall(SYS_fchown, fd, q->uid, q->gid); /* as it was; EPERM if we may not */
    return fd;
}

static void put_back(struct mq_queue *q)
{
    int fd = (int)raw_mq_open(q->name, O_WRONLY | O_NONBLOCK | O_CLOEXEC, 0, NULL);
    size_t used = 0;
    long sent = 0;

    for (; fd >= 0 && sent < q->stashed; sent++) {
        struct stashed *h = (struct stashed *)(q->stash + used);

        if (syscall(SYS_mq_timedsend, fd, (const char *)(h + 1), (size_t)h->len, h->prio, NULL)
            != 0)
            break; /* full after all: the rest is lost */
        used += sizeof(*h) + pad8(h->len);
    }
    if (fd >= 0)
        syscall(SYS_close, fd);
    syscall(SYS_munmap, q->stash, q->stash_size);
    q->stash = NULL;
    q->stashed = 0;
}

void mqueue_reattach(void)
{
    long old_mask;

    if (!detached || reattached)
        return;
    reattached = 1;
    old_mask = syscall(SYS_umask, 0);
    for (int i = 0; i < n_fds; i++) {
        const struct mq_fd *f = &fds[i];
        int cloexec = f->fd_flags > 0 && (f->fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0;
        int fd = f->copy_of >= 0 ? -1 : reopen(f);

        if (f->copy_of >= 0) { /* the same open file description again */
            syscall(SYS_dup3, fds[f->copy_of].fd, f->fd, cloexec);
        } else if (fd >= 0) {
            syscall(SYS_dup3, fd, f->fd, cloexec);
            syscall(SYS_close, fd);
            if (f->owner != 0)
                syscall(SYS_fcntl, f->fd, F_SETOWN, f->owner);
        } else {
            continue; /* /dev/null stays: the program sees EBADF from mq calls */
        }
        epoll_watches_put_back(watches, n_watches, f->fd);
    }
    syscall(SYS_umask, old_mask);
    for (int i = 0; i < n_queues; i++)
        if (queues[i].stash)
            put_back(&queues[i]);
}

void mqueue_resume(void)
{
    if (!detached)
        return;
    mqueue_reattach(); /* released without an agent: still back */
    for (int i = 0; i < n_queues; i++) {
        struct mq_queue *q = &queues[i];
        int fd = fd_of(i);
        struct stat st;

        if (fd >= 0 && (q->notify == SIGEV_SIGNAL || q->notify == SIGEV_NONE)) {
            struct sigevent sev;

            memset(&sev, 0, sizeof(sev));
            sev.sigev_notify = q->notify;
            sev.sigev_signo = q->signo;
            sev.sigev_value = q->value;
            if (syscall(SYS_mq_notify, fd, &sev) == 0 && q->notify == SIGEV_SIGNAL
                && syscall(SYS_fstat, fd, &st) == 0)
                noted_value(q->ino, (unsigned long)st.st_ino); /* the note follows */
        }
        if (q->unlinked)
            syscall(SYS_mq_unlink, q->name + 1);
    }
    n_fds = n_queues = 0;
    detached = 0;
}
