/*
 * A new program started from the tree stays in the tree: whatever
 * environment the program passes to exec or posix_spawn, the shim's
 * variables are put back (LD_PRELOAD with the shim first, the agent socket,
 * the coordinator, the reserved signal).  system() and popen() take the
 * process's own environment, so for them it is repaired in place.
 *
 * No malloc: after vfork() the child shares the parent's memory and
 * allocator locks; new environment arrays live on the stack.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

extern char **environ;

/*
 * NAME=value of each variable to keep, captured at start-up, and the
 * paths below: packed one after the other into one pool, so that a
 * program's start writes one or two pages here rather than a dozen (each
 * first write costs a page fault, and every exec'd program of the tree
 * pays it; issue 17's fork+exec loop).  At most ENTRY_MAX bytes each.
 */
#define KEPT 12
#define ENTRY_MAX 1024
static char pool[(KEPT + 3) * ENTRY_MAX];
static size_t pool_used;
static char *kept[KEPT];
static size_t kept_name_len[KEPT]; /* "NAME=" */
static int n_kept;
static const char *preload_value = ""; /* our library's path */
static size_t preload_len;
static const char *ssh_wrapper = "";   /* dmtcp-ssh, or empty */
static const char *srun_wrapper = "";  /* dmtcp-srun, or empty */

static const char *const kept_names[] = {
    DMTCP_ENV_AGENT_SOCK, DMTCP_ENV_SIGCKPT, "DMTCP_COORD_HOST", "DMTCP_COORD_PORT",
    "DMTCP_CHECKPOINT_DIR", "DMTCP_TMPDIR", "DMTCP_LOG_LEVEL", "DMTCP_COORD_TOKEN",
    "DMTCP_SSH_WRAPPER", "DMTCP_SRUN_WRAPPER",
};

/* whether FATE 1 is in force (ckpt_thread.c, which drives this unit:
 * passed, not called by name) */
static int (*fate_on_now)(void);

static int dies_with_agent(void)
{
    return fate_on_now && fate_on_now();
}

/* a + b, NUL-terminated, into the pool: NULL when it would exceed
 * ENTRY_MAX (then nothing is kept, as snprintf's truncation was refused) */
static char *pool_keep(const char *a, size_t a_len, const char *b)
{
    size_t b_len = b ? strlen(b) : 0;
    char *at = pool + pool_used;

    if (a_len + b_len + 1 > ENTRY_MAX || pool_used + a_len + b_len + 1 > sizeof(pool))
        return NULL;
    memcpy(at, a, a_len);
    memcpy(at + a_len, b, b_len);
    at[a_len + b_len] = '\0';
    pool_used += a_len + b_len + 1;
    return at;
}

/* Our library's path: the loaded object whose segments hold this code
 * (dladdr would also look for the nearest symbol, through the whole
 * symbol table, at every program's start). */
static int find_self(struct dl_phdr_info *info, size_t size, void *unused)
{
    uintptr_t here = (uintptr_t)find_self;

    (void)size;
    (void)unused;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = (uintptr_t)info->dlpi_addr + ph->p_vaddr;

        if (ph->p_type == PT_LOAD && here >= start && here - start < ph->p_memsz) {
            const char *kept_path;

            if (info->dlpi_name && info->dlpi_name[0]
                && (kept_path = pool_keep(info->dlpi_name, strlen(info->dlpi_name), NULL))) {
                preload_value = kept_path;
                preload_len = strlen(kept_path);
            }
            return 1;
        }
    }
    return 0;
}

/* (no snprintf here: its first call in a process touches a dozen pages of
 * libc, which every exec'd program would pay) */
void exec_env_capture(int (*fate)(void))
{
    const char *v;

    fate_on_now = fate;
    for (size_t i = 0; i < sizeof(kept_names) / sizeof(kept_names[0]) && n_kept < KEPT; i++) {
        char name_eq[64];
        size_t len = strlen(kept_names[i]);

        v = getenv(kept_names[i]);
        if (v == NULL || len + 2 > sizeof(name_eq))
            continue;
        memcpy(name_eq, kept_names[i], len);
        name_eq[len] = '=';
        if ((kept[n_kept] = pool_keep(name_eq, len + 1, v)) != NULL)
            kept_name_len[n_kept++] = len + 1;
    }
    dl_iterate_phdr(find_self, NULL);
    if ((v = getenv("DMTCP_SSH_WRAPPER")) && (v = pool_keep(v, strlen(v), NULL)))
        ssh_wrapper = v;
    if ((v = getenv("DMTCP_SRUN_WRAPPER")) && (v = pool_keep(v, strlen(v), NULL)))
        srun_wrapper = v;
}

/*
 * The string helpers of the fork+exec path are the shim's own: between
 * fork and exec every libc page touched for the first time costs the
 * child a page fault (a forked child maps libc's code anew), and every
 * libc function the shim calls there for the first time is bound there,
 * in each child, by the lazy binder.
 */
static int has_prefix(const char *s, const char *prefix, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != prefix[i])
            return 0;
    return 1;
}

static int same_string(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static const char *base_name(const char *path)
{
    const char *base = path;

    for (; *path; path++)
        if (*path == '/')
            base = path + 1;
    return base;
}

/* dst = the parts, up to a NULL one, one after the other (NUL-terminated,
 * cut to size) */
static void join(char *dst, size_t size, const char *const parts[])
{
    size_t n = 0;

    for (int p = 0; parts[p]; p++)
        for (const char *s = parts[p]; *s && n + 1 < size; s++)
            dst[n++] = *s;
    dst[n] = '\0';
}

/* whether the colon-separated list holds path as one of its entries, or
 * (as libc's strstr said before) anywhere in it */
static int list_holds(const char *list, const char *path, size_t len)
{
    if (has_prefix(list, path, len) && (list[len] == ':' || list[len] == '\0'))
        return 1; /* the usual case: the shim first */
    return strstr(list, path) != NULL;
}

static int name_is(const char *entry, const char *name_eq, size_t len)
{
    return has_prefix(entry, name_eq, len);
}

static size_t env_len(char *const *envp)
{
    size_t n = 0;

    while (envp && envp[n])
        n++;
    return n;
}

static char fate_on[] = DMTCP_ENV_FATE "=1";

/*
 * Fill out[] (room for env_len(envp) + KEPT + 3 entries) with envp, our
 * variables replacing any of the same name, DMTCP_FATE=1 while FATE 1 is
 * in force, and LD_PRELOAD with the shim first; preload_buf holds that
 * entry.
 */
static char **reassert(char *const *envp, char **out, char *preload_buf, size_t buf_len)
{
    size_t n = 0;
    const char *their_preload = NULL;

    for (size_t i = 0; envp && envp[i]; i++) {
        int ours = name_is(envp[i], "LD_PRELOAD=", 11)
                   || name_is(envp[i], DMTCP_ENV_FATE "=", sizeof(DMTCP_ENV_FATE));

        for (int k = 0; k < n_kept && !ours; k++)
            ours = name_is(envp[i], kept[k], kept_name_len[k]);
        if (name_is(envp[i], "LD_PRELOAD=", 11))
            their_preload = envp[i] + 11;
        if (!ours)
            out[n++] = envp[i];
    }
    for (int k = 0; k < n_kept; k++)
        out[n++] = kept[k];
    if (dies_with_agent())
        out[n++] = fate_on;
    if (preload_value[0]) {
        if (their_preload && list_holds(their_preload, preload_value, preload_len))
            join(preload_buf, buf_len, (const char *const[]){ "LD_PRELOAD=", their_preload, NULL });
        else if (their_preload && their_preload[0])
            join(preload_buf, buf_len, (const char *const[]){ "LD_PRELOAD=", preload_value, ":",
                                                              their_preload, NULL });
        else
            join(preload_buf, buf_len, (const char *const[]){ "LD_PRELOAD=", preload_value, NULL });
        out[n++] = preload_buf;
    }
    out[n] = NULL;
    return out;
}

/* set to a non-empty value in envp */
static int env_set(char *const *envp, const char *name_eq, size_t len)
{
    for (size_t i = 0; envp && envp[i]; i++)
        if (name_is(envp[i], name_eq, len) && envp[i][len] != '\0')
            return 1;
    return 0;
}

/*
 * The wrapper to run instead when path (or a name looked up in PATH) is a
 * command to take over: dmtcp-ssh for ssh, dmtcp-srun for Slurm's srun;
 * NULL for anything else, or when the caller is that wrapper itself
 * (DMTCP_SSH_DIRECT / DMTCP_SRUN_DIRECT set).
 */
static const char *wrapper_for(const char *path, char *const *envp)
{
    const char *base = base_name(path);

    if (ssh_wrapper[0] && same_string(base, "ssh"))
        return env_set(envp, "DMTCP_SSH_DIRECT=", 17) ? NULL : ssh_wrapper;
    if (srun_wrapper[0] && same_string(base, "srun"))
        return env_set(envp, "DMTCP_SRUN_DIRECT=", 18) ? NULL : srun_wrapper;
    return NULL;
}

/* newargv: wrapper, the ssh asked for, then its arguments (argv[1] on) */
#define WITH_SSH_ARGV(wrapper, path, argv, newargv) \
    size_t n_##newargv = env_len(argv), k_##newargv = 2; \
    char *newargv[n_##newargv + 3]; \
    newargv[0] = (char *)(wrapper); \
    newargv[1] = (char *)(path); \
    for (size_t i_ = 1; i_ < n_##newargv; i_++) \
        newargv[k_##newargv++] = argv[i_]; \
    newargv[k_##newargv] = NULL

#define WITH_ENV(envp, newenv) \
    char *newenv##_arr[env_len(envp) + KEPT + 3]; \
    char newenv##_pre[4096]; \
    char **newenv = reassert(envp, newenv##_arr, newenv##_pre, sizeof(newenv##_pre))

/*
 * What every exec and spawn does: our environment back in, and an ssh or
 * srun to take over runs as its wrapper (by its path, hence always real_execve or
 * real_posix_spawn); anything else goes to the real call asked for (file:
 * a path, or a name for the PATH-searching forms).
 */
typedef int (*exec_fn)(const char *file, char *const argv[], char *const envp[]);
typedef int (*spawn_fn)(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);

/*
 * The agent may send the reserved signal (its wake-up) at any time; until
 * the new program's shim has installed its handler the signal's default
 * action would end the process.  So it is blocked across exec: it waits,
 * pending, for the new shim, which unblocks it (suspend_init).
 */
/* (a raw system call on a set made here: sigemptyset, sigaddset and
 * pthread_sigmask lie on two pages of libc that a forked child would
 * fault in just for this; only the calling thread's mask changes, as with
 * pthread_sigmask, and the set holds none of libc's own signals) */
static void block_reserved(sigset_t *old)
{
    sigset_t one;
    const size_t bits = 8 * sizeof(one.__val[0]);
    int sig = suspend_signal();

    memset(&one, 0, sizeof(one));
    memset(old, 0, sizeof(*old));
    if (sig > 0)
        one.__val[(sig - 1) / bits] |= 1UL << ((sig - 1) % bits);
    syscall(SYS_rt_sigprocmask, SIG_BLOCK, &one, old, _NSIG / 8);
}

static int unblock_after(int result, const sigset_t *old)
{
    int saved = errno;

    real_pthread_sigmask(SIG_SETMASK, old, NULL);
    errno = saved;
    return result;
}

static int exec_in_tree(exec_fn real, const char *file, char *const argv[], char *const envp[])
{
    const char *wrapper = wrapper_for(file, envp);
    sigset_t old;
    WITH_ENV(envp, env);
    if (wrapper) {
        WITH_SSH_ARGV(wrapper, file, argv, wargv);
        block_reserved(&old);
        return unblock_after(real_execve(wrapper, wargv, env), &old);
    }
    block_reserved(&old);
    return unblock_after(real(file, argv, env), &old);
}

/* A spawned child gets the reserved signal blocked for the same reason
 * (libc's spawn sets default handlers in the child before its exec): attr,
 * or a copy of it with the signal added to the child's mask. */
static const posix_spawnattr_t *reserved_blocked(const posix_spawnattr_t *attr,
                                                 posix_spawnattr_t *copy)
{
    short flags = 0;
    sigset_t mask;

    if (suspend_signal() <= 0)
        return attr;
    if (attr) {
        *copy = *attr; /* plain data */
        posix_spawnattr_getflags(copy, &flags);
    } else {
        posix_spawnattr_init(copy);
    }
    if (flags & POSIX_SPAWN_SETSIGMASK)
        posix_spawnattr_getsigmask(copy, &mask);
    else
        real_pthread_sigmask(SIG_BLOCK, NULL, &mask);
    sigaddset(&mask, suspend_signal());
    posix_spawnattr_setsigmask(copy, &mask);
    posix_spawnattr_setflags(copy, (short)(flags | POSIX_SPAWN_SETSIGMASK));
    return copy;
}

static int spawn_in_tree(spawn_fn real, pid_t *pid, const char *file,
                         const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                         char *const argv[], char *const envp[])
{
    const char *wrapper = wrapper_for(file, envp);
    posix_spawnattr_t copy;
    WITH_ENV(envp, env);
    attr = reserved_blocked(attr, &copy);
    if (wrapper) {
        WITH_SSH_ARGV(wrapper, file, argv, wargv);
        return real_posix_spawn(pid, wrapper, fa, attr, wargv, env);
    }
    return real(pid, file, fa, attr, argv, env);
}

SHIM_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    return exec_in_tree(real_execve, path, argv, envp);
}

SHIM_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    return exec_in_tree(real_execvpe, file, argv, envp);
}

SHIM_EXPORT int execv(const char *path, char *const argv[])
{
    return execve(path, argv, environ);
}

SHIM_EXPORT int execvp(const char *file, char *const argv[])
{
    return execvpe(file, argv, environ);
}

/* the variadic forms: collect the arguments on the stack */
#define COLLECT_ARGS(arg0, argv, then_envp) \
    size_t argc_ = 1; \
    va_list ap_; \
    va_start(ap_, arg0); \
    while (va_arg(ap_, char *) != NULL) \
        argc_++; \
    va_end(ap_); \
    char *argv[argc_ + 1]; \
    argv[0] = (char *)(arg0); \
    va_start(ap_, arg0); \
    for (size_t i_ = 1; i_ <= argc_; i_++) \
        argv[i_] = va_arg(ap_, char *); \
    then_envp; \
    va_end(ap_)

SHIM_EXPORT int execl(const char *path, const char *arg, ...)
{
    COLLECT_ARGS(arg, argv, (void)0);
    return execve(path, argv, environ);
}

SHIM_EXPORT int execlp(const char *file, const char *arg, ...)
{
    COLLECT_ARGS(arg, argv, (void)0);
    return execvpe(file, argv, environ);
}

SHIM_EXPORT int execle(const char *path, const char *arg, ...)
{
    char *const *envp;

    COLLECT_ARGS(arg, argv, envp = va_arg(ap_, char *const *));
    return execve(path, argv, envp);
}

SHIM_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                            const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    return spawn_in_tree(real_posix_spawn, pid, path, fa, attr, argv, envp);
}

SHIM_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                             const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    return spawn_in_tree(real_posix_spawnp, pid, file, fa, attr, argv, envp);
}

/* system() and popen() use the process's environment through libc's
 * internal spawn: repair that environment in place first. */
static void repair_environ(void)
{
    char buf[4096];
    const char *cur;

    for (int k = 0; k < n_kept; k++) {
        char *eq = kept[k] + kept_name_len[k] - 1;
        size_t len = kept_name_len[k] - 1;
        char name[64];

        if (len >= sizeof(name))
            continue;
        memcpy(name, kept[k], len);
        name[len] = '\0';
        if (!getenv(name) || strcmp(getenv(name), eq + 1) != 0)
            setenv(name, eq + 1, 1);
    }
    if (dies_with_agent())
        setenv(DMTCP_ENV_FATE, "1", 1);
    else if (getenv(DMTCP_ENV_FATE))
        unsetenv(DMTCP_ENV_FATE);
    cur = getenv("LD_PRELOAD");
    if (preload_value[0] && (!cur || !strstr(cur, preload_value))) {
        if (cur && cur[0])
            snprintf(buf, sizeof(buf), "%s:%s", preload_value, cur);
        else
            snprintf(buf, sizeof(buf), "%s", preload_value);
        setenv("LD_PRELOAD", buf, 1);
    }
}

/*
 * system() as libc does it (SIGINT and SIGQUIT ignored and SIGCHLD
 * blocked while the command runs, /bin/sh -c), but spawned with the
 * reserved signal blocked in the child (see block_reserved): libc's own
 * spawn would leave it open, to the default action, before the shell's
 * exec.  libc's wait stays unseen, as before (wrap_child.c).
 */
SHIM_EXPORT int system(const char *command)
{
    struct sigaction ignore, old_int, old_quit;
    sigset_t chld, old_mask, defaults, child_mask;
    posix_spawnattr_t attr;
    pid_t pid;
    int status = -1, saved;

    repair_environ();
    if (command == NULL || suspend_signal() <= 0)
        return real_system(command); /* (NULL: is there a shell) */
    memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    real_sigaction(SIGINT, &ignore, &old_int);
    real_sigaction(SIGQUIT, &ignore, &old_quit);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    real_pthread_sigmask(SIG_BLOCK, &chld, &old_mask);
    sigemptyset(&defaults);
    if (old_int.sa_handler != SIG_IGN)
        sigaddset(&defaults, SIGINT);
    if (old_quit.sa_handler != SIG_IGN)
        sigaddset(&defaults, SIGQUIT);
    child_mask = old_mask;
    sigaddset(&child_mask, suspend_signal());
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &child_mask);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    if (real_posix_spawn(&pid, "/bin/sh", NULL, &attr,
                         (char *const[]){ "sh", "-c", "--", (char *)command, NULL }, environ) == 0) {
        while (real_waitpid(pid, &status, 0) < 0) {
            if (errno != EINTR) {
                status = -1;
                break;
            }
        }
    } else {
        status = 127 << 8; /* as the shell says when it cannot run */
    }
    posix_spawnattr_destroy(&attr);
    saved = errno;
    real_sigaction(SIGINT, &old_int, NULL);
    real_sigaction(SIGQUIT, &old_quit, NULL);
    real_pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    errno = saved;
    return status;
}

/* popen's child inherits this thread's mask: the reserved signal blocked
 * for the spawn only. */
SHIM_EXPORT FILE *popen(const char *command, const char *type)
{
    sigset_t old;
    FILE *f;

    repair_environ();
    block_reserved(&old);
    f = real_popen(command, type);
    real_pthread_sigmask(SIG_SETMASK, &old, NULL);
    return f;
}
