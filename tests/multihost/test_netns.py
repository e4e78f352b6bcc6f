"""The test hosts themselves (DESIGN.md section 6): names, reachability,
isolation from the machine, and that nothing outlives a network."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.multihost import netns
from tests.multihost.netns import (
    NETNS_DIR,
    RUN_BASE,
    NetworkError,
    TestNetwork,
    sweep_stale,
)

ROOT = Path(__file__).resolve().parents[2]

# Accepts `count` connections, echoes what each sends, prints each peer's
# address so the test can see who connected.
SERVER = r"""
import socket, sys
addr, count = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.bind((addr, 0))
s.listen()
print(s.getsockname()[1], flush=True)
for _ in range(count):
    c, peer = s.accept()
    with c:
        data = b""
        while not data.endswith(b"\n"):
            chunk = c.recv(4096)
            if not chunk:
                break
            data += chunk
        c.sendall(data)
    print(peer[0], flush=True)
"""

CLIENT = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
msg = (socket.gethostname() + " says hello\n").encode()
c.sendall(msg)
c.shutdown(socket.SHUT_WR)
got = b""
while chunk := c.recv(4096):
    got += chunk
sys.stdout.write(got.decode())
"""


@pytest.fixture(autouse=True, scope="module")
def need_root():
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("test hosts need root (network and UTS namespaces)")
        pytest.skip("test hosts need root (network and UTS namespaces)")


def leftovers(prefix: str) -> list[str]:
    """Everything with this network's prefix: pinned namespaces, run
    directory, mounts."""
    found = []
    if NETNS_DIR.is_dir():
        found += [n for n in os.listdir(NETNS_DIR) if n.startswith(prefix)]
    found += [n for n in os.listdir(RUN_BASE) if n.startswith(prefix.rstrip("-"))]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [line for line in mounts.splitlines() if prefix.rstrip("-") in line]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    found += [line for line in listed.splitlines() if line.startswith(prefix)]
    return found


@pytest.fixture(scope="module")
def net3():
    with TestNetwork(3, tag="t3") as net:
        yield net


def test_each_host_has_its_own_hostname(net3):
    names = []
    for host in net3.hosts:
        out = host.run(["python3", "-c", "import socket; print(socket.gethostname())"],
                       capture_output=True, text=True, check=True, timeout=10).stdout
        assert out.strip() == host.name
        names.append(out.strip())
    assert names == ["h1", "h2", "h3"]
    assert socket.gethostname() not in names


def test_tcp_between_hosts_by_address(net3):
    h1, h2, h3 = net3.hosts
    server = h1.popen([sys.executable, "-c", SERVER, h1.addr, "2"],
                      stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        for client in (h2, h3):
            out = client.run([sys.executable, "-c", CLIENT, h1.addr, str(port)],
                             capture_output=True, text=True, timeout=10)
            assert out.returncode == 0, out.stderr
            assert out.stdout == f"{client.name} says hello\n"
        peers, _ = server.communicate(timeout=10)
        assert peers.split() == [h2.addr, h3.addr]
        assert server.returncode == 0
    finally:
        server.kill()
        server.wait()


def test_host_unreachable_from_the_machine(net3):
    h1, h2 = net3.hosts[:2]
    server = h1.popen([sys.executable, "-c", SERVER, h1.addr, "1"],
                      stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        # The attempt leaves by the machine's default route.  Something out
        # there may accept any connection (seen here: ports 1 and 80 to
        # 198.18.0.1 "connect"), so success of connect() alone proves
        # nothing; what counts is that h1 never sees it and never echoes.
        start = time.monotonic()
        try:
            with socket.create_connection((h1.addr, port), timeout=2) as conn:
                conn.settimeout(max(0.1, 2 - (time.monotonic() - start)))
                conn.sendall(b"from the machine\n")
                assert b"from the machine" not in conn.recv(4096)
        except OSError:
            pass
        assert time.monotonic() - start < 2.5
        # The server takes one connection: if the attempt above had reached
        # it, h2 would be refused and the peer would be the machine.
        out = h2.run([sys.executable, "-c", CLIENT, h1.addr, str(port)],
                     capture_output=True, text=True, timeout=10)
        assert out.stdout == "h2 says hello\n", out.stderr
        assert server.communicate(timeout=10)[0].split() == [h2.addr]
    finally:
        server.kill()
        server.wait()


def test_add_host_joins_the_running_network(net3):
    # A separate network: net3's hosts are fixed for the other tests.
    with TestNetwork(1, subnet="198.18.1.0/24") as net:
        h1 = net.hosts[0]
        server = h1.popen([sys.executable, "-c", SERVER, h1.addr, "1"],
                          stdout=subprocess.PIPE, text=True)
        port = int(server.stdout.readline())
        h2 = net.add_host()
        assert (h2.name, h2.addr) == ("h2", "198.18.1.2")
        out = h2.run([sys.executable, "-c", CLIENT, h1.addr, str(port)],
                     capture_output=True, text=True, timeout=10)
        assert out.stdout == "h2 says hello\n", out.stderr


def test_each_host_has_private_storage_gone_when_the_host_is_killed(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    net = TestNetwork(3, tag="store", subnet="198.18.3.0/24", storage=storage)
    try:
        h1, h2, h3 = net.hosts
        for host in net.hosts:
            assert host.storage == storage.resolve()
            host.run(["sh", "-c", 'hostname > "$1/mine" && mkdir "$1/ckpt"', "sh",
                      str(storage)], check=True, timeout=10)

        def listing(host) -> str:
            return host.run(["sh", "-c", 'ls -A "$1"; cat "$1/mine"', "sh", str(storage)],
                            capture_output=True, text=True, timeout=10).stdout.split()

        # each host sees its own files at the same path; the machine sees none
        for host in net.hosts:
            assert listing(host) == ["ckpt", "mine", host.name]
        assert os.listdir(storage) == []
        sleeper = h2.popen(["sleep", "60"])
        orphan = int(h2.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True).stdout)
        h2.kill()
        assert h2.killed and sleeper.returncode == -9
        _, status = os.waitpid(orphan, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
        # the killed host's files are gone (its path shows an empty storage,
        # not the machine's directory); the others keep theirs
        assert listing(h2) == []
        assert listing(h1) == ["ckpt", "mine", "h1"] and listing(h3) == ["ckpt", "mine", "h3"]
        # and it is silent: no answer, not even a refusal
        probe = h1.run([sys.executable, "-c", PROBE, h2.addr], capture_output=True,
                       text=True, timeout=10)
        assert probe.stdout.strip() in ("timeout", "unreachable"), probe.stdout + probe.stderr
        # a tmpfs of the host's own, in its mount namespace only
        inside = h3.run(["cat", "/proc/self/mountinfo"], capture_output=True, text=True,
                        check=True, timeout=10).stdout
        assert f" {storage.resolve()} " in inside and f"{h3.netns}-storage" in inside
        outside = Path("/proc/self/mountinfo").read_text()
        assert "-storage" not in outside and f" {storage.resolve()} " not in outside
        h2.kill()  # again: nothing more happens
    finally:
        net.close()
    assert leftovers(net.prefix) == []
    assert os.listdir(storage) == []


PROBE = r"""
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=1)
    print("connected")
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("unreachable" if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else exc)
"""


def test_storage_must_be_a_directory(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        TestNetwork(1, storage=tmp_path / "missing")


def test_close_removes_everything_and_is_idempotent():
    net = TestNetwork(2, tag="close")
    try:
        assert len(leftovers(net.prefix)) >= 3
        # A process still inside a host would keep its namespace alive:
        # one started by popen(), and an orphan (our child: pytest is a
        # subreaper) started by a process that has ended.
        sleeper = net.hosts[1].popen(["sleep", "60"])
        orphan = int(net.hosts[0].run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
                                      capture_output=True, text=True, check=True).stdout)
    finally:
        net.close()
    assert sleeper.returncode == -9
    _, status = os.waitpid(orphan, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
    assert leftovers(net.prefix) == []
    assert not net.run_dir.exists()
    net.close()
    with pytest.raises(NetworkError):
        net.add_host()


def test_tag_in_use_is_refused():
    with TestNetwork(1, tag="dup") as net:
        with pytest.raises(FileExistsError):
            TestNetwork(1, tag="dup")
        assert len(net.hosts) == 1 and leftovers(net.prefix)


def test_bad_subnet_is_refused():
    for subnet in ("10.0.0.0/24", "198.18.0.0/16", "198.20.0.0/24"):
        with pytest.raises(ValueError):
            TestNetwork(1, subnet=subnet)


def failing_ip(monkeypatch, fail_at: int) -> list[tuple]:
    calls = []
    real = netns._ip

    def ip(*args):
        calls.append(args)
        if len(calls) == fail_at:
            raise NetworkError(f"injected failure at ip call {fail_at}")
        real(*args)
    monkeypatch.setattr(netns, "_ip", ip)
    return calls


# ip calls 1-4 make the switch, then 6 per host: fail at the first and last
# step of the switch and of each host, and in the middle of the first.
@pytest.mark.parametrize("fail_at", [1, 4, 5, 7, 10, 11, 16, 17, 22])
def test_failure_while_creating_leaves_nothing(monkeypatch, fail_at):
    failing_ip(monkeypatch, fail_at)
    tag = f"fail{fail_at}"
    with pytest.raises(NetworkError, match="injected"):
        TestNetwork(3, tag=tag)
    monkeypatch.undo()
    pid = os.getpid()
    assert leftovers(f"dmtcp-th-{pid}-{netns._start_time(pid)}-{tag}-") == []


def test_failure_in_hostname_step_leaves_nothing(monkeypatch):
    real = netns._cmd

    def cmd(*argv):
        if argv[0] == "unshare" and "h2" in argv:
            raise NetworkError("injected failure in unshare")
        real(*argv)
    monkeypatch.setattr(netns, "_cmd", cmd)
    with pytest.raises(NetworkError, match="injected"):
        TestNetwork(3, tag="failuts")
    monkeypatch.undo()
    pid = os.getpid()
    assert leftovers(f"dmtcp-th-{pid}-{netns._start_time(pid)}-failuts-") == []


def test_failed_add_host_leaves_the_network_as_it_was(monkeypatch):
    with TestNetwork(1, tag="addfail") as net:
        failing_ip(monkeypatch, 4)  # after the veth exists
        with pytest.raises(NetworkError, match="injected"):
            net.add_host()
        monkeypatch.undo()
        assert [h.name for h in net.hosts] == ["h1"]
        assert not (NETNS_DIR / (net.prefix + "h2")).exists()
        h2 = net.add_host()  # same name and veth again: nothing left in the way
        assert h2.run(["hostname"], capture_output=True, text=True).stdout.strip() == "h2"
    assert leftovers(net.prefix) == []


def test_sweep_removes_dead_creators_only():
    # A real leftover: the CLI killed with SIGKILL, so it cannot clean up.
    cli = subprocess.Popen([sys.executable, "-m", "tests.multihost.netns", "up", "2",
                            "--tag", "stale"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        lines = [cli.stdout.readline() for _ in range(3)]
        assert lines[2] == "ready\n"
        stale_prefix = lines[0].split()[2][:-len("h1")]
        # Something still running inside must not keep the leftover alive.
        # (an orphan, so it becomes our child: pytest is a subreaper)
        sleeper = int(subprocess.run(
            ["nsenter", f"--net={NETNS_DIR / lines[0].split()[2]}", "--",
             "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
            check=True, capture_output=True, text=True).stdout)
    finally:
        cli.kill()
        cli.wait()
        cli.stdout.close()
    # A fake leftover: only a pinned namespace, named with a dead pid.
    dead = subprocess.Popen(["true"])
    dead.wait()
    fake = f"dmtcp-th-{dead.pid}-1-fake-h1"
    subprocess.run(["ip", "netns", "add", fake], check=True)
    try:
        with TestNetwork(1, tag="live") as live:
            removed = sweep_stale()
            assert fake in removed
            assert any(n.startswith(stale_prefix) for n in removed)
            assert leftovers(stale_prefix) == []
            _, status = os.waitpid(sleeper, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
            assert not (NETNS_DIR / fake).exists()
            assert (NETNS_DIR / live.hosts[0].netns).exists()
            assert live.hosts[0].run(["hostname"], capture_output=True,
                                     text=True).stdout.strip() == "h1"
    finally:
        subprocess.run(["ip", "netns", "del", fake], check=False, capture_output=True)
        sweep_stale()


def test_cli_up_cleans_up_on_sigterm():
    cli = subprocess.Popen([sys.executable, "-m", "tests.multihost.netns", "up", "1",
                            "--tag", "cli", "--subnet", "198.18.2.0/24"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        first = cli.stdout.readline().split()
        assert first[:2] == ["h1", "198.18.2.1"]
        assert cli.stdout.readline() == "ready\n"
        cli.terminate()
        assert cli.wait(timeout=10) == 0
    finally:
        cli.kill()
        cli.wait()
        cli.stdout.close()
    assert leftovers(first[2][:-len("h1")]) == []
