"""manifest.json: what one tree's image holds, and the checks before restart.

CRIU's image files record the processes; the manifest records what the
restart needs beyond them (the agent socket name, stdio handed in from
outside, how many shims to expect) and the size of every file, so that a
truncated image is refused before CRIU touches it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from dmtcp_py.errors import ImageError
from dmtcp_py.frozen import field, mutable_record

MANIFEST = "manifest.json"
FORMAT = 1


@mutable_record
class Manifest:
    comp_id: str
    tree_id: str
    program: str
    argv: list[str]
    host: str
    generation: int
    time: float
    root_pid: int
    pids: list[int]
    peers: int                  # shims connected at checkpoint time
    agent_socket: str           # abstract name the shims reconnect to
    num_trees: int              # trees in this generation of the computation
    stdio: dict[str, dict]      # fd -> {"key": CRIU id, "kind": pipe|socket|tty|other}
    external: list[str]         # CRIU --external ids given at dump
    criu_version: str
    files: dict[str, int] = field(default_factory=dict)  # name -> size
    shim_pids: list[int] = field(default_factory=list)  # processes that reconnect
    shared_files: list[dict] = field(default_factory=list)  # see images.shared_files
    written_files: list[dict] = field(default_factory=list)  # see images.written_files
    sockets: list[dict] = field(default_factory=list)  # see images.socket_table
    link_remaps: list[dict] = field(default_factory=list)  # see shared_files.relink
    temp_files: dict = field(default_factory=dict)  # see images.temp_files
    compression: str = ""       # "zstd": pages-*.img.zst (see images.compress)
    xxh3: dict[str, str] = field(default_factory=dict)  # name -> digest (images.integrity)
    blake3: dict[str, str] = field(default_factory=dict)  # the same, incremental or older images
    sha256: dict[str, str] = field(default_factory=dict)  # the same, in images of 0.1.x
    # incremental generations (images.chunks): data file -> its chunks
    # [[length, blake3], ...]; pages-N.img -> [[data file, chunk index], ...]
    data: dict[str, list] = field(default_factory=dict)
    # data file -> the XXH3-128 of its chunks' XXH3-128s: what a restart
    # checks it with (images.chunks.QUICK); a data file without one (an
    # older dmtcp_py made it) is checked with its blake3 list digest
    data_xxh3: dict[str, str] = field(default_factory=dict)
    pages: dict[str, list] = field(default_factory=dict)
    # the tree ran in a PID namespace of its own (restored into a new one:
    # its pids need not be free); ns_pids: each pid -> its id in there
    pid_namespace: bool = False
    ns_pids: dict[str, int] = field(default_factory=dict)
    init_dir: str = ""  # the working directory of its init (agent.init_dir), made at restore
    # its shims add the PID namespace to agent_socket (agent_addr.h); an
    # image of an older dmtcp_py has shims that do not
    agent_socket_ns: bool = False
    # how the tree's checkpoints were written ("compress", "incremental",
    # "precopy": --gzip, --incremental, --precopy), which a restart keeps
    # unless told otherwise; an older image says nothing (option(): None)
    options: dict[str, bool] = field(default_factory=dict)
    format: int = FORMAT

    def option(self, name: str) -> bool | None:
        """One of options, if the manifest says it (a bool); else None."""
        value = self.options.get(name) if isinstance(self.options, dict) else None
        return value if isinstance(value, bool) else None

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def write(self, directory: Path) -> None:
        # every field holds plain JSON values: no dataclasses.asdict, whose
        # deep copy of the chunk lists of an incremental 1 GiB image took
        # 16-29 ms here, while the checkpoint waited for it
        from dataclasses import fields  # (a checkpoint's: a restart reads manifests only)
        _write(directory, {f.name: getattr(self, f.name) for f in fields(self)})


def _write(directory: Path, raw: dict) -> None:
    """The manifest, 0600 and fsynced, in place at once (never half written)."""
    tmp = directory / f".{MANIFEST}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # whatever the umask
    with os.fdopen(fd, "w") as f:
        # one line when it lists chunks (images.chunks), encoded at once:
        # only then does json use its C encoder (json.dump's piecewise one
        # and indent took 19 ms for the ~1000 chunks of 1 GiB, dumps 2-3);
        # dmtcp-inspect is the readable view
        if raw.get("data"):
            f.write(json.dumps(raw, sort_keys=True))
        else:
            json.dump(raw, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)


def load(directory: Path) -> Manifest:
    """Read and check one image directory; ImageError says what is wrong."""
    directory = Path(directory)
    if not directory.exists():
        raise ImageError(f"no checkpoint image at {directory}")
    if not directory.is_dir():
        raise ImageError(f"{directory} is not a checkpoint image (not a directory)")
    path = directory / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ImageError(f"{directory} is not a complete checkpoint image (no {MANIFEST})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImageError(f"{path} is corrupt: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ImageError(f"{path}: unknown manifest format")
    try:
        manifest = Manifest(**raw)
    except TypeError as exc:
        raise ImageError(f"{path} is corrupt: {exc}") from None
    for name, size in manifest.files.items():
        try:
            actual = (directory / name).stat().st_size
        except OSError:
            raise ImageError(f"image {directory} is incomplete: {name} is missing") from None
        if actual != size:
            raise ImageError(f"image {directory} is truncated or damaged: {name} has "
                             f"{actual} bytes, expected {size}")
    return manifest
