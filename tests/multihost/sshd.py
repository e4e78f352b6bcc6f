"""An sshd on every test host, with throwaway keys (DESIGN.md section 6).

Everything lives in one directory of the test's: host key, client key,
authorized_keys, one sshd_config per host, the client's config (host names
to addresses, no known-hosts file) and a `bin/ssh` that uses that config.
Put `bin` first in PATH and `ssh h2 cmd`, `mpirun --host h2,h3` and the
restart script's ssh lines reach the test hosts.  close() stops every sshd
and leaves nothing behind but the directory, which the test owns.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PRIVSEP = Path("/run/sshd")  # sshd refuses to start without it


class SshHosts:
    def __init__(self, hosts, root: Path) -> None:
        self.hosts, self.root = list(hosts), root
        root.mkdir(mode=0o700, exist_ok=True)
        self.bin = root / "bin"
        self.bin.mkdir()
        self._procs: list[subprocess.Popen] = []
        self._made_privsep = False
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _keygen(self, name: str) -> Path:
        path = self.root / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                       check=True, stdout=subprocess.DEVNULL)
        return path

    def _start(self) -> None:
        host_key, client_key = self._keygen("host_key"), self._keygen("client_key")
        authorized = self.root / "authorized_keys"
        shutil.copyfile(client_key.with_suffix(".pub"), authorized)
        if not PRIVSEP.exists():
            PRIVSEP.mkdir(mode=0o755)
            self._made_privsep = True
        client = self.root / "ssh_config"
        lines = []
        for host in self.hosts:
            lines += [f"Host {host.name}", f"  HostName {host.addr}"]
        lines += ["Host *", f"  IdentityFile {client_key}", "  IdentitiesOnly yes",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null",
                  "  BatchMode yes", "  LogLevel ERROR"]
        client.write_text("\n".join(lines) + "\n")
        wrapper = self.bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {client} "$@"\n')
        wrapper.chmod(0o755)
        for host in self.hosts:
            config = self.root / f"sshd_config.{host.name}"
            config.write_text("\n".join([
                f"ListenAddress {host.addr}", "Port 22", f"HostKey {host_key}",
                f"AuthorizedKeysFile {authorized}", f"PidFile {self.root}/sshd.{host.name}.pid",
                "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PrintMotd no", "LogLevel ERROR"]) + "\n")
            log = open(self.root / f"sshd.{host.name}.log", "w")
            self._procs.append(host.popen([SSHD, "-D", "-e", "-f", str(config)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log))
            log.close()
        for host in self.hosts:
            self._wait_listening(host)

    def _wait_listening(self, host, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        probe = ["python3", "-c", f"import socket; socket.create_connection(('{host.addr}', 22), 1)"]
        while host.run(probe, stderr=subprocess.DEVNULL).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {host.name} did not start: "
                                   f"{(self.root / f'sshd.{host.name}.log').read_text()}")
            time.sleep(0.05)

    def env(self, base: dict | None = None) -> dict:
        """An environment whose `ssh` reaches the test hosts."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []
        if self._made_privsep:
            shutil.rmtree(PRIVSEP, ignore_errors=True)
            self._made_privsep = False


@contextlib.contextmanager
def ssh_cluster(n: int, root: Path, make: Callable, **network) -> Iterator[Callable]:
    """n namespace hosts (TestNetwork(n, **network)) with sshd; yields
    new(*args, **kw) -> make(net, ssh, root, *args, **kw).  At the end every
    process the made objects started (their .procs) is killed and reaped,
    then whatever else is left below us, then sshd and the network."""
    from tests.conftest import kill_descendants
    from tests.multihost.netns import TestNetwork
    made: list = []
    with TestNetwork(n, **network) as net:
        ssh = SshHosts(net.hosts, root / "ssh")
        try:
            def new(*args, **kw):
                made.append(make(net, ssh, root, *args, **kw))
                return made[-1]
            yield new
        finally:
            for thing in made:
                for proc in thing.procs:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()
            kill_descendants()
            ssh.close()
