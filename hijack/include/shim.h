/* Internal interfaces between the shim's source files. */
#ifndef DMTCP_SHIM_H
#define DMTCP_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "dmtcp_record.h"

/* Wrappers of libc functions must be visible to interpose; everything else
 * in the shim is hidden (-fvisibility=hidden). */
#define SHIM_EXPORT __attribute__((visibility("default")))

/*
 * What every fork writes in both processes (the locks held across it, the
 * child's pid) and every program's start writes (the agent's address),
 * gathered on one page: each page written for the first time costs a fault
 * (after fork() a copy in the child, a fault in the parent), in every round
 * of a program's fork+exec loop (issue 17).
 */
#define SHIM_HOT_DATA __attribute__((section(".data.dmtcp_hot")))

/*
 * The shim's own fds live at the top of the fd table, below the soft
 * RLIMIT_NOFILE, so that they do not take the numbers a program expects
 * from open() and friends.
 */
#define DMTCP_FD_HEADROOM 8

/* channel.c: the link to the agent, raw system calls only. */
int channel_set_address(const char *env_value);
int channel_connect(void);
int channel_connect_release(uint32_t token);
int channel_socket(void);
int channel_connect_fd(int fd);
int channel_send(int fd, uint16_t type, uint64_t arg);
int channel_recv(int fd, struct dmtcp_record *rec);
void channel_close(int fd);
int channel_recv_fd(int fd, struct dmtcp_record *rec, int *passed);
int channel_recv_payload(int fd, void *buf, size_t len);
int channel_send_fd(int fd, uint16_t type, uint64_t arg, int passed);
int channel_tell(uint16_t type, uint64_t arg); /* one record, a connection of its own */
void channel_after_fork_child(void);           /* drop a channel_tell's copy */
int channel_agent_fd(void);         /* this process's connection, or -1 */
void channel_set_agent_fd(int fd);  /* the checkpoint thread, as it (dis)connects */

/* ckpt_thread.c: the link, served from the reserved signal or by a thread */

/* pause.c */
void pause_ms(long ms); /* a sleep that a dump or restore does not cut short */
void nap_ms(long ms);   /* a sleep that anything cuts short, a dump included */

/* real.c: the only dlsym(RTLD_NEXT) cache; resolved on first use. */
#include <pthread.h>
#include <signal.h>
int real_sigaction(int sig, const struct sigaction *act, struct sigaction *old);
int real_sigprocmask(int how, const sigset_t *set, sigset_t *old);
int real_pthread_sigmask(int how, const sigset_t *set, sigset_t *old);
int real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
#include <spawn.h>
#include <stdio.h>
int real_execve(const char *path, char *const argv[], char *const envp[]);
int real_execvpe(const char *file, char *const argv[], char *const envp[]);
int real_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                     const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);
int real_posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                      const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);
int real_system(const char *command);
FILE *real_popen(const char *command, const char *type);
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>
int real_nanosleep(const struct timespec *req, struct timespec *rem);
int real_clock_nanosleep(clockid_t clock, int flags, const struct timespec *req,
                         struct timespec *rem);
int real_poll(struct pollfd *fds, nfds_t nfds, int timeout);
int real_ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout,
               const sigset_t *mask);
int real_select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *timeout);
int real_pselect(int nfds, fd_set *r, fd_set *w, fd_set *e, const struct timespec *timeout,
                 const sigset_t *mask);
int real_epoll_wait(int ep, struct epoll_event *events, int max, int timeout);
int real_epoll_pwait(int ep, struct epoll_event *events, int max, int timeout,
                     const sigset_t *mask);
int real_epoll_pwait2(int ep, struct epoll_event *events, int max,
                      const struct timespec *timeout, const sigset_t *mask);
int real_pause(void);
int real_sigsuspend(const sigset_t *mask);
int real_sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout);
int real_sigwaitinfo(const sigset_t *set, siginfo_t *info);
int real_sigwait(const sigset_t *set, int *sig);
#include <sys/resource.h>
#include <sys/wait.h>
pid_t real_wait(int *status);
pid_t real_waitpid(pid_t pid, int *status, int options);
pid_t real_wait3(int *status, int options, struct rusage *usage);
pid_t real_wait4(pid_t pid, int *status, int options, struct rusage *usage);
int real_waitid(idtype_t type, id_t id, siginfo_t *info, int options);
int real_kill(pid_t pid, int sig);
int real_killpg(pid_t group, int sig);
int real_close(int fd);
int real_dup2(int oldfd, int newfd);
int real_dup3(int oldfd, int newfd, int flags);
#include <dirent.h>
#include <sys/stat.h>
int real_open(const char *path, int flags, mode_t mode);
int real_open64(const char *path, int flags, mode_t mode);
int real_openat(int dir, const char *path, int flags, mode_t mode);
int real_openat64(int dir, const char *path, int flags, mode_t mode);
FILE *real_fopen(const char *path, const char *mode);
FILE *real_fopen64(const char *path, const char *mode);
DIR *real_opendir(const char *path);
ssize_t real_readlink(const char *path, char *buf, size_t size);
int real_access(const char *path, int mode);
int real_stat(const char *path, struct stat *st);
int real_lstat(const char *path, struct stat *st);

/* wrap_proc.c: /proc/PID paths with this PID namespace's ids */
const char *proc_path_of(const char *path, char *buf, size_t size);
long proc_id_of(pid_t pid); /* the id /proc knows a process by; -1: gone */

/* wrap_wait.c: a call made again, for the time left, when the checkpoint
 * signal made it fail with EINTR (see there); wrap_ipc.c uses it too. */
struct wait {
    struct timespec start; /* CLOCK_MONOTONIC at entry (or about: _coarse) */
    struct timespec limit; /* the original timeout, once known to be valid */
    unsigned seen;         /* interruptions before the latest call */
    int saved_errno;       /* errno at entry, given back on success */
    int retried;
};
void wait_begin(struct wait *w);              /* at entry */
void wait_begin_coarse(struct wait *w);       /* the same, cheaper, a tick less precise */
void wait_snapshot(struct wait *w);           /* before each call */
int wait_again(struct wait *w, int eintr);    /* after it: was the EINTR ours? */
long wait_done(const struct wait *w, long result); /* errno back after a retry */
int time_left(const struct wait *w, struct timespec *left); /* of w->limit; 0: none */
struct timespec timeval_limit(const struct timeval *tv); /* as Linux takes it */
/* call(ctx, t) again while our signal made it fail, t the time left of
 * timeout (NULL: no limit); again(ctx), if any, before each new call */
typedef long (*ts_call)(void *ctx, const struct timespec *timeout);
long retry_ts(const struct timespec *timeout, ts_call call, void *ctx, void (*again)(void *ctx));

/* mqueue.c: POSIX message queues out of CRIU's sight for the dump, and
 * back (see there).  Checkpoint thread, program suspended. */
int mqueue_detach(void);    /* CHECKPOINT, before READY: the fds taken out */
void mqueue_reattach(void); /* reconnected after the dump or the restore */
void mqueue_resume(void);   /* every queue is back: notifications, unlinks */
#include <mqueue.h>
void mqueue_note_notify(mqd_t fd, const struct sigevent *sev); /* mq_notify succeeded */

/* timers.c: an alarm that expired while CRIU dumped the process (see
 * there).  Checkpoint thread, program suspended: */
void timers_save(void);   /* SUSPEND, once every thread is stopped */
void timers_resume(void); /* RESUME: an expired alarm's SIGALRM, sent again if lost */

/* tracker.c */
int tracker_make(void); /* TRACK: a userfaultfd for the agent, or -errno */

/* inotify.c: the events queued on inotify instances, kept across a
 * checkpoint (see there).  Checkpoint thread, program suspended: */
void inotify_save(void);         /* SUSPEND, after fdowner_save: the instances this process reads, claimed */
void inotify_keep_queued(void);  /* CHECKPOINT: the leader takes the queued events */
void inotify_resume(void);       /* RESUME: fds with kept events readable */
/* program threads: */
void inotify_after_fork_child(void);
void inotify_forget(unsigned first, unsigned last); /* fds closed or replaced (when live) */
/* The fd numbers this process has read() since it got them, one bit each
 * (below INOTIFY_READ_FDS): of the processes that share an instance, the
 * one that reads it is to keep its events.  Set at every read (a load
 * once set), cleared when the number is closed or replaced, and in a fork
 * child. */
#define INOTIFY_READ_FDS 65536
extern uint64_t inotify_read_bits[INOTIFY_READ_FDS / 64] __attribute__((visibility("hidden")));
/* No bit is set from this fd number on: a fork child clears the bits below
 * it and touches none of the bitmap's pages when it is 0 (raised before
 * the bit is set, so a fork between the two clears a bit that is not). */
extern unsigned inotify_read_end __attribute__((visibility("hidden")));
static inline void inotify_note_read(int fd)
{
    if ((unsigned)fd < INOTIFY_READ_FDS) {
        uint64_t bit = 1ull << (fd & 63), *word = &inotify_read_bits[fd >> 6];

        if (!(__atomic_load_n(word, __ATOMIC_RELAXED) & bit)) {
            unsigned end = __atomic_load_n(&inotify_read_end, __ATOMIC_RELAXED);

            while (end <= (unsigned)fd
                   && !__atomic_compare_exchange_n(&inotify_read_end, &end, (unsigned)fd + 1, 1,
                                                   __ATOMIC_RELEASE, __ATOMIC_RELAXED))
                ;
            __atomic_fetch_or(word, bit, __ATOMIC_RELEASE);
        }
    }
}
void inotify_unnote_read(unsigned first, unsigned last);
/* slots in use: while 0, read() needs nothing of inotify.c */
extern int inotify_live __attribute__((visibility("hidden")));
typedef ssize_t (*inotify_read_fn)(int fd, void *buf, size_t len);
/* read() while inotify_live: the kept events first, then plain's */
ssize_t inotify_read(int fd, void *buf, size_t len, inotify_read_fn plain);
/* plain's read gave n > 0 bytes and inotify_live is set: what to return */
ssize_t inotify_read_done(int fd, void *buf, size_t len, ssize_t n, inotify_read_fn plain);

/* api.c: DMTCP's public API; what the checkpoint thread tells it. */
void api_init(void (*start_thread)(void)); /* called when the API is used */
void api_before_checkpoint(void);
void api_after_resume(uint64_t arg);
void api_generation_done(uint64_t arg);

/* wrap_exec.c: remember the shim's environment (constructor). */
void exec_env_capture(int (*fate)(void)); /* fate: whether FATE 1 is in force */

/* suspend.c: stopping and releasing the program's threads. */
int suspend_signal(void);            /* the reserved signal */
void suspend_init(void (*on_signal)(const siginfo_t *info), /* the link, from the handler */
                  void (*after_gate)(void));       /* a thread let the gate go */
int suspend_all(void);               /* returns threads that would not stop */
void resume_all(void);
int suspend_active(void);
unsigned suspend_interruptions(void); /* this thread's calls that our signal made fail
                                         with EINTR (async-signal-safe) */
void gate_enter(void);               /* around thread creation and fork */
void gate_leave(void);
void gate_after_fork_child(void);
int gate_held(void);                 /* by this thread */

/* procdir.c: call fn for every numeric entry of a /proc directory
 * (except the fd used to read it); raw system calls only. */
int procdir_each(const char *path, void (*fn)(int num, void *ctx), void *ctx);
/* procdir.c: a small /proc file into buf (NUL-terminated), with raw system
 * calls; its length, or -1 */
long proc_read(const char *path, char *buf, size_t size);

/* fdowner.c: the leader of each shared open file description, by F_SETOWN
 * (checkpoint thread, program suspended). */
void fdowner_save(void);      /* SUSPEND: the sockets, their owners saved */
int fdowner_claim(int fd);    /* SUSPEND: fd too (0), or not (-1: the agent's, too many) */
void fdowner_elect(void);     /* ELECT: every claimed fd */
int fdowner_leads(int fd);    /* after the barrier: this process leads fd */
void fdowner_restore(void);   /* RESUME: the program's owners back */

/* park.c: network sockets handed to the agent for the dump, and back. */
int park_sockets(int agent, const int *fds, int n); /* returns how many */
int park_take_back(int fd_number, int sock);        /* 0, or -1: not parked */
int park_finish(void);                              /* parked fds left as /dev/null */
struct epoll_watch {
    int epfd, fd; /* epfd -1: already taken out by another process */
    uint32_t events;
    uint64_t data;
};
int epoll_watches_take(int (*wanted)(int fd, unsigned long ino), struct epoll_watch *w, int max);
void epoll_watches_put_back(const struct epoll_watch *w, int n, int fd);

#endif
