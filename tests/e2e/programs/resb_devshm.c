/*
 * A file in /dev/shm mapped MAP_SHARED by a parent and the child it forked,
 * each opening it by name.  usage: resb_devshm TICKS INTERVAL_MS PREFIX
 * The file is /dev/shm/PREFIX-PID (PID: the parent's), removed at exit.
 * Each process owns one slot, which only it writes: the parent sets its
 * slot to N at tick N, the child follows each step of the parent's slot
 * with its own.  Checked (exit 3): a process's own slot holds the last
 * value it stored; the other slot is level with or one step off its own,
 * never behind what was seen before, and moves on within 10 seconds.
 * The parent prints "tick N CHILD-SLOT".
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <sys/mman.h>

#include "resb_common.h"

#define PATIENCE 50000 /* polls 200 us apart: 10 s, however long a checkpoint froze us */

struct slots {
    long slot[2];       /* parent [0], child [1] */
    int stop;
};

static char path[4096];

static long load(const long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static struct slots *map_by_name(void)
{
    int fd = open(path, O_RDWR);
    struct slots *s;

    if (fd < 0)
        resb_die(path);
    s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED)
        resb_die("mmap");
    close(fd);
    return s;
}

/* Side `me` has stored `mine` in its slot; wait until the other reaches
 * `want`, checking both slots all the while.  0 when the parent said stop. */
static int await_other(struct slots *s, int me, long mine, long want)
{
    long seen = load(&s->slot[1 - me]);

    for (long polls = 0;; polls++) {
        long other = load(&s->slot[1 - me]);

        if (load(&s->slot[me]) != mine)
            resb_fail("side %d stored %ld, its slot holds %ld", me, mine, load(&s->slot[me]));
        if (other < seen || other < mine - 1 || other > mine + 1)
            resb_fail("side %d at %ld sees the other at %ld (seen %ld before)", me, mine, other,
                      seen);
        if (other >= want)
            return 1;
        if (me == 1 && __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE))
            return 0;
        if (polls > PATIENCE)
            resb_fail("side %d at %ld: the other stayed at %ld", me, mine, other);
        seen = other;
        resb_sleep_us(200);
    }
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    struct slots *s;
    pid_t pid;
    int fd;

    snprintf(path, sizeof(path), "/dev/shm/%s-%d", a.name, (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(*s)) != 0 || close(fd) != 0)
        resb_die(path);
    pid = fork();
    if (pid < 0)
        resb_die("fork");
    s = map_by_name();  /* each process opens the file itself */
    if (pid == 0) {
        for (long k = 1; await_other(s, 1, k - 1, k); k++)
            __atomic_store_n(&s->slot[1], k, __ATOMIC_RELEASE);
        exit(0);
    }
    for (long n = 1; n <= a.ticks; n++) {
        __atomic_store_n(&s->slot[0], n, __ATOMIC_RELEASE);
        await_other(s, 0, n, n);
        printf("tick %ld %ld\n", n, load(&s->slot[1]));
        resb_sleep_us(a.ms * 1000);
    }
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    resb_reap(pid);
    if (unlink(path) != 0)
        resb_die("unlink");
    printf("done %ld\n", a.ticks);
    return 0;
}
