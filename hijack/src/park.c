/*
 * DRAINED, the process's part: its network sockets leave it for the dump.
 *
 * CRIU must never see a socket that leads out of the tree (it cannot
 * restore one, and a TCP connection would need a network lock we do not
 * have).  So each socket the agent names is passed to the agent
 * (SCM_RIGHTS), taken out of every epoll set that watches it, and its fd
 * number is held by /dev/null while CRIU dumps.  Afterwards the agent
 * passes a socket back for each number (the original after a checkpoint,
 * a new connection after a restart): it goes on the same number with the
 * same file flags, and into the same epoll sets with the same events and
 * data, read back from /proc/self/fdinfo (so epoll_ctl need not be wrapped).
 *
 * Runs on the checkpoint thread while every other thread is stopped: raw
 * system calls and static memory only.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define MAX_WATCHES 16384

struct parked {
    int fd;
    int status_flags; /* F_GETFL: O_NONBLOCK, O_ASYNC belong to the file */
    int fd_flags;     /* F_GETFD: FD_CLOEXEC belongs to the number */
    unsigned long ino;
    int back;         /* a socket was put back on it */
};

static struct parked parked[DMTCP_PARK_MAX];
static int n_parked;
static struct epoll_watch watches[MAX_WATCHES];
static int n_watches;

static struct parked *find_parked(int fd)
{
    for (int i = 0; i < n_parked; i++)
        if (parked[i].fd == fd)
            return &parked[i];
    return NULL;
}

static int is_epoll(int fd)
{
    static char path[64], link[64];
    long n;
    char *p = path + sizeof(path);

    /* "/proc/self/fd/<fd>", built backwards without stdio */
    *--p = '\0';
    do
        *--p = (char)('0' + fd % 10);
    while ((fd /= 10) > 0);
    p -= 14;
    memcpy(p, "/proc/self/fd/", 14);
    n = syscall(SYS_readlinkat, AT_FDCWD, p, link, sizeof(link) - 1);
    if (n <= 0)
        return 0;
    link[n] = '\0';
    return strcmp(link, "anon_inode:[eventpoll]") == 0;
}

static uint64_t parse_hex(const char **s)
{
    uint64_t v = 0;

    for (;; (*s)++) {
        char c = **s;
        if (c >= '0' && c <= '9')
            v = v * 16 + (uint64_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v = v * 16 + (uint64_t)(c - 'a' + 10);
        else
            return v;
    }
}

static const char *skip_to(const char *s, const char *end, const char *word)
{
    size_t w = strlen(word);

    for (; s + w <= end; s++)
        if (memcmp(s, word, w) == 0)
            return s + w;
    return NULL;
}

/* What epoll_watches_take is collecting. */
struct watch_scan {
    int (*wanted)(int fd, unsigned long ino);
    struct epoll_watch *w;
    int n, max;
};

/* One "tfd: N events: X data: Y pos:P ino:I sdev:D" line of an epoll's fdinfo. */
static void watch_line(struct watch_scan *scan, int epfd, const char *line, const char *end)
{
    const char *s = skip_to(line, end, "tfd:");
    int tfd = 0;
    uint32_t events;
    uint64_t data, ino;

    if (s == NULL)
        return;
    while (s < end && *s == ' ')
        s++;
    while (s < end && *s >= '0' && *s <= '9')
        tfd = tfd * 10 + (*s++ - '0');
    if ((s = skip_to(s, end, "events:")) == NULL)
        return;
    while (*s == ' ')
        s++;
    events = (uint32_t)parse_hex(&s);
    if ((s = skip_to(s, end, "data:")) == NULL)
        return;
    while (*s == ' ')
        s++;
    data = parse_hex(&s);
    if ((s = skip_to(s, end, "ino:")) == NULL)
        return;
    ino = parse_hex(&s);
    /* the same number may hold another file than the one registered */
    if (!scan->wanted(tfd, (unsigned long)ino) || scan->n >= scan->max)
        return;
    scan->w[scan->n++] = (struct epoll_watch){ epfd, tfd, events, data };
}

static void read_watches(struct watch_scan *scan, int epfd)
{
    static char buf[65536];
    char path[48] = "/proc/self/fdinfo/";
    char digits[12];
    int nd = 0, fd, len = 0;
    long n;

    for (int v = epfd; nd == 0 || v > 0; v /= 10)
        digits[nd++] = (char)('0' + v % 10);
    for (int i = 0; i < nd; i++)
        path[18 + i] = digits[nd - 1 - i];
    path[18 + nd] = '\0';
    fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    /* lines may straddle reads: keep the unfinished one at the front */
    while ((n = syscall(SYS_read, fd, buf + len, sizeof(buf) - 1 - (size_t)len)) > 0) {
        char *start = buf, *end = buf + len + n, *nl;

        while ((nl = memchr(start, '\n', (size_t)(end - start))) != NULL) {
            watch_line(scan, epfd, start, nl);
            start = nl + 1;
        }
        len = (int)(end - start);
        memmove(buf, start, (size_t)len);
        if (len == (int)sizeof(buf) - 1)
            len = 0; /* a line this long is not one of ours */
    }
    syscall(SYS_close, fd);
}

static void scan_epoll(int fd, void *scan)
{
    if (is_epoll(fd))
        read_watches(scan, fd);
}

/*
 * Every registration, in this process's epoll sets, of the fds that
 * wanted(fd, inode) names, noted into w (at most max) and taken out of its
 * set: an entry is keyed by (file, number), and what stands in for the
 * file meanwhile cannot take its place there.  Returns how many; a
 * registration another process took out first (a shared epoll) is noted
 * with epfd -1.  Sockets here, POSIX message queues too (mqueue.c).
 */
int epoll_watches_take(int (*wanted)(int fd, unsigned long ino), struct epoll_watch *w, int max)
{
    struct watch_scan scan = { wanted, w, 0, max };

    procdir_each("/proc/self/fd", scan_epoll, &scan);
    for (int i = 0; i < scan.n; i++)
        if (syscall(SYS_epoll_ctl, w[i].epfd, EPOLL_CTL_DEL, w[i].fd, NULL) != 0)
            w[i].epfd = -1;
    return scan.n;
}

/* The registrations of number fd back, with their events and data, on
 * the file it holds now. */
void epoll_watches_put_back(const struct epoll_watch *w, int n, int fd)
{
    for (int i = 0; i < n; i++) {
        struct epoll_event ev;

        if (w[i].fd != fd || w[i].epfd < 0)
            continue;
        ev.events = w[i].events;
        ev.data.u64 = w[i].data;
        syscall(SYS_epoll_ctl, w[i].epfd, EPOLL_CTL_ADD, fd, &ev);
    }
}

static int is_parked(int fd, unsigned long ino)
{
    struct parked *p = find_parked(fd);

    return p != NULL && p->ino == ino;
}

int park_sockets(int agent, const int *fds, int n)
{
    int pid = (int)syscall(SYS_getpid);
    int count = 0;

    n_parked = 0;
    n_watches = 0;
    for (int i = 0; i < n && n_parked < DMTCP_PARK_MAX; i++) {
        struct stat st;

        if (fds[i] < 0 || fds[i] == agent || syscall(SYS_fstat, fds[i], &st) != 0
            || !S_ISSOCK(st.st_mode) || find_parked(fds[i]))
            continue;
        parked[n_parked] = (struct parked){
            fds[i], (int)syscall(SYS_fcntl, fds[i], F_GETFL),
            (int)syscall(SYS_fcntl, fds[i], F_GETFD), (unsigned long)st.st_ino, 0 };
        n_parked++;
    }
    /* out of the epoll sets first: /dev/null cannot stand in there */
    if (n_parked > 0)
        n_watches = epoll_watches_take(is_parked, watches, MAX_WATCHES);
    for (int i = 0; i < n_parked; i++) {
        struct parked *p = &parked[i];
        uint64_t arg = (uint64_t)(uint32_t)p->fd;
        int null;

        if ((int)syscall(SYS_fcntl, p->fd, F_GETOWN) == pid)
            arg |= DMTCP_PARK_LEADER;
        if (channel_send_fd(agent, DMTCP_REC_PARKED_FD, arg, p->fd) < 0)
            return -1;
        null = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0) {
            syscall(SYS_dup3, null, p->fd, (p->fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0);
            syscall(SYS_close, null);
        }
        count++;
    }
    return count;
}

int park_take_back(int fd_number, int sock)
{
    struct parked *p = find_parked(fd_number);

    if (p == NULL) {
        syscall(SYS_close, sock);
        return -1;
    }
    if (sock != fd_number) {
        syscall(SYS_dup3, sock, fd_number, (p->fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0);
        syscall(SYS_close, sock);
    }
    syscall(SYS_fcntl, fd_number, F_SETFL, p->status_flags);
    epoll_watches_put_back(watches, n_watches, fd_number);
    p->back = 1;
    return 0;
}

int park_finish(void)
{
    int left = 0;

    for (int i = 0; i < n_parked; i++)
        if (!parked[i].back)
            left++;
    n_parked = 0;
    n_watches = 0;
    return left;
}
