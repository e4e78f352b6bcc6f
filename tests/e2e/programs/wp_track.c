/*
 * wp_track SOCKET OUT MIB: the process whose written pages CRIU tells by
 * userfaultfd write-protection (tests/e2e/test_wp_track.py).
 *
 * Fills MIB MiB with non-repeating words, makes a userfaultfd in
 * asynchronous write-protect mode and hands it over to whoever listens on
 * the Unix socket SOCKET (SCM_RIGHTS), as the shim hands its own to its
 * agent; it keeps no copy (CRIU could not dump one).  Then, at each
 * SIGUSR1, rewrites the first MiB; at each SIGUSR2, appends
 * "sum <checksum of the whole buffer>" to OUT (opened and closed each
 * time: CRIU restores only files of the size they had).
 *
 * Both signals stay blocked except inside sigsuspend: with pause(), a
 * SIGUSR2 that came after the flags were read and before pause() was lost
 * and the program slept on with a checksum owed (seen in CI).  The
 * handlers are in place before the hand-over, so no signal can find the
 * default action (termination).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15) /* Linux 6.7; older headers lack it */
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

static volatile sig_atomic_t rewrite, report;

static void on_usr1(int sig) { (void)sig; rewrite = 1; }
static void on_usr2(int sig) { (void)sig; report = 1; }

static int hand_over(const char *path, int fd)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char byte = 0;
    struct iovec io = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1,
                         .msg_control = control.buf, .msg_controllen = sizeof(control.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof(addr)) < 0 || sendmsg(s, &msg, 0) != 1)
        return -1;
    /* wait until the other end has it: then our copies can go */
    if (read(s, &byte, 1) != 1)
        return -1;
    close(s);
    return 0;
}

int main(int argc, char **argv)
{
    size_t words, i;
    uint64_t *buf, x = 0x9e3779b97f4a7c15ull, round = 0;
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_WP_ASYNC};
    sigset_t wanted, waiting;
    int uffd;

    if (argc != 4)
        return 2;
    words = strtoull(argv[3], NULL, 10) * (1 << 20) / 8;
    buf = mmap(NULL, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 3;
    for (i = 0; i < words; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = x;
    }
    sigemptyset(&wanted);
    sigaddset(&wanted, SIGUSR1);
    sigaddset(&wanted, SIGUSR2);
    sigprocmask(SIG_BLOCK, &wanted, &waiting);
    sigdelset(&waiting, SIGUSR1);
    sigdelset(&waiting, SIGUSR2);
    signal(SIGUSR1, on_usr1);
    signal(SIGUSR2, on_usr2);
    uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) < 0 || hand_over(argv[1], uffd) < 0) {
        perror("wp_track: userfaultfd");
        return 4;
    }
    close(uffd);
    for (;;) {
        if (!rewrite && !report)
            sigsuspend(&waiting);
        if (rewrite) {
            rewrite = 0;
            round++;
            for (i = 0; i < (1 << 20) / 8 && i < words; i++)
                buf[i] = buf[i] * 6364136223846793005ull + round;
        }
        if (report) {
            uint64_t sum = 0;
            FILE *out;

            report = 0;
            for (i = 0; i < words; i++)
                sum = (sum ^ buf[i]) * 1099511628211ull;
            out = fopen(argv[2], "a");
            if (out) {
                fprintf(out, "sum %016llx\n", (unsigned long long)sum);
                fclose(out);
            }
        }
    }
}
