/*
 * A regular file mapped MAP_SHARED and updated in place, and a file
 * appended to with O_APPEND.  usage: resb_file TICKS INTERVAL_MS DIR
 * Both files live in a directory made with mkdtemp in DIR and removed,
 * with them, at exit.  Each tick N appends the fixed-size record N to the
 * log and stores N, the sum 1..N and a check value in the mapping.
 * Checked before every tick (exit 3): the mapping holds the previous
 * tick's values; the mapped file read through the file system holds the
 * same; the log on disk is exactly as long as the records written and its
 * last record is the previous tick's.  After a restart, then, the files on
 * disk and the program's own count must agree.  Prints "tick N SUM".
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "resb_common.h"

#define MAP_SIZE 4096
#define RECORD_FMT "rec %011ld\n"
#define RECORD 16 /* bytes of one formatted record (n below 10^11) */

struct mapped {
    long n, sum, check;
};

static char dir[4096], map_path[4200], log_path[4200];

static long check_value(long n) { return n * 0x9e3779b97f4a7c15L ^ 0x1234; }

/* The number of invariants broken (each is reported). */
static int check_mapping(const struct mapped *m, long n)
{
    struct mapped on_disk;
    int fd = open(map_path, O_RDONLY), broken = 0;

    if (m->n != n || m->sum != n * (n + 1) / 2 || m->check != check_value(n))
        broken += resb_complain("mapping holds n %ld sum %ld, the program is at %ld", m->n,
                                m->sum, n);
    if (fd < 0 || pread(fd, &on_disk, sizeof(on_disk), 0) != (ssize_t)sizeof(on_disk))
        resb_die(map_path);
    close(fd);
    if (memcmp(&on_disk, m, sizeof(on_disk)) != 0)
        broken += resb_complain("%s holds n %ld, its mapping %ld", map_path, on_disk.n, m->n);
    return broken;
}

static int check_log(long n)
{
    char want[32], got[RECORD + 1] = "";
    struct stat st;
    int fd = open(log_path, O_RDONLY), broken = 0;

    if (fd < 0 || fstat(fd, &st) != 0)
        resb_die(log_path);
    if (st.st_size != n * RECORD)
        broken += resb_complain("%s is %lld bytes long, %ld records (%ld bytes) were written",
                                log_path, (long long)st.st_size, n, n * RECORD);
    if (n > 0) {
        snprintf(want, sizeof(want), RECORD_FMT, n);
        if (pread(fd, got, RECORD, (n - 1) * RECORD) != RECORD || memcmp(got, want, RECORD) != 0)
            broken += resb_complain("last record of %s is \"%.*s\", want \"%.*s\"", log_path,
                                    RECORD - 1, got, RECORD - 1, want);
    }
    close(fd);
    return broken;
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    char record[32];
    struct mapped *m;
    int fd, log_fd;

    snprintf(dir, sizeof(dir), "%s/resb_file-XXXXXX", a.name);
    if (!mkdtemp(dir))
        resb_die("mkdtemp");
    snprintf(map_path, sizeof(map_path), "%s/counter.map", dir);
    snprintf(log_path, sizeof(log_path), "%s/append.log", dir);
    fd = open(map_path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, MAP_SIZE) != 0)
        resb_die(map_path);
    m = mmap(NULL, MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        resb_die("mmap");
    close(fd);
    m->check = check_value(0);
    log_fd = open(log_path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND, 0600);
    if (log_fd < 0)
        resb_die(log_path);

    for (long n = 1; n <= a.ticks; n++) {
        if (check_mapping(m, n - 1) + check_log(n - 1) > 0)
            exit(3);
        snprintf(record, sizeof(record), RECORD_FMT, n);
        if (resb_write_full(log_fd, record, RECORD) != 0)
            resb_die("append");
        m->n = n;
        m->sum += n;
        m->check = check_value(n);
        printf("tick %ld %ld\n", n, m->sum);
        resb_sleep_us(a.ms * 1000);
    }
    if (check_mapping(m, a.ticks) + check_log(a.ticks) > 0)
        exit(3);
    if (munmap(m, MAP_SIZE) != 0 || close(log_fd) != 0 || unlink(map_path) != 0
        || unlink(log_path) != 0 || rmdir(dir) != 0)
        resb_die("cleaning up");
    printf("done %ld\n", a.ticks);
    return 0;
}
