"""Network connections between trees survive checkpoint and restart: the
bytes in flight are drained, kept in the images and put back, none lost,
doubled or reordered (net_stream checks every counter it receives)."""
from __future__ import annotations

from tests.e2e.harness import TIMEOUT, ticks, wait_for
from tests.e2e.test_bad_input import free_port

TICKS, INTERVAL_MS = 300, 10


def side_ticks(out, side: str) -> list[int]:
    return [int(r[1]) for r in ticks(out) if r[0] == "tick" and r[2] == side]


def last(out, side: str) -> int:
    numbers = side_ticks(out, side)
    return numbers[-1] if numbers else 0


def assert_no_failure(*procs) -> None:
    for proc in procs:
        err = proc.err_path.read_text()
        assert "FAIL" not in err, err


def test_tcp_stream_between_two_trees(comp, programs):
    port = str(free_port())
    server, sout = comp.launch(*programs["net_stream"], "server", "127.0.0.1", port,
                               str(TICKS), str(INTERVAL_MS))
    wait_for(lambda: sout.exists() and "listening" in sout.read_text(), what="the server")
    client, cout = comp.launch(*programs["net_stream"], "client", "127.0.0.1", port,
                               str(TICKS), str(INTERVAL_MS))
    comp.wait_peers(2)
    wait_for(lambda: last(sout, "server") >= 10 and last(cout, "client") >= 10, what="traffic")

    # checkpoint and go on: the original sockets come back, refilled
    comp.checkpoint()
    mark = (last(sout, "server"), last(cout, "client"))
    wait_for(lambda: last(sout, "server") >= mark[0] + 10 and last(cout, "client") >= mark[1] + 10,
             what="traffic after the checkpoint")
    assert_no_failure(server, client)

    # checkpoint, kill, restart both trees from the script: new connections
    before = {"server": last(sout, "server"), "client": last(cout, "client")}
    comp.checkpoint()
    comp.command("-k")
    assert server.wait(timeout=TIMEOUT) != 0 and client.wait(timeout=TIMEOUT) != 0
    killed = {"server": last(sout, "server"), "client": last(cout, "client")}
    assert_no_failure(server, client)
    restarted, rout = comp.restart()
    comp.wait_peers(2)
    assert restarted.wait(timeout=TIMEOUT) == 0, restarted.err_path.read_text()
    assert_no_failure(restarted)
    for side in ("server", "client"):
        numbers = side_ticks(rout, side)
        assert numbers and before[side] < numbers[0] <= killed[side] + 1, (side, numbers[:3])
        assert numbers == list(range(numbers[0], TICKS + 1)), f"{side}: ticks lost or repeated"
    done = [r for r in ticks(rout) if r[0] == "done"]
    assert sorted(r[2] for r in done) == ["client", "server"]
