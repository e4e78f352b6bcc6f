/*
 * POSIX shared memory and named semaphores between a parent and the child
 * it forked.  usage: resb_posix_shm TICKS INTERVAL_MS PREFIX
 * Objects: shm "/PREFIX-PID" and semaphores "/PREFIX-PID-parent" and
 * "/PREFIX-PID-child" (PID: the parent's), all unlinked at exit.
 * The two take turns through the semaphores; on its turn each checks the
 * shared counters against what it knows it did (exit 3 if they differ):
 * the total is 2 per full round, the turn word says whose turn it is, and
 * the other side's round count is exactly one step behind or level.
 * The parent prints "tick N TOTAL" (the total after its move) each round.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <semaphore.h>
#include <sys/mman.h>

#include "resb_common.h"

struct shared {
    long total;         /* incremented by both, on their turn */
    long rounds[2];     /* rounds done by parent [0] and child [1] */
    int turn;           /* 0: parent, 1: child */
    int stop;
};

static char shm_name[256], sem_names[2][272];

static void take(sem_t *sem)
{
    while (sem_wait(sem) != 0)
        if (errno != EINTR)
            resb_die("sem_wait");
}

/* Side `me` has waited for its turn: check, count, hand the turn over. */
static void play(struct shared *s, int me, long round, sem_t *other)
{
    long expect_total = 2 * (round - 1) + me;

    if (s->turn != me)
        resb_fail("side %d has the semaphore but turn is %d", me, s->turn);
    if (s->total != expect_total || s->rounds[me] != round - 1
        || s->rounds[1 - me] != round - 1 + me)
        resb_fail("side %d round %ld: total %ld (want %ld), rounds %ld/%ld", me, round,
                  s->total, expect_total, s->rounds[0], s->rounds[1]);
    s->total++;
    s->rounds[me] = round;
    s->turn = 1 - me;
    if (sem_post(other) != 0)
        resb_die("sem_post");
}

static void child(struct shared *s, sem_t *mine, sem_t *parents)
{
    for (long round = 1;; round++) {
        take(mine);
        if (s->stop)
            exit(0);
        play(s, 1, round, parents);
    }
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    struct shared *s;
    sem_t *sem[2];
    pid_t pid;
    int fd;

    snprintf(shm_name, sizeof(shm_name), "/%s-%d", a.name, (int)getpid());
    snprintf(sem_names[0], sizeof(sem_names[0]), "%s-parent", shm_name);
    snprintf(sem_names[1], sizeof(sem_names[1]), "%s-child", shm_name);
    fd = shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(*s)) != 0)
        resb_die("shm_open");
    s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED)
        resb_die("mmap");
    close(fd);
    for (int i = 0; i < 2; i++) {
        sem[i] = sem_open(sem_names[i], O_CREAT | O_EXCL, 0600, i == 0 ? 1 : 0);
        if (sem[i] == SEM_FAILED)
            resb_die("sem_open");
    }
    pid = fork();
    if (pid < 0)
        resb_die("fork");
    if (pid == 0)
        child(s, sem[1], sem[0]);

    for (long n = 1; n <= a.ticks; n++) {
        take(sem[0]);
        play(s, 0, n, sem[1]);
        printf("tick %ld %ld\n", n, 2 * n - 1);
        resb_sleep_us(a.ms * 1000);
    }
    take(sem[0]);
    if (s->total != 2 * a.ticks || s->rounds[1] != a.ticks)
        resb_fail("at the end: total %ld rounds %ld/%ld", s->total, s->rounds[0], s->rounds[1]);
    s->stop = 1;
    sem_post(sem[1]);
    resb_reap(pid);
    if (shm_unlink(shm_name) != 0 || sem_unlink(sem_names[0]) != 0 || sem_unlink(sem_names[1]) != 0)
        resb_die("unlink");
    printf("done %ld\n", a.ticks);
    return 0;
}
