/*
 * A pseudo-terminal pair inside the tree: the parent holds the master
 * (posix_openpt, grantpt, unlockpt), the child it forked opens the slave by
 * name and echoes what comes through it.  usage: resb_pty TICKS INTERVAL_MS NAME
 * (NAME is not used: the pair goes away with the processes.)
 * The child puts the slave in raw mode and writes one ready byte; then each
 * tick the parent writes a record holding N and a check value to the
 * master, and the child reads it from the slave, checks that it is the next
 * one, and writes it back.  Checked (exit 3): the child sees records 1, 2,
 * 3, ... intact, and the parent reads back exactly what it wrote.
 * The parent prints "tick N PTS-PATH".
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <termios.h>

#include "resb_common.h"

#define RECORD_FMT "seq %011ld %016lx\n"
#define RECORD 33 /* bytes of one formatted record */
#define STOP 0L

static unsigned long check_value(long n) { return (unsigned long)n * 0x2545f4914f6cdd1dUL; }

static void format(char *buf, long n)
{
    snprintf(buf, RECORD + 1, RECORD_FMT, n, check_value(n));
}

/* Read one record; return its number, or fail if it is not well formed. */
static long read_record(int fd, const char *who)
{
    char buf[RECORD + 1], again[RECORD + 1];
    long n;

    if (resb_read_full(fd, buf, RECORD) != 0)
        resb_die(who);
    buf[RECORD] = '\0';
    if (sscanf(buf, "seq %ld", &n) != 1)
        resb_fail("%s read a damaged record \"%s\"", who, buf);
    format(again, n);
    if (strcmp(buf, again) != 0)
        resb_fail("%s read a damaged record \"%s\"", who, buf);
    return n;
}

static void child(const char *slave_path)
{
    char buf[RECORD + 1];
    struct termios t;
    int fd = open(slave_path, O_RDWR | O_NOCTTY);

    if (fd < 0 || tcgetattr(fd, &t) != 0)
        resb_die(slave_path);
    cfmakeraw(&t);
    if (tcsetattr(fd, TCSANOW, &t) != 0 || resb_write_full(fd, "R", 1) != 0)
        resb_die("tcsetattr");
    for (long n = 1;; n++) {
        long got = read_record(fd, "child");

        if (got == STOP)
            exit(0);
        if (got != n)
            resb_fail("child expected record %ld, got %ld", n, got);
        format(buf, got);
        if (resb_write_full(fd, buf, RECORD) != 0)
            resb_die("child write");
    }
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    char slave_path[256], buf[RECORD + 1];
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    pid_t pid;

    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0
        || ptsname_r(master, slave_path, sizeof(slave_path)) != 0)
        resb_die("posix_openpt");
    pid = fork();
    if (pid < 0)
        resb_die("fork");
    if (pid == 0) {
        close(master);
        child(slave_path);
    }
    if (resb_read_full(master, buf, 1) != 0 || buf[0] != 'R')
        resb_fail("no ready byte from the child");
    for (long n = 1; n <= a.ticks; n++) {
        long got;

        format(buf, n);
        if (resb_write_full(master, buf, RECORD) != 0)
            resb_die("parent write");
        if ((got = read_record(master, "parent")) != n)
            resb_fail("parent wrote record %ld, read back %ld", n, got);
        printf("tick %ld %s\n", n, slave_path);
        resb_sleep_us(a.ms * 1000);
    }
    format(buf, STOP);
    if (resb_write_full(master, buf, RECORD) != 0)
        resb_die("parent write");
    resb_reap(pid);
    close(master);
    printf("done %ld\n", a.ticks);
    return 0;
}
