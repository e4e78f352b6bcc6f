"""Display text that more than one command shows: the coordinator's status
and a tree's processes (`dmtcp-command -s/-l` and the console), socket
addresses (the agent's warnings and dmtcp-inspect)."""
from __future__ import annotations

# (no module imported here: `dmtcp-command -s` prints with this alone)


def signal_name(number: int) -> str:
    """SIGKILL for 9; "signal 42" for one without a name."""
    import signal
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def address_text(addr) -> str:
    """A socket address as the tables store it: [ip, port] (or a tuple, as
    getsockname() says it) as ip:port; a Unix socket's name as it is; none
    as "-"."""
    if isinstance(addr, (list, tuple)):
        return f"{addr[0]}:{addr[1]}"
    return str(addr) if addr else "-"


def status_lines(status: dict, *, last_checkpoint: bool = True) -> list[str]:
    """The coordinator's status (CoordinatorMachine.status()) as KEY=value
    lines, DMTCP's names; the caller adds its own heading.  The last
    checkpoint's line only when asked for and there is one."""
    lines = [f"NUM_PEERS={status['num_peers']}",
             f"RUNNING={'yes' if status['running'] else 'no'}",
             f"GENERATION={status['generation']}",
             f"CKPT_INTERVAL={_interval_text(status)}"]
    last = status.get("last_checkpoint")
    if last_checkpoint and last:
        lines.append(f"LAST_CKPT=generation {last['generation']} "
                     f"{'ok' if last['ok'] else 'FAILED'} {last['duration']:.3f} s "
                     f"{last['bytes']} bytes")
    moved = status.get("last_migration")
    if moved:
        lines.append(f"LAST_MIGRATION={','.join(moved['moved'])} to {','.join(moved['to'])} "
                     f"{'ok' if moved['ok'] else 'FAILED'} {moved['duration']:.3f} s")
    if status.get("auto_restart"):
        lines.append(f"AUTO_RESTARTS={status['restarts']}")
        lines.append(f"TIME_LOST={status['time_lost']:.3f}")
        if status.get("recovering"):
            lines.append(f"RECOVERING={status['recovering']}")
        if status.get("gave_up"):
            lines.append(f"GAVE_UP={status['gave_up']}")
    if status.get("replicas"):
        lines.append(f"REPLICAS={status['replicas']} "
                     f"({status.get('replicated_trees', 0)} of {status.get('num_trees', 0)} "
                     "trees copied)")
    rebal = status.get("rebalance")
    if rebal:
        over = ", ".join(f"{h} for {s:.0f} s" for h, s in sorted(rebal["overloaded"].items()))
        lines.append(f"REBALANCE=after {rebal['after']:g} s"
                     + (f"; overloaded: {over}" if over else ""))
        last = rebal.get("last")
        if last:
            outcome = {True: "done", False: f"FAILED: {last.get('error')}",
                       None: "under way"}[last.get("ok")]
            lines.append(f"LAST_REBALANCE={last['why']} ({outcome})")
    failure = status.get("last_failure")
    if failure:
        lines.append(f"LAST_FAILURE={failure['program']}@{failure['host']} "
                     f"(tree {failure['tree_id']}): {failure['why']}")
    ended = status.get("last_exit")
    if ended:
        lines.append(f"LAST_EXIT={ended['program']}@{ended['host']} "
                     f"(tree {ended['tree_id']}) exited with status {ended['exit_code']}")
    return lines


def _interval_text(status: dict) -> str:
    """The interval as given (e.g. 30), or as the coordinator chose it
    (e.g. 6.3 (auto): a chosen one is not to the millisecond)."""
    seconds = status['checkpoint_interval']
    return f"{seconds:.1f} (auto)" if status.get("interval_auto") else f"{seconds:g}"


def status_report(reply: dict, host: str, port: int, *, listing: bool) -> list[str]:
    """`dmtcp-command -s` (or -l: listing) as lines; reply: the body of a
    status or list reply (machine.status(), and the trees)."""
    lines = [f"Coordinator: {host}:{port}, computation {reply['comp_id']}",
             *status_lines(reply)]
    if listing:
        for t in reply.get("trees", []):
            lines.append(f"{t['host']}  agent {t['agent_pid']}  {t['program']}  {t['state']}")
            lines += proc_lines(t["procs"])
            lines += [f"    outside: {c} (not under control: comes back closed at restart)"
                      for c in t.get("external", [])]
    return lines


def proc_lines(procs: list) -> list[str]:
    """One line per process: [pid, program] or [pid, program, MPI rank]."""
    lines = []
    for entry in procs:
        pid, name = entry[0], entry[1]
        rank = entry[2] if len(entry) > 2 else None
        lines.append(f"    pid {pid}  {name}" + (f"  rank {rank}" if rank is not None else ""))
    return lines
