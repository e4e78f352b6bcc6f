/*
 * One alarm() at a time across checkpoint and restart.  usage: res_alarm
 * TICKS INTERVAL_MS [ALARM_S]
 *
 * alarm(ALARM_S, default 1) again each time the last one came; the main
 * thread ticks with nanosleep.  Each tick prints how many alarms came: an
 * alarm lost across a checkpoint or a restart shows as that count
 * standing still (the test watches it).
 */
#define _GNU_SOURCE
#include <signal.h>

#include "res_common.h"

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

int main(int argc, char **argv)
{
    struct sigaction sa = { 0 };
    long ticks, ms, seen = 0;
    unsigned every = argc > 3 ? (unsigned)atoi(argv[3]) : 1;

    res_args(argc, argv, &ticks, &ms);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    RES_CHECK(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction");
    alarm(every);
    for (long tick = 1; tick <= ticks; tick++) {
        res_sleep_ms(ms);
        if (alarms != seen) {
            seen = alarms;
            alarm(every);
        }
        printf("tick %ld alarms %ld\n", tick, seen);
    }
    printf("done %ld alarms %ld\n", ticks, seen);
    return 0;
}
