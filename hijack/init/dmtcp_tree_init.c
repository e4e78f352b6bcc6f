/*
 * dmtcp_tree_init: the root of every checkpointed process tree.
 *
 * CRIU dumps the descendants of one process.  A process orphaned inside
 * the program (say the background job of system("cmd &")) is re-parented
 * to the nearest subreaper; if that were the agent, it would be outside
 * the dumped tree and silently lost.  So this small program, started by
 * the agent, is the subreaper: it runs the program as its child, reaps
 * every orphan, forwards the agent's signals, and exits the way the
 * program did.  It is linked statically, so LD_PRELOAD does not load the
 * shim into it and it is not counted as a process of the program.
 *
 * As root it is pid 1 of a PID namespace of the tree's own, made by the
 * agent (dmtcp_py/agent/tree.py), so that a restart gets the tree's pids
 * whatever the host's pids do.  It then leads a session of its own (CRIU
 * wants the namespace's session leader inside it), sends SIGINT and
 * SIGQUIT on to every process of the namespace, works in a directory the
 * agent names (DMTCP_INIT_DIR, see dmtcp_py/agent/init_dir.py), and tells
 * the agent how the program ended (PROGRAM_ENDED), since pid 1 cannot end
 * by the program's signal.
 *
 * An orphan it reaps that a failure signal killed is told to the agent
 * (CHILD_KILLED, dmtcp_record.h), as the shim's wait wrappers tell of the
 * children their program reaps: the program's end may be a failure then.
 *
 * usage: dmtcp_tree_init PATH ARGV0 [ARGS...]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent_addr.h"
#include "dmtcp_record.h"

static volatile pid_t program;

static void forward(int sig)
{
    if (program > 0)
        kill(program, sig);
}

/* In a PID namespace of its own the tree is in a session of its own too:
 * a terminal's ^C and ^\ reach only the agent, which sends them here.
 * They go to every process of the namespace, as a terminal sends them to
 * its whole foreground group (kill(-1) spares the sender, pid 1). */
static void forward_to_all(int sig)
{
    kill(-1, sig);
}

static const int forwarded[] = { SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 };
/* the terminal sends these to the whole foreground group already */
static const int ignored[] = { SIGINT, SIGQUIT };

static void set_handlers(int for_child, int own_namespace)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++) {
        sa.sa_handler = for_child ? SIG_DFL : forward;
        sigaction(forwarded[i], &sa, NULL);
    }
    for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++) {
        sa.sa_handler = for_child ? SIG_DFL : own_namespace ? forward_to_all : SIG_IGN;
        sigaction(ignored[i], &sa, NULL);
    }
}

/* One record on a connection of its own; never waits (an agent that
 * cannot take it at once does not hear of it). */
static void tell(uint16_t type, uint64_t arg)
{
    struct sockaddr_un addr;
    struct dmtcp_record rec;
    socklen_t len;
    int fd;

    if (dmtcp_agent_addr(getenv(DMTCP_ENV_AGENT_SOCK), &addr, &len) < 0)
        return;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return;
    if (connect(fd, (struct sockaddr *)&addr, len) == 0) {
        memset(&rec, 0, sizeof(rec));
        rec.magic = DMTCP_RECORD_MAGIC;
        rec.version = DMTCP_RECORD_VERSION;
        rec.type = type;
        rec.pid = (int32_t)getpid();
        rec.ppid = (int32_t)getppid();
        rec.arg = arg;
        (void)!send(fd, &rec, sizeof(rec), MSG_NOSIGNAL);
    }
    close(fd);
}

/* An orphan a failure signal killed: CHILD_KILLED. */
static void tell_killed(pid_t pid, int status)
{
    int sig, core;

    if (!WIFSIGNALED(status))
        return;
    sig = WTERMSIG(status);
    core = WCOREDUMP(status) != 0;
    if (sig <= 0 || sig >= 64 || (!core && !((DMTCP_FAILURE_SIGNALS >> sig) & 1)))
        return;
    tell(DMTCP_REC_CHILD_KILLED, (uint64_t)(uint32_t)pid
         | (uint64_t)sig << DMTCP_KILLED_SIGNAL_SHIFT | (core ? DMTCP_KILLED_CORE : 0));
}

int main(int argc, char **argv)
{
    int report[2], err = 0, status = 0, done = 0, own_namespace;
    static char workdir[4096];
    const char *dir = getenv("DMTCP_INIT_DIR");
    pid_t pid;

    if (argc < 3) {
        fprintf(stderr, "usage: dmtcp_tree_init PATH ARGV0 [ARGS...]\n");
        return 2;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* pid 1: the agent made a PID namespace for the tree (so that a copy
     * of its checkpoint restores beside it, with the same pids) */
    own_namespace = getpid() == 1;
    /* getsid() is 0 when our session leader lives in an ancestor PID
     * namespace (a container or CI runner started with `unshare -p` and no
     * setsid).  CRIU cannot dump a task whose session it cannot see, even
     * as a shell job, so the tree gets a session of its own; it has no
     * terminal to lose, since a controlling terminal belongs to that
     * invisible session. */
    if (getsid(0) == 0)
        (void)setsid();
    /* A System V IPC namespace of the tree's own: CRIU saves and restores
     * SysV shared memory, semaphores and message queues (and POSIX message
     * queues) only for a task tree that has one.  Best effort: without
     * CAP_SYS_ADMIN the program still runs, its SysV objects unsaved. */
    (void)unshare(CLONE_NEWIPC);
    /* where to work once the program runs (dmtcp_py/agent/init_dir.py: a
     * place of its own for the /proc CRIU mounts to dump a namespace);
     * not the program's business */
    if (dir != NULL && strlen(dir) < sizeof(workdir))
        memcpy(workdir, dir, strlen(dir) + 1);
    unsetenv("DMTCP_INIT_DIR");
    set_handlers(0, own_namespace);
    if (pipe2(report, O_CLOEXEC) != 0)
        return 2;
    pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0) {
        set_handlers(1, 0);
        execv(argv[1], argv + 2);
        err = errno;
        (void)!write(report[1], &err, sizeof(err));
        _exit(127);
    }
    program = pid;
    if (own_namespace && workdir[0] != '\0')
        (void)!chdir(workdir);
    close(report[1]);
    if (read(report[0], &err, sizeof(err)) == (ssize_t)sizeof(err)) {
        fprintf(stderr, "dmtcp-launch: error: cannot run %s: %s\n", argv[1], strerror(err));
        return err == ENOENT ? 127 : 126;
    }
    close(report[0]);
    /* reap everything; leave when the program and every orphan are gone */
    for (;;) {
        int st;
        pid_t w = waitpid(-1, &st, 0);

        if (w < 0) {
            if (errno == EINTR)
                continue;
            break; /* ECHILD */
        }
        if (w == program) {
            status = st;
            done = 1;
            program = 0;
        } else {
            tell_killed(w, st);
        }
    }
    if (!done)
        return 1;
    if (own_namespace) {
        /* pid 1 of a namespace ignores every signal it has no handler
         * for, its own kill too: it cannot end the way the program did.
         * The agent hears the status instead; the exit code is a shell's
         * for a signal, for an agent that did not hear. */
        tell(DMTCP_REC_PROGRAM_ENDED, (uint64_t)(uint32_t)status);
        if (WIFSIGNALED(status))
            return 128 + WTERMSIG(status);
    } else if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no core file of ours */
        kill(getpid(), WTERMSIG(status));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
