#!/usr/bin/env bash
# `make demo`: the main job end to end.  A two-process program is launched
# under a coordinator, checkpointed while it runs, killed, and restarted
# from the generated dmtcp_restart_script.sh; it goes on counting from the
# checkpointed value.  Leaves nothing running and nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/.venv/bin
work=$(mktemp -d /tmp/dmtcp-demo.XXXXXX)
port=$("$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()

cleanup() {
    "$BIN/dmtcp-command" -p "$port" -q >/dev/null 2>&1 || true
    # the coordinator is not our child (--daemon): wait until it is gone
    for _ in $(seq 1 100); do
        "$BIN/dmtcp-command" -p "$port" -s >/dev/null 2>&1 || break
        sleep 0.05
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
show() { printf '   $ %s\n' "$*"; "$@" 2>&1 | sed 's/^/   /'; }
last_tick() { awk '$1=="tick"{n=$2} END{print n+0}' "$1"; }
first_tick() { awk '$1=="tick"{print $2; exit}' "$1"; }
wait_tick() {  # wait_tick FILE N
    for _ in $(seq 1 500); do [ "$(last_tick "$1")" -ge "$2" ] && return 0; sleep 0.02; done
    echo "demo: the program did not reach tick $2" >&2; exit 1
}

cc -std=c11 -O1 -o "$work/pipe_counter" examples/pipe_counter.c
mkdir -m 0700 "$work/ckpt"

step "1. start a coordinator (port $port)"
show "$BIN/dmtcp-coordinator" --daemon -p "$port" --ckptdir "$work/ckpt"

step "2. launch pipe_counter: a parent that counts and a child that doubles, over pipes"
"$BIN/dmtcp-launch" --join -p "$port" --ckptdir "$work/ckpt" "$work/pipe_counter" 200 30 \
    >"$work/run1.out" 2>&1 </dev/null &
pids+=($!)
wait_tick "$work/run1.out" 20
show "$BIN/dmtcp-command" -p "$port" -s

step "3. checkpoint it while it runs"
before=$(last_tick "$work/run1.out")
show "$BIN/dmtcp-command" -p "$port" -bc
sleep 0.5
echo "   it counted up to $before before the checkpoint and keeps going: now at $(last_tick "$work/run1.out")"

step "4. kill it"
show "$BIN/dmtcp-command" -p "$port" -k
wait "${pids[0]}" || true
killed=$(last_tick "$work/run1.out")
echo "   last tick before the kill: $killed"
show ls "$work/ckpt"

step "5. restart it from the script"
"$work/ckpt/dmtcp_restart_script.sh" -p "$port" >"$work/run2.out" 2>&1 </dev/null &
pids+=($!)
wait_tick "$work/run2.out" $((killed + 3))
show "$BIN/dmtcp-command" -p "$port" -s
first=$(first_tick "$work/run2.out")
echo "   first lines after the restart:"
head -n 3 "$work/run2.out" | sed 's/^/     /'

step "6. let it finish"
if wait "${pids[1]}"; then rc=0; else rc=$?; fi
tail -n 2 "$work/run2.out" | sed 's/^/     /'

if [ "$rc" -eq 0 ] && [ "$first" -gt "$before" ] && [ "$first" -le $((killed + 1)) ] \
        && grep -q '^done 200$' "$work/run2.out"; then
    printf '\nOK: the restarted program went on from tick %s (checkpointed between %s and %s), not from 1, and finished.\n' \
        "$first" "$before" "$killed"
else
    printf '\nFAILED: restart exit %s, first tick %s (checkpoint after %s, kill at %s)\n' "$rc" "$first" "$before" "$killed" >&2
    cat "$work/run2.out" >&2
    exit 1
fi
