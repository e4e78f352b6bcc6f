/*
 * A data file opened read-only and mapped MAP_SHARED, PROT_READ: the way
 * glibc maps gconv-modules.cache, or a program its database or weights.
 * usage: ro_map TICKS INTERVAL_MS FILE
 * Maps the first 4096 bytes of FILE (which must be at least that long).
 * Checked before every tick (exit 3): the mapping's checksum is the one it
 * had at the start, and the file read through the file system holds the
 * same bytes as the mapping.  Prints "tick N CHECKSUM".
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>

#include "resb_common.h"

#define MAP_SIZE 4096

static uint64_t checksum(const unsigned char *p)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */

    for (size_t i = 0; i < MAP_SIZE; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    unsigned char on_disk[MAP_SIZE];
    const unsigned char *m;
    uint64_t first;
    int fd = open(a.name, O_RDONLY);

    if (fd < 0)
        resb_die(a.name);
    m = mmap(NULL, MAP_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        resb_die("mmap");
    close(fd);
    first = checksum(m);
    for (long n = 1; n <= a.ticks; n++) {
        fd = open(a.name, O_RDONLY);
        if (fd < 0 || pread(fd, on_disk, MAP_SIZE, 0) != MAP_SIZE)
            resb_die(a.name);
        close(fd);
        if (checksum(m) != first)
            resb_fail("the mapping of %s changed", a.name);
        if (memcmp(on_disk, m, MAP_SIZE) != 0)
            resb_fail("%s on disk differs from its mapping", a.name);
        printf("tick %ld %llx\n", n, (unsigned long long)first);
        resb_sleep_us(a.ms * 1000);
    }
    printf("done %ld\n", a.ticks);
    return 0;
}
