#!/usr/bin/env bash
# slurm-cluster.sh up N | down | status: a Slurm test cluster on this machine
# (DESIGN.md sections 1 and 6).  Run as root.
#
#   up N    munged (a key and a socket of the cluster's own), slurmctld in the
#           machine's namespace, and N compute nodes h1..hN: namespace hosts
#           of tests/multihost/netns.py (own hostname, /dev/shm and address)
#           each running slurmd inside its namespaces, so that
#           `srun -N2 hostname` prints "h1" and "h2".
#   down    stops every daemon `up` started (by the pids it recorded),
#           removes the hosts and every file of the cluster; also after a
#           partial or failed `up`.
#   status  what runs; exit 0 if the whole cluster is up, 1 otherwise.
#
# Everything lives in $STATE (below); point the Slurm commands at the cluster
# with  export SLURM_CONF=/run/dmtcp-slurm/slurm.conf
# The hosts are on 198.19.100.0/24 (h1 = .1, ...); the machine's side of
# their bridge is the veth "dmtcp-slurm" with .254, where slurmctld listens.
# Ports and paths differ from Debian's own munge/slurm services, which this
# script neither needs nor touches.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."

STATE=/run/dmtcp-slurm
CONF=$STATE/slurm.conf
SUBNET_BASE=198.19.100          # a /24 of 198.18.0.0/15, the test range
CTLD_ADDR=$SUBNET_BASE.254
VETH=dmtcp-slurm                # the machine's end of the link to the bridge
CTLD_PORT=16817                 # Debian's defaults are 6817/6818
SLURMD_PORT=16818
TIMEOUT=${SLURM_CLUSTER_TIMEOUT:-30}   # seconds for each daemon to come up
MAX_NODES=64

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

prog=slurm-cluster
die() { echo "$prog: error: $*" >&2; exit 1; }
say() { [ -n "${QUIET-}" ] || echo "$prog: $*" >&2; }

# --- processes, identified by pid and start time (pid reuse is harmless) ---

start_time() {  # pid -> start time in ticks; fails if gone or a zombie
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    [ "$1" != Z ] || return 1
    echo "${20}"
}

alive() { [ "$(start_time "$1" 2>/dev/null)" = "$2" ]; }

# kind name command...: start command in the background, detached (own
# session, the lock's fd closed); the child records itself in $STATE/pids
# before it execs, so that down knows it even if this script is killed the
# moment after the fork.  The pid is left in $STARTED.
launch() {
    local kind=$1 name=$2
    shift 2
    (
        me=$BASHPID  # (inside $(...) it would be that subshell's pid)
        echo "$kind $name $me $(start_time "$me")" >>"$STATE/pids"
        exec setsid "$@"
    ) 9<&- &
    STARTED=$!
}

recorded_start() {  # pid: its start time, once the child has recorded it
    local k name pid st i
    for ((i = 0; i < 500; i++)); do
        if [ -f "$STATE/pids" ]; then
            while read -r k name pid st; do
                [ "$pid" = "$1" ] && { echo "$st"; return 0; }
            done <"$STATE/pids"
        fi
        sleep 0.01
    done
    echo 0
}

stop_pid() {  # pid start: SIGTERM, then SIGKILL; wait until it is gone
    local pid=$1 st=$2 i
    alive "$pid" "$st" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        alive "$pid" "$st" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        alive "$pid" "$st" || return 0
        sleep 0.1
    done
    echo "$prog: warning: pid $pid would not die" >&2
}

log_tail() {  # files...: the last lines of the first that has any (the
    local f   # daemons' stderr comes first: it has what the log file has)
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "--- last lines of $f:"
        tail -n 15 "$f"
        return 0
    done
    echo "--- (its log is empty: $*)"
}

# Fail with one line naming the daemon, then its log, then clean up.
fail_daemon() {  # what, message, logs...
    local what=$1 msg=$2
    shift 2
    {
        echo "$prog: error: $what $msg"
        log_tail "$@"
    } >&2
    exit 1
}

wait_for() {  # what, pid, start, probe command..., with logs in WAIT_LOGS
    local what=$1 pid=$2 st=$3 deadline
    shift 3
    deadline=$((SECONDS + TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        alive "$pid" "$st" || fail_daemon "$what" "exited while starting" "${WAIT_LOGS[@]}"
        [ "$SECONDS" -lt "$deadline" ] \
            || fail_daemon "$what" "did not come up within ${TIMEOUT}s" "${WAIT_LOGS[@]}"
        sleep 0.2
    done
}

# --- up ---

munge_ok() {
    munge -n -S "$STATE/munge-socket/munge.socket" \
        | unmunge -S "$STATE/munge-socket/munge.socket"
}

ctld_ok() { [[ "$(SLURM_CONF=$CONF scontrol ping 2>&1)" == *" is UP"* ]]; }

nodes_ok() {  # every node registered and idle
    local states
    states=$(SLURM_CONF=$CONF sinfo -h -N -o "%N %t") || return 1
    [ "$(grep -c " idle$" <<<"$states")" -eq "$N" ]
}

write_conf() {
    local host i
    host=$(hostname -s)
    {
        echo "# Written by scripts/slurm-cluster.sh; removed by its down."
        echo "ClusterName=dmtcp"
        echo "SlurmctldHost=$host($CTLD_ADDR)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmdPort=$SLURMD_PORT"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$STATE/munge-socket/munge.socket"
        echo "StateSaveLocation=$STATE/ctld"
        echo "SlurmctldPidFile=$STATE/slurmctld.pid"
        echo "SlurmctldLogFile=$STATE/slurmctld.log"
        echo "SlurmdSpoolDir=$STATE/nodes/%n"
        echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
        echo "SlurmdLogFile=$STATE/slurmd-%n.log"
        echo "PlugStackConfig=$STATE/plugstack.conf"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "SwitchType=switch/none"
        echo "MpiDefault=none"
        echo "MailProg=/bin/true"
        echo "ReturnToService=2"
        echo "SlurmdTimeout=10"
        echo "SlurmctldTimeout=10"
        echo "InactiveLimit=0"
        echo "KillWait=5"
        echo "JobRequeue=1"
        for ((i = 1; i <= N; i++)); do
            echo "NodeName=h$i NodeAddr=$SUBNET_BASE.$i CPUs=$(nproc) State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF"
    : >"$STATE/plugstack.conf"
}

start_munged() {
    local d=$STATE/munge pid
    mkdir -m 0700 "$d"
    mkdir -m 0755 "$STATE/munge-socket"
    mungekey --create --keyfile="$d/munge.key"
    chmod 0400 "$d/munge.key"
    chown -R munge:munge "$d" "$STATE/munge-socket"
    launch daemon munged setpriv --reuid=munge --regid=munge --init-groups \
        munged -F --socket="$STATE/munge-socket/munge.socket" --key-file="$d/munge.key" \
        --pid-file="$d/munged.pid" --seed-file="$d/munged.seed" \
        </dev/null >"$STATE/munged.out" 2>&1
    pid=$STARTED
    WAIT_LOGS=("$STATE/munged.out")
    wait_for munged "$pid" "$(recorded_start "$pid")" munge_ok
}

start_hosts() {  # the namespace hosts, held by a netns.py process
    local pid line deadline st
    launch hosts netns "$PYTHON" -m tests.multihost.netns up "$N" --tag slurm \
        --subnet "$SUBNET_BASE.0/24" </dev/null >"$STATE/hosts.out" 2>&1
    pid=$STARTED
    st=$(recorded_start "$pid")
    deadline=$((SECONDS + TIMEOUT))
    until grep -qx ready "$STATE/hosts.out"; do
        alive "$pid" "$st" || fail_daemon "the namespace hosts (netns.py)" "failed" "$STATE/hosts.out"
        [ "$SECONDS" -lt "$deadline" ] \
            || fail_daemon "the namespace hosts (netns.py)" "did not come up within ${TIMEOUT}s" \
                "$STATE/hosts.out"
        sleep 0.1
    done
    # "h1 198.19.100.1 dmtcp-th-<pid>-<start>-slurm-h1": the switch namespace
    # and the run directory (UTS and mount pins) share that prefix.
    line=$(grep -m1 '^h1 ' "$STATE/hosts.out")
    PREFIX=${line##* }
    PREFIX=${PREFIX%h1}
}

link_machine() {  # the machine's own veth onto the hosts' bridge
    ip link add "$VETH" type veth peer name machine netns "${PREFIX}switch"
    ip -n "${PREFIX}switch" link set machine master br0 up
    ip addr add "$CTLD_ADDR/24" dev "$VETH"
    ip link set "$VETH" up
}

start_slurmctld() {
    local pid
    mkdir -m 0700 "$STATE/ctld"
    launch daemon slurmctld slurmctld -D -i -f "$CONF" </dev/null >"$STATE/slurmctld.out" 2>&1
    pid=$STARTED
    WAIT_LOGS=("$STATE/slurmctld.out" "$STATE/slurmctld.log")
    wait_for slurmctld "$pid" "$(recorded_start "$pid")" ctld_ok
}

start_slurmd() {  # in host h$1's network, UTS and mount namespaces
    local name=h$1 run_dir
    run_dir=/run/${PREFIX%-}
    mkdir -p "$STATE/nodes/$name"
    # stdio is opened inside the host, as netns.py does for its commands
    launch slurmd "$name" nsenter --net="/run/netns/$PREFIX$name" --uts="$run_dir/$name.uts" \
        --mount="$run_dir/$name.mnt" -- /bin/sh -c 'out=$1; shift; exec "$@" </dev/null >>"$out" 2>&1' \
        sh "$STATE/slurmd-$name.out" slurmd -D -f "$CONF" </dev/null >/dev/null 2>&1
}

cmd_up() {
    [[ "${1-}" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$MAX_NODES" ] \
        || die "up N: N must be a number from 1 to $MAX_NODES, not '${1-}'"
    N=$((10#$1))
    [ ! -e "$STATE" ] || die "a cluster is already up, or a failed one left $STATE: run '$0 down' first"
    ! ip link show "$VETH" >/dev/null 2>&1 || die "a link '$VETH' exists already: run '$0 down' first"
    [ -z "$(ss -Hltn "sport = :$CTLD_PORT")" ] \
        || die "TCP port $CTLD_PORT (slurmctld's) is in use on this machine"
    local cmd
    for cmd in munged mungekey munge slurmctld slurmd scontrol sinfo nsenter setpriv ss flock; do
        command -v "$cmd" >/dev/null || die "$cmd not found (run scripts/setup.sh)"
    done
    id munge >/dev/null 2>&1 || die "no user 'munge' (run scripts/setup.sh)"
    [[ ! "$(hostname -s)" =~ ^h[0-9]+$ ]] || die "this machine's name $(hostname -s) is a node name"
    mkdir -m 0755 "$STATE"
    # From here on, whatever fails takes down what was started.
    trap 'rc=$?; if [ $rc -ne 0 ]; then QUIET=1 cmd_down || true; fi' EXIT
    trap 'exit 130' INT TERM HUP
    write_conf
    start_munged
    start_hosts
    link_machine
    start_slurmctld
    local i
    for ((i = 1; i <= N; i++)); do
        start_slurmd "$i"
    done
    # each slurmd must still run, and all must have registered
    local deadline=$((SECONDS + TIMEOUT)) kind name pid st
    until nodes_ok; do
        while read -r kind name pid st; do
            [ "$kind" = slurmd ] || continue
            alive "$pid" "$st" || fail_daemon "slurmd on $name" "exited while starting" \
                "$STATE/slurmd-$name.out" "$STATE/slurmd-$name.log"
            [ "$SECONDS" -lt "$deadline" ] || fail_daemon "slurmd on $name" \
                "did not come up within ${TIMEOUT}s" "$STATE/slurmd-$name.out" "$STATE/slurmd-$name.log"
        done <"$STATE/pids"
        sleep 0.2
    done
    trap - EXIT
    say "up: $N nodes (h1..h$N); export SLURM_CONF=$CONF"
}

# --- down ---

stop_recorded() {  # kind, name pattern: stop those recorded processes
    local k name pid st
    [ -f "$STATE/pids" ] || return 0
    while read -r k name pid st; do
        # shellcheck disable=SC2254
        case "$k $name" in "$1 "$2) stop_pid "$pid" "$st" ;; esac
    done <"$STATE/pids"
}

cmd_down() {
    if [ ! -e "$STATE" ] && ! ip link show "$VETH" >/dev/null 2>&1; then
        say "down: no cluster"
        return 0
    fi
    # slurmd first, then slurmctld, munged, and the hosts last
    stop_recorded slurmd '*'
    stop_recorded daemon slurmctld
    stop_recorded daemon munged
    stop_recorded hosts netns
    ip link del "$VETH" 2>/dev/null || true
    # The hosts' holder closes its network on SIGTERM; if it died another
    # way, netns.py's sweep removes what its network left (only that one:
    # the prefix holds the holder's pid and start time).
    local k name pid st
    if [ -f "$STATE/pids" ]; then
        while read -r k name pid st; do
            [ "$k" = hosts ] || continue
            if compgen -G "/run/netns/dmtcp-th-$pid-$st-slurm-*" >/dev/null \
                    || [ -e "/run/dmtcp-th-$pid-$st-slurm" ]; then
                "$PYTHON" -m tests.multihost.netns sweep --prefix "dmtcp-th-$pid-$st-slurm-" >/dev/null
            fi
        done <"$STATE/pids"
    fi
    rm -rf "$STATE"
    say "down: done"
}

# --- status ---

cmd_status() {
    if [ ! -e "$STATE" ]; then
        echo "no cluster ($STATE does not exist)"
        return 1
    fi
    local k name pid st all=0
    if [ -f "$STATE/pids" ]; then
        while read -r k name pid st; do
            if alive "$pid" "$st"; then
                printf '%-7s %-10s running (pid %s)\n' "$k" "$name" "$pid"
            else
                printf '%-7s %-10s NOT running (was pid %s)\n' "$k" "$name" "$pid"
                all=1
            fi
        done <"$STATE/pids"
    fi
    echo "SLURM_CONF=$CONF"
    if alive_ctld; then
        SLURM_CONF=$CONF sinfo -N -o "%N %t %o" 2>&1 || true
    else
        all=1
    fi
    return "$all"
}

alive_ctld() { [ -f "$CONF" ] && ctld_ok >/dev/null 2>&1; }

# One up or down at a time on this machine ($STATE is one per machine, so
# the lock is too, whichever clone runs this script); a child of a
# just-killed run may hold it for a moment.
LOCK=/run/lock/dmtcp-slurm-cluster.lock
lock() {
    mkdir -p "$(dirname "$LOCK")"
    exec 9>>"$LOCK"
    flock -w 10 9 || die "another $0 up/down is running"
}

[ "$(id -u)" = 0 ] || die "run as root (namespaces, munged as user munge)"
case "${1-}" in
    up)
        [ $# -eq 2 ] || die "usage: $0 up N"
        lock
        cmd_up "$2"
        ;;
    down)
        lock
        cmd_down
        ;;
    status) cmd_status ;;
    *) die "usage: $0 up N | down | status" ;;
esac
