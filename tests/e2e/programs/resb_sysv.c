/*
 * System V shared memory, a semaphore and a message queue (all
 * IPC_PRIVATE) between a parent and the child it forked.
 * usage: resb_sysv TICKS INTERVAL_MS NAME       (NAME is not used)
 * It prints "ipc shm ID sem ID msg ID" first, so that a test can remove
 * the objects of a killed run; a finished run removes them itself.
 * Each tick the parent sends message N (type 1) to the child; both then add
 * one to a shared total and to their own count under the semaphore, and
 * the child answers with message N (type 2).  Checked (exit 3): every
 * message carries the next sequence number and its check value, the total
 * equals the sum of the two counts, and each count is what its owner did.
 * The parent prints "tick N TOTAL".
 */
#define _DEFAULT_SOURCE
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>

#include "resb_common.h"

#define TO_CHILD 1
#define TO_PARENT 2
#define STOP (-1L)

struct shared {
    long total;
    long counts[2];     /* parent [0], child [1] */
};

struct message {
    long mtype;
    long seq;
    long check;
};

union semun {
    int val;
    struct semid_ds *buf;
    unsigned short *array;
};

static int semid, msqid;

static long check_value(long seq) { return seq * 2654435761L ^ 0x5eed; }

static void semaphore(int op)
{
    struct sembuf b = { 0, (short)op, 0 };

    while (semop(semid, &b, 1) != 0)
        if (errno != EINTR)
            resb_die("semop");
}

/* Side `me` adds its n-th one to the total, under the semaphore. */
static void add(struct shared *s, int me, long n)
{
    semaphore(-1);
    if (s->counts[me] != n - 1 || s->total != s->counts[0] + s->counts[1])
        resb_fail("side %d step %ld: counts %ld/%ld total %ld", me, n, s->counts[0],
                  s->counts[1], s->total);
    s->counts[me] = n;
    s->total++;
    semaphore(+1);
}

static void send(long type, long seq)
{
    struct message m = { type, seq, check_value(seq) };

    while (msgsnd(msqid, &m, sizeof(m) - sizeof(long), 0) != 0)
        if (errno != EINTR)
            resb_die("msgsnd");
}

static long receive(long type)
{
    struct message m;
    ssize_t got;

    while ((got = msgrcv(msqid, &m, sizeof(m) - sizeof(long), type, 0)) < 0)
        if (errno != EINTR)
            resb_die("msgrcv");
    if (got != (ssize_t)(sizeof(m) - sizeof(long)) || m.check != check_value(m.seq))
        resb_fail("message of type %ld is damaged: %zd bytes, seq %ld", type, got, m.seq);
    return m.seq;
}

static void child(struct shared *s)
{
    for (long n = 1;; n++) {
        long seq = receive(TO_CHILD);

        if (seq == STOP)
            exit(0);
        if (seq != n)
            resb_fail("child expected message %ld, got %ld", n, seq);
        add(s, 1, n);
        send(TO_PARENT, n);
    }
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    union semun one = { .val = 1 };
    struct shared *s;
    pid_t pid;
    int shmid;

    shmid = shmget(IPC_PRIVATE, sizeof(*s), IPC_CREAT | 0600);
    semid = semget(IPC_PRIVATE, 1, IPC_CREAT | 0600);
    msqid = msgget(IPC_PRIVATE, IPC_CREAT | 0600);
    if (shmid < 0 || semid < 0 || msqid < 0)
        resb_die("creating the IPC objects");
    printf("ipc shm %d sem %d msg %d\n", shmid, semid, msqid);
    if (semctl(semid, 0, SETVAL, one) != 0)
        resb_die("semctl");
    s = shmat(shmid, NULL, 0);
    if (s == (void *)-1)
        resb_die("shmat");
    s->total = s->counts[0] = s->counts[1] = 0;
    pid = fork();
    if (pid < 0)
        resb_die("fork");
    if (pid == 0)
        child(s);

    for (long n = 1; n <= a.ticks; n++) {
        long seq;

        send(TO_CHILD, n);
        add(s, 0, n);
        if ((seq = receive(TO_PARENT)) != n)
            resb_fail("parent expected answer %ld, got %ld", n, seq);
        semaphore(-1);
        if (s->counts[0] != n || s->counts[1] != n || s->total != 2 * n)
            resb_fail("tick %ld: counts %ld/%ld total %ld", n, s->counts[0], s->counts[1],
                      s->total);
        semaphore(+1);
        printf("tick %ld %ld\n", n, 2 * n);
        resb_sleep_us(a.ms * 1000);
    }
    send(TO_CHILD, STOP);
    resb_reap(pid);
    if (shmdt(s) != 0 || shmctl(shmid, IPC_RMID, NULL) != 0 || semctl(semid, 0, IPC_RMID) != 0
        || msgctl(msqid, IPC_RMID, NULL) != 0)
        resb_die("removing the IPC objects");
    printf("done %ld\n", a.ticks);
    return 0;
}
