/*
 * A bounded producer/consumer queue: 2 producers, 2 consumers, a mutex and
 * two condition variables.  usage: resb_queue TICKS INTERVAL_MS NAME
 * (NAME is not used.)  Each tick the main thread allows every producer
 * BATCH more items; producer p makes the items 2k+p+1 (k = 0, 1, ...), so
 * the items of the whole run are exactly 1..2*BATCH*TICKS.  Consumers mark
 * each item they take.  Checked (exit 3): no item is taken twice; at every
 * tick, items made = items taken + items queued and likewise their sums;
 * at the end every item was taken once and the sum is n(n+1)/2.
 * The main thread prints "tick N TAKEN SUM".
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "resb_common.h"

#define PRODUCERS 2
#define CONSUMERS 2
#define CAPACITY 8
#define BATCH 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_full = PTHREAD_COND_INITIALIZER;
static pthread_cond_t not_empty = PTHREAD_COND_INITIALIZER;
static pthread_cond_t more_allowed = PTHREAD_COND_INITIALIZER;

static long queue[CAPACITY];
static int head, count;
static long allowed;                    /* items each producer may make */
static long made[PRODUCERS];
static long made_sum, taken, taken_sum;
static long taken_by[CONSUMERS];
static unsigned char *seen;             /* seen[item]: taken already */
static int stop;

static void *producer(void *arg)
{
    int p = (int)(long)arg;

    pthread_mutex_lock(&lock);
    for (;;) {
        while (made[p] >= allowed && !stop)
            pthread_cond_wait(&more_allowed, &lock);
        if (stop)
            break;
        while (count == CAPACITY)
            pthread_cond_wait(&not_full, &lock);
        long item = 2 * made[p] + p + 1;
        queue[(head + count) % CAPACITY] = item;
        count++;
        made[p]++;
        made_sum += item;
        pthread_cond_signal(&not_empty);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *consumer(void *arg)
{
    int c = (int)(long)arg;

    pthread_mutex_lock(&lock);
    for (;;) {
        while (count == 0 && !stop)
            pthread_cond_wait(&not_empty, &lock);
        if (count == 0)
            break;
        long item = queue[head];
        head = (head + 1) % CAPACITY;
        count--;
        if (seen[item])
            resb_fail("item %ld taken twice", item);
        seen[item] = 1;
        taken++;
        taken_sum += item;
        taken_by[c]++;
        pthread_cond_signal(&not_full);
        pthread_mutex_unlock(&lock);
        resb_sleep_us(50); /* let the other consumer in */
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Under the lock: everything made is taken or queued, once. */
static void check_books(long tick)
{
    long queued_sum = 0, by = 0, marked = 0;

    for (int i = 0; i < count; i++)
        queued_sum += queue[(head + i) % CAPACITY];
    for (int c = 0; c < CONSUMERS; c++)
        by += taken_by[c];
    for (long i = 1; i <= 2 * allowed; i++)
        marked += seen[i];
    if (made[0] + made[1] != taken + count || made_sum != taken_sum + queued_sum
        || by != taken || marked != taken)
        resb_fail("tick %ld: made %ld+%ld (sum %ld), taken %ld (sum %ld, by consumers %ld, "
                  "marked %ld), queued %d (sum %ld)", tick, made[0], made[1], made_sum, taken,
                  taken_sum, by, marked, count, queued_sum);
}

int main(int argc, char **argv)
{
    struct resb_args a = resb_parse(argc, argv);
    long total = 2 * BATCH * a.ticks;
    pthread_t threads[PRODUCERS + CONSUMERS];

    seen = calloc((size_t)total + 1, 1);
    if (!seen)
        resb_die("calloc");
    for (long i = 0; i < PRODUCERS + CONSUMERS; i++)
        if (pthread_create(&threads[i], NULL, i < PRODUCERS ? producer : consumer,
                           (void *)(i < PRODUCERS ? i : i - PRODUCERS)) != 0)
            resb_die("pthread_create");
    for (long n = 1; n <= a.ticks; n++) {
        pthread_mutex_lock(&lock);
        check_books(n);
        allowed += BATCH;
        pthread_cond_broadcast(&more_allowed);
        printf("tick %ld %ld %ld\n", n, taken, taken_sum);
        pthread_mutex_unlock(&lock);
        resb_sleep_us(a.ms * 1000);
    }
    pthread_mutex_lock(&lock);
    while (made[0] + made[1] < total || count > 0) {
        pthread_mutex_unlock(&lock);
        resb_sleep_us(1000);
        pthread_mutex_lock(&lock);
    }
    stop = 1;
    pthread_cond_broadcast(&more_allowed);
    pthread_cond_broadcast(&not_empty);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < PRODUCERS + CONSUMERS; i++)
        pthread_join(threads[i], NULL);
    check_books(a.ticks + 1);
    if (taken != total || taken_sum != total * (total + 1) / 2)
        resb_fail("at the end: taken %ld of %ld, sum %ld", taken, total, taken_sum);
    for (long i = 1; i <= total; i++)
        if (!seen[i])
            resb_fail("item %ld never taken", i);
    printf("done %ld\n", a.ticks);
    return 0;
}
