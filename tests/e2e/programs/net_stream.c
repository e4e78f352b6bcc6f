/*
 * Two processes (launched as two trees) streaming over one TCP connection
 * in both directions, each checking every byte it receives.
 *
 *   net_stream server HOST PORT TICKS INTERVAL_MS
 *   net_stream client HOST PORT TICKS INTERVAL_MS
 *   net_stream ring HOST PORT NEXT TICKS INTERVAL_MS
 *
 * A HOST that starts with '/' (a path) or '@' (an abstract name) means a
 * Unix stream socket there; PORT is then ignored.
 *
 * In a ring, each process listens on HOST:PORT, connects to NEXT:PORT and
 * accepts its predecessor: it streams to its successor and checks what its
 * predecessor streams to it.
 *
 * Each side writes consecutive 64-bit counters four times faster than the
 * other side reads them, so the kernel's buffers are full whenever a
 * checkpoint comes: what is in flight must survive draining and refilling.
 * A counter out of sequence is a lost, doubled or reordered byte: FAIL,
 * exit 3.  After TICKS ticks each side shuts its writing half, reads to the
 * end of the peer's stream and prints "done TICKS".  The server keeps its
 * listening socket open the whole time.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "res_common.h"

#define WRITE_BLOCK 65536
#define READ_BLOCK 16384

static int in_fd = -1, out_fd = -1; /* the same connection but in a ring */
static volatile int stop_writing;
static volatile uint64_t received; /* counters received so far */

/* A signal may cut a blocking write short: go on from where it stopped. */
static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void *writer(void *unused)
{
    static uint64_t block[WRITE_BLOCK / 8];
    uint64_t next = 0;

    (void)unused;
    while (!stop_writing) {
        for (size_t i = 0; i < WRITE_BLOCK / 8; i++)
            block[i] = next++;
        if (write_all(out_fd, block, sizeof(block)) != 0)
            res_fail("write: %s", strerror(errno));
        res_sleep_ms(1);
    }
    return NULL;
}

static void *reader(void *unused)
{
    static unsigned char buf[READ_BLOCK + 8];
    size_t have = 0; /* bytes of a partial counter carried over */

    (void)unused;
    for (;;) {
        ssize_t n = read(in_fd, buf + have, READ_BLOCK);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            res_fail("read: %s", strerror(errno));
        if (n == 0)
            break;
        have += (size_t)n;
        size_t whole = have / 8 * 8;
        for (size_t off = 0; off < whole; off += 8) {
            uint64_t v;
            memcpy(&v, buf + off, 8);
            if (v != received)
                res_fail("got counter %llu, expected %llu",
                         (unsigned long long)v, (unsigned long long)received);
            received++;
        }
        memmove(buf, buf + whole, have - whole);
        have -= whole;
        res_sleep_ms(1);
    }
    if (have != 0)
        res_fail("stream ended inside a counter");
    return NULL;
}

static void parse_addr(struct sockaddr_in *addr, const char *host, const char *port)
{
    memset(addr, 0, sizeof(*addr));
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)atoi(port));
    if (inet_pton(AF_INET, host, &addr->sin_addr) != 1)
        res_fail("bad address %s", host);
}

static int listen_on(const struct sockaddr_in *addr)
{
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (const struct sockaddr *)addr, sizeof(*addr)) != 0 || listen(fd, 4) != 0)
        res_fail("listen: %s", strerror(errno));
    return fd;
}

static int accept_one(int listener)
{
    int fd;

    while ((fd = accept(listener, NULL, NULL)) < 0 && errno == EINTR)
        ;
    if (fd < 0)
        res_fail("accept: %s", strerror(errno));
    return fd;
}

static int connect_to(const struct sockaddr_in *addr)
{
    for (int tries = 0; tries < 500; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);

        if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0)
            return fd;
        close(fd);
        res_sleep_ms(20);
    }
    res_fail("no connection: %s", strerror(errno));
    return -1;
}

static int is_unix(const char *host)
{
    return host[0] == '/' || host[0] == '@';
}

static socklen_t unix_addr(struct sockaddr_un *un, const char *host)
{
    size_t n = strlen(host);

    memset(un, 0, sizeof(*un));
    un->sun_family = AF_UNIX;
    if (n >= sizeof(un->sun_path))
        res_fail("path too long: %s", host);
    memcpy(un->sun_path, host, n);
    if (host[0] == '@')
        un->sun_path[0] = '\0';
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (host[0] == '@' ? 0 : 1));
}

static int unix_listen(const char *host)
{
    struct sockaddr_un un;
    socklen_t len = unix_addr(&un, host);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);

    if (host[0] == '/')
        unlink(host);
    if (bind(fd, (struct sockaddr *)&un, len) != 0 || listen(fd, 4) != 0)
        res_fail("listen on %s: %s", host, strerror(errno));
    return fd;
}

static int unix_connect(const char *host)
{
    struct sockaddr_un un;
    socklen_t len = unix_addr(&un, host);

    for (int tries = 0; tries < 500; tries++) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);

        if (connect(fd, (struct sockaddr *)&un, len) == 0)
            return fd;
        close(fd);
        res_sleep_ms(20);
    }
    res_fail("no connection to %s: %s", host, strerror(errno));
    return -1;
}

int main(int argc, char **argv)
{
    struct sockaddr_in addr, next;
    long ticks, ms;
    int listener = -1, one = 1, ring;
    pthread_t w, r;

    ring = argc == 7 && strcmp(argv[1], "ring") == 0;
    if (argc != 6 && !ring)
        res_fail("usage: %s server|client HOST PORT TICKS INTERVAL_MS | ring HOST PORT NEXT TICKS INTERVAL_MS",
                 argv[0]);
    res_args(argc - 3 - ring, argv + 3 + ring, &ticks, &ms);
    if (!ring && is_unix(argv[2])) {
        if (strcmp(argv[1], "server") == 0) {
            listener = unix_listen(argv[2]);
            printf("listening\n");
            in_fd = out_fd = accept_one(listener);
        } else {
            in_fd = out_fd = unix_connect(argv[2]);
        }
    } else {
        parse_addr(&addr, argv[2], argv[3]);
    }
    if (in_fd >= 0) {
        /* connected over a Unix socket above */
    } else if (ring) {
        parse_addr(&next, argv[4], argv[3]);
        listener = listen_on(&addr);
        printf("listening\n");
        out_fd = connect_to(&next);
        in_fd = accept_one(listener);
    } else if (strcmp(argv[1], "server") == 0) {
        listener = listen_on(&addr);
        printf("listening\n");
        in_fd = out_fd = accept_one(listener);
    } else {
        in_fd = out_fd = connect_to(&addr);
    }
    if (!is_unix(argv[2]))
        setsockopt(out_fd, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof(one));
    pthread_create(&w, NULL, writer, NULL);
    pthread_create(&r, NULL, reader, NULL);
    for (long t = 1; t <= ticks; t++) {
        res_sleep_ms(ms);
        printf("tick %ld %s received %llu\n", t, argv[1], (unsigned long long)received);
    }
    stop_writing = 1;
    pthread_join(w, NULL);
    if (shutdown(out_fd, SHUT_WR) != 0)
        res_fail("shutdown: %s", strerror(errno));
    pthread_join(r, NULL);
    printf("done %ld %s received %llu\n", ticks, argv[1], (unsigned long long)received);
    if (listener >= 0)
        close(listener);
    return 0;
}
