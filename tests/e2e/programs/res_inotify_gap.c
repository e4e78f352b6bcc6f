/*
 * inotify events queued when a checkpoint comes must still be read after it.
 * usage: res_inotify_gap DIR ROUNDS MODE
 *
 * The program watches DIR (IN_CLOSE_WRITE) through an inotify fd, waited
 * on as MODE says:
 *   epoll     non-blocking fd, epoll (level-triggered), one read per wake-up
 *   edge      non-blocking fd, epoll with EPOLLET, reads until EAGAIN
 *   blocking  blocking fd, poll() then read(): a read that blocks when poll
 *             said readable hangs the program (SIGALRM ends it)
 *   small     as epoll, with a read buffer that holds one event only
 *   forked    as epoll, in a child forked after the set-up; the parent
 *             holds the same instance, never reads it, and waits for the
 *             child (exits with its status)
 *   many      as epoll, with 500 events queued instead of 2
 *   reader    as epoll; after round 1 (the fd read already) it forks a
 *             child that holds the same instance and never reads it: the
 *             kept events stay the reader's (the child inherits no mark
 *             of the parent's reads); the child is killed at the end
 * Each round N:
 *   1. writes and closes DIR/N.0 and DIR/N.1 (many: up to DIR/N.499): an
 *      event is queued for each;
 *   2. prints "closed N" and waits, without reading the inotify fd, until
 *      DIR/go.N exists (the test checkpoints here, and restarts; it makes
 *      go.N a directory, which queues no IN_CLOSE_WRITE);
 *   3. writes and closes the next file, DIR/N.2 (many: DIR/N.500): a newer
 *      event;
 *   4. waits for the fd (5 s at most) and reads until it has all the
 *      round's events: they must name those files in that order, on its
 *      own watch, with nothing else; prints "event N".
 * Prints "done ROUNDS" at the end.  Any other event, order, a missing
 * event or a silent fd: "FAIL[pid]: ..." on stderr, exit 3.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "res_common.h"

static const char *dir;
static int in_fd, ep, wd;

static void write_file(long round, int index)
{
    char path[4096];
    int fd;

    snprintf(path, sizeof(path), "%s/%ld.%d", dir, round, index);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    RES_CHECK(fd >= 0 && res_write_full(fd, "x\n", 2) == 0, "write %s", path);
    close(fd);
}

static void wait_go(long round)
{
    char path[4096];
    struct stat st;

    snprintf(path, sizeof(path), "%s/go.%ld", dir, round);
    while (stat(path, &st) < 0)
        res_sleep_ms(5);
}

enum mode { EPOLL, EDGE, BLOCKING, SMALL, FORKED, MANY, READER };
static enum mode mode;
static int queued; /* events queued before the checkpoint, each round */

/* Wait up to 200 ms for the fd: 1 when readable. */
static int wait_readable(void)
{
    int n;

    if (mode == BLOCKING) {
        struct pollfd p = { in_fd, POLLIN, 0 };

        n = poll(&p, 1, 200);
    } else {
        struct epoll_event ev;

        n = epoll_wait(ep, &ev, 1, 200);
    }
    RES_CHECK(n >= 0 || errno == EINTR, "waiting for the fd: errno %d", errno);
    return n > 0;
}

/* Check the events in buf[0..len): the next ones of the round, in order. */
static void check_events(long round, const char *buf, ssize_t len, int *got)
{
    for (const char *p = buf; p < buf + len;) {
        const struct inotify_event *e = (const struct inotify_event *)p;
        char name[64];

        snprintf(name, sizeof(name), "%ld.%d", round, *got);
        RES_CHECK(*got < queued + 1 && e->wd == wd && e->mask == IN_CLOSE_WRITE && e->len > 0
                      && strcmp(e->name, name) == 0,
                  "round %ld: event %d is wd %d mask %#x name '%s', not '%s'", round, *got,
                  e->wd, e->mask, e->len ? e->name : "", name);
        (*got)++;
        p += sizeof(*e) + e->len;
    }
}

/* Read until the round's events came, in order. */
static void expect_events(long round)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    /* one event with a name of up to 15 bytes ("N.x" padded to 16) */
    size_t size = mode == SMALL ? sizeof(struct inotify_event) + 16 : sizeof(buf);
    int got = 0;
    long deadline = res_now_ms() + 5000;

    while (got < queued + 1) {
        ssize_t len;

        RES_CHECK(res_now_ms() < deadline, "round %ld: only %d of %d events came", round, got,
                  queued + 1);
        if (!wait_readable())
            continue;
        do {
            len = read(in_fd, buf, size);
            RES_CHECK(len >= 0 || errno == EAGAIN || errno == EINTR, "read: errno %d", errno);
            if (len > 0)
                check_events(round, buf, len, &got);
        } while (mode == EDGE && (len > 0 || errno == EINTR));
    }
}

int main(int argc, char **argv)
{
    struct epoll_event ev = { .events = EPOLLIN };
    static const char *const modes[] = { "epoll", "edge", "blocking", "small", "forked",
                                         "many", "reader" };
    long rounds;
    pid_t idle = 0; /* reader: the child that never reads */

    if (argc != 4 || (rounds = atol(argv[2])) < 1)
        res_fail("usage: %s DIR ROUNDS epoll|edge|blocking|small|forked|many|reader", argv[0]);
    for (mode = EPOLL; mode <= READER && strcmp(argv[3], modes[mode]) != 0; mode++)
        ;
    RES_CHECK(mode <= READER, "unknown mode %s", argv[3]);
    queued = mode == MANY ? 500 : 2;
    dir = argv[1];
    setvbuf(stdout, NULL, _IOLBF, 0);
    in_fd = inotify_init1(IN_CLOEXEC | (mode == BLOCKING ? 0 : IN_NONBLOCK));
    RES_CHECK(in_fd >= 0, "inotify_init1");
    wd = inotify_add_watch(in_fd, dir, IN_CLOSE_WRITE);
    ep = epoll_create1(EPOLL_CLOEXEC);
    ev.events |= mode == EDGE ? EPOLLET : 0;
    RES_CHECK(wd >= 0 && ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, in_fd, &ev) == 0,
              "inotify_add_watch / epoll");
    if (mode == FORKED) {
        pid_t child = fork();
        int status;

        RES_CHECK(child >= 0, "fork");
        if (child > 0) {
            while (waitpid(child, &status, 0) < 0)
                RES_CHECK(errno == EINTR, "waitpid: errno %d", errno);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
        }
    }
    for (long round = 1; round <= rounds; round++) {
        for (int i = 0; i < queued; i++)
            write_file(round, i);
        printf("closed %ld\n", round);
        wait_go(round);
        write_file(round, queued);
        alarm(30); /* a read that blocks for nothing ends the program */
        expect_events(round);
        alarm(0);
        printf("event %ld\n", round);
        if (mode == READER && round == 1) {
            pid_t parent = getpid();

            idle = fork();
            RES_CHECK(idle >= 0, "fork");
            if (idle == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                    _exit(0);
                for (;;)
                    pause();
            }
            printf("forked\n");
        }
    }
    if (idle > 0) {
        kill(idle, SIGKILL);
        while (waitpid(idle, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    printf("done %ld\n", rounds);
    return 0;
}
