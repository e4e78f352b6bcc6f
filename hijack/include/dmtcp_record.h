/*
 * The records exchanged between the shim's checkpoint thread and its agent
 * over a Unix stream socket.  Fixed size, native byte order (both ends are
 * on the same host), so neither side needs a parser.
 *
 * A process connects when its agent wakes it: the reserved signal sent
 * to its main thread by tgkill() (SI_TKILL), at the start of every round
 * and when FATE 1 comes into force; one that must hear its agent go
 * (FATE 1), or that uses the API, connects at once.  While connected, the
 * agent's writes signal the thread that serves the link (O_ASYNC,
 * F_SETSIG with the same signal, F_OWNER_TID) when no checkpoint thread
 * serves it (hijack/src/ckpt_thread.c).
 *
 * Conversation, as the agent drives it:
 *   shim  -> HELLO            after every (re)connect
 *   agent -> SUSPEND          shim stops every other thread of its process
 *                             (arg of the answer: threads that would not
 *                             stop), answers SUSPENDED
 *   agent -> ELECT            shim makes itself owner (F_SETOWN) of every
 *                             socket, answers ELECTED
 *   agent -> CHECKPOINT       shim answers READY, closes, and keeps trying
 *                             to reconnect (CRIU must see no fd that leads
 *                             outside the tree while it dumps); arg: 0, or
 *                             a token: the agent listens at the address
 *                             agent_addr.h makes of it once the dump is
 *                             written, and a process that reaches it runs
 *                             again at once (HELLO_RELEASED).  READY's arg:
 *                             the message queue fds the process took out
 *                             of CRIU's sight (hijack/src/mqueue.c): they
 *                             come back from several processes, and none
 *                             may run before all did, so then the agent
 *                             does not listen at the token's address
 *   agent -> PARK (+ payload) arg: how many int32 fd numbers follow; the
 *                             shim hands each of those sockets over with a
 *                             PARKED_FD record carrying it (SCM_RIGHTS; arg:
 *                             fd number | PARK_LEADER if this process is
 *                             the leader of its open file description),
 *                             takes it out of its epoll sets, puts
 *                             /dev/null on its number, answers PARKED (arg:
 *                             how many)
 *   agent -> UNPARK_FD        carries a socket; arg: the fd number it goes
 *                             on (the parked original, or a new one after
 *                             a restart); file flags and epoll sets as
 *                             they were
 *   agent -> UNPARK           all sockets are back; answers UNPARKED (arg:
 *                             parked fds that got no socket: they keep
 *                             /dev/null)
 *   agent -> RESUME           shim restores socket owners, releases its
 *                             threads, answers RESUMED; arg: the
 *                             generation, | DMTCP_RESUME_RESTORED after a
 *                             restart (then the program's hooks run)
 *
 *   agent -> TRACK            (--incremental; only while suspended) shim
 *                             makes a userfaultfd of its memory in
 *                             asynchronous write-protect mode and answers
 *                             TRACKER carrying it (SCM_RIGHTS; arg 0), or
 *                             without it (arg: the errno); it keeps no
 *                             copy (dmtcp_py/agent/tracking.py)
 *
 *   agent -> DONE             the generation is complete (or failed): see
 *                             DMTCP_DONE_FAILED; no answer
 *   agent -> FATE             arg 1: if the agent goes away (its
 *                             connection breaks outside a checkpoint) and
 *                             none answers within DMTCP_FATE_GRACE_MS, the
 *                             process ends (SIGKILL): the coordinator
 *                             restarts the tree from its image and the
 *                             copy must not run on.  arg 0 (the default):
 *                             the process runs on without checkpoints.  No
 *                             answer
 *
 * A program's dmtcp_checkpoint() opens a connection of its own:
 *   shim  -> CKPT_REQUEST     agent answers CKPT_REQUESTED (arg 0: will
 *                             ask), waits for the close, then asks the
 *                             coordinator for a checkpoint
 *
 * A process that reaped a child killed by a failure signal (its wait
 * wrappers, wrap_child.c), and the tree's init for an orphan, say so on a
 * connection of their own, outside any checkpoint:
 *   shim  -> CHILD_KILLED     arg: the child's pid in the low 32 bits, its
 *                             signal << DMTCP_KILLED_SIGNAL_SHIFT, and
 *                             DMTCP_KILLED_CORE if it dumped core; then
 *                             the shim closes.  No answer.  A failure
 *                             signal is one of DMTCP_FAILURE_SIGNALS, or
 *                             any signal that dumped core (not SIGPIPE,
 *                             SIGTERM, SIGINT, SIGHUP...: how programs end
 *                             each other normally)
 *
 * The tree's init, when it is pid 1 of a PID namespace of the tree's own
 * (it cannot end by the program's signal then: pid 1 ignores signals it
 * has no handler for, even its own), on a connection of its own:
 *   init  -> PROGRAM_ENDED    arg: the program's wait status; then the init
 *                             exits (128 + the signal, for a signal).  No
 *                             answer
 *
 * The pid and ppid of a record are the sender's ids in its own PID
 * namespace, as are the pids in CHILD_KILLED's arg; the agent knows each
 * connection's sender by SO_PEERCRED, in its own namespace.
 *
 * HELLO's arg is 1 when the process is still suspended (it reconnects after
 * a dump or a restore): the agent then owes it a RESUME.  It is
 * DMTCP_HELLO_RELEASED when the process came back at the address of its
 * CHECKPOINT's token and let its threads go: it is in the round still (no
 * SUSPEND for it), and takes the round's RESUME for its hooks.  Above
 * DMTCP_HELLO_FD_SHIFT the arg carries the number of the link's fd in
 * the process, plus one (0: an older shim that does not say): the agent's
 * look for sockets that lead out of the tree passes it over.
 *
 * The Python side mirrors these constants and this layout in
 * dmtcp_py/agent/records.py; tests/unit/test_records.py compiles this header
 * and checks that the two agree.
 */
#ifndef DMTCP_RECORD_H
#define DMTCP_RECORD_H

#include <signal.h>
#include <stdint.h>

#define DMTCP_RECORD_MAGIC 0x444d5443u /* "DMTC" */
#define DMTCP_RECORD_VERSION 1

/* Environment: the agent's socket ("@name" means the abstract namespace). */
#define DMTCP_ENV_AGENT_SOCK "DMTCP_AGENT_SOCK"
/* Environment: the reserved signal's number, if not the default. */
#define DMTCP_ENV_SIGCKPT "DMTCP_SIGCKPT"
/* Environment: "1" when FATE 1 is in force (the shim passes it on at
 * exec, so that the new program connects at once: it must hear its agent
 * go). */
#define DMTCP_ENV_FATE "DMTCP_FATE"

enum dmtcp_record_type {
    DMTCP_REC_HELLO = 1,
    DMTCP_REC_SUSPEND = 2,
    DMTCP_REC_SUSPENDED = 3,
    DMTCP_REC_CHECKPOINT = 4,
    DMTCP_REC_READY = 5,
    DMTCP_REC_RESUME = 6,
    DMTCP_REC_RESUMED = 7,
    DMTCP_REC_ELECT = 8,
    DMTCP_REC_ELECTED = 9,
    DMTCP_REC_PARK = 10,
    DMTCP_REC_PARKED_FD = 11,
    DMTCP_REC_PARKED = 12,
    DMTCP_REC_UNPARK_FD = 13,
    DMTCP_REC_UNPARK = 14,
    DMTCP_REC_UNPARKED = 15,
    DMTCP_REC_CKPT_REQUEST = 16,
    DMTCP_REC_CKPT_REQUESTED = 17,
    DMTCP_REC_DONE = 18,
    DMTCP_REC_FATE = 19,
    DMTCP_REC_CHILD_KILLED = 20,
    DMTCP_REC_PROGRAM_ENDED = 21,
    DMTCP_REC_TRACK = 22,
    DMTCP_REC_TRACKER = 23,
};

/* DONE's arg (agent -> shim, no answer): the generation whose images are
 * all published, | DMTCP_DONE_FAILED if it failed instead */
#define DMTCP_DONE_FAILED (1ull << 32)

/* FATE arg 1: how long a process whose agent went away waits for one */
#define DMTCP_FATE_GRACE_MS 3000

/* CHILD_KILLED's arg: the pid in the low 32 bits, the signal from this
 * bit on (8 bits), then this flag when the child dumped core */
#define DMTCP_KILLED_SIGNAL_SHIFT 32
#define DMTCP_KILLED_CORE (1ull << 40)
/* the signals that kill a process by failure (the OOM killer's, faults,
 * abort), one bit per signal number */
#define DMTCP_FAILURE_SIGNALS                                                     \
    ((1ull << SIGKILL) | (1ull << SIGSEGV) | (1ull << SIGBUS) | (1ull << SIGABRT) \
     | (1ull << SIGILL) | (1ull << SIGFPE) | (1ull << SIGSYS))

/* HELLO's arg: back from the dump and already running (see above) */
#define DMTCP_HELLO_RELEASED 2
#define DMTCP_HELLO_FD_SHIFT 32

/* RESUME's arg: the generation in the low 32 bits, then this flag */
#define DMTCP_RESUME_RESTORED (1ull << 32)

/* PARKED_FD's arg: the fd number in the low 32 bits, then these flags */
#define DMTCP_PARK_LEADER (1ull << 32)
/* the most sockets one PARK may name */
#define DMTCP_PARK_MAX 16384

struct dmtcp_record {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    int32_t pid;  /* sender's pid as it sees itself */
    int32_t ppid;
    uint64_t arg;
};

_Static_assert(sizeof(struct dmtcp_record) == 24, "record layout is part of the protocol");

#endif
