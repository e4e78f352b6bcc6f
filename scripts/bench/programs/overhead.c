/* Run-time overhead workloads: the same binary runs natively and under
 * dmtcp-launch, and times only its own loop (CLOCK_MONOTONIC), so start-up
 * is not part of the figure.  It prints one line, "seconds <s>".
 *
 *   overhead compute  N   N rounds of integer and floating-point arithmetic
 *   overhead pingpong N   N round trips of 64 bytes over a TCP connection on
 *                         loopback, between this process and a forked child
 *   overhead forkexec N   N times fork + exec(/bin/true) + waitpid
 *   overhead threads  N   N times pthread_create + pthread_join
 *   overhead read     N   N times 1000 reads of 1 byte from /dev/zero (the
 *                         shim wraps read(): its cost per call shows here)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

volatile double sink;    /* results escape: the loop is not optimised away */

static void compute(long n)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    double acc = 0.0;

    for (long i = 0; i < n; i++) {
        for (int j = 0; j < 1000; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            acc = acc * 0.999999 + (double)(x & 0xffff) * 1e-6;
        }
    }
    sink = acc + (double)x;
}

/* exactly len bytes, or exit */
static void xfer(int fd, char *buf, size_t len, int sending)
{
    size_t done = 0;

    while (done < len) {
        ssize_t r = sending ? write(fd, buf + done, len - done) : read(fd, buf + done, len - done);
        if (r <= 0)
            die(sending ? "write" : "read");
        done += (size_t)r;
    }
}

static void pingpong(long n)
{
    struct sockaddr_in addr;
    socklen_t alen = sizeof addr;
    int one = 1, lfd, fd;
    char buf[64];
    pid_t child;

    memset(&addr, 0, sizeof addr);
    memset(buf, 'x', sizeof buf);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0)
        die("listen");
    child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {    /* the echo side */
        close(lfd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0)
            die("connect");
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (long i = 0; i < n; i++) {
            xfer(fd, buf, sizeof buf, 0);
            xfer(fd, buf, sizeof buf, 1);
        }
        _exit(0);
    }
    fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        die("accept");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (long i = 0; i < n; i++) {
        xfer(fd, buf, sizeof buf, 1);
        xfer(fd, buf, sizeof buf, 0);
    }
    if (waitpid(child, NULL, 0) < 0)
        die("waitpid");
    close(fd);
    close(lfd);
}

static void forkexec(long n)
{
    for (long i = 0; i < n; i++) {
        int status;
        pid_t pid = fork();

        if (pid < 0)
            die("fork");
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        if (waitpid(pid, &status, 0) < 0)
            die("waitpid");
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "/bin/true failed (status %#x)\n", status);
            exit(1);
        }
    }
}

static void *nothing(void *arg)
{
    return arg;
}

static void threads(long n)
{
    for (long i = 0; i < n; i++) {
        pthread_t t;
        int err = pthread_create(&t, NULL, nothing, NULL);

        if (err != 0) {
            fprintf(stderr, "pthread_create: %s\n", strerror(err));
            exit(1);
        }
        pthread_join(t, NULL);
    }
}

static void reads(long n)
{
    int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
    char byte;

    if (fd < 0)
        die("/dev/zero");
    for (long i = 0; i < n; i++)
        for (int j = 0; j < 1000; j++)
            if (read(fd, &byte, 1) != 1)
                die("read");
    close(fd);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(long);
    } modes[] = {
        {"compute", compute}, {"pingpong", pingpong}, {"forkexec", forkexec}, {"threads", threads},
        {"read", reads},
    };
    long n;
    double start;

    if (argc != 3 || (n = strtol(argv[2], NULL, 10)) <= 0) {
        fprintf(stderr, "usage: overhead compute|pingpong|forkexec|threads|read N\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        if (strcmp(argv[1], modes[i].name) == 0) {
            start = now();
            modes[i].run(n);
            printf("seconds %.6f\n", now() - start);
            return 0;
        }
    }
    fprintf(stderr, "overhead: unknown workload %s\n", argv[1]);
    return 2;
}
