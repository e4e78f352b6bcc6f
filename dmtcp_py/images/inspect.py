"""What one checkpoint image holds, read from its manifest and CRIU's own
image files (pycriu), for dmtcp-inspect.  Reads only; runs nothing."""
from __future__ import annotations

import socket
import stat
import time
from pathlib import Path

import pycriu.images

from dmtcp_py.errors import ImageError
from dmtcp_py.images import manifest as manifest_mod
from dmtcp_py.images import socket_table
from dmtcp_py.listing import address_text


def _load(directory: Path, name: str) -> list:
    try:
        with open(directory / name, "rb") as f:
            return pycriu.images.load(f)["entries"]
    except FileNotFoundError:
        return []
    except Exception as exc:  # pycriu raises its own and protobuf's errors
        raise ImageError(f"{directory / name} is corrupt: {exc}") from None


def _processes(directory: Path, m: manifest_mod.Manifest) -> list[dict]:
    # CRIU's images name the processes by their ids in the tree's own PID
    # namespace, when it had one
    shims = {m.ns_pids.get(str(pid), pid) for pid in m.shim_pids} if m.pid_namespace \
        else set(m.shim_pids)
    out = []
    for entry in _load(directory, "pstree.img"):
        pid = entry["pid"]
        core = _load(directory, f"core-{pid}.img")
        comm = core[0]["tc"]["comm"] if core else "?"
        # a process under control has one thread more: the shim's
        threads = len(entry.get("threads", [])) - (pid in shims)
        out.append({"pid": pid, "ppid": entry["ppid"], "program": comm,
                    "threads": threads, "under_control": pid in shims})
    return out


def _files(directory: Path) -> list[dict]:
    """Regular files the processes hold open or map (the program, its
    libraries, its data); external ones are the stdio the restarting
    command hands over and are not listed."""
    out: dict[str, dict] = {}
    for entry in _load(directory, "files.img"):
        reg = entry.get("reg")
        if entry.get("type") != "REG" or not reg or reg.get("ext") \
                or not stat.S_ISREG(reg.get("mode", 0)):
            continue
        out.setdefault(reg["name"], {"path": reg["name"], "size": reg.get("size")})
    return sorted(out.values(), key=lambda f: f["path"])


def _sockets(directory: Path, m: manifest_mod.Manifest) -> list[dict]:
    out = []
    for row in socket_table.decode(m.sockets, str(directory / manifest_mod.MANIFEST)):
        info = row.info
        kind = "unix" if isinstance(info.local, str) or info.family == socket.AF_UNIX else (
            "tcp" if info.type == socket.SOCK_STREAM else "udp")
        out.append({"kind": kind, "local": socket_table.address_json(info.local),
                    "peer": socket_table.address_json(info.peer),
                    "listening": info.listening,
                    "connection": row.connection.conn if row.connection else None,
                    "outside": row.external, "drained_bytes": row.drained_bytes,
                    "queued_datagrams": row.datagram_count,
                    "holders": [list(c) for c in row.copies]})
    return out


def describe(directory: Path) -> dict:
    """Everything dmtcp-inspect shows about one image; ImageError if it is
    missing, incomplete or corrupt."""
    directory = Path(directory)
    m = manifest_mod.load(directory)
    if m.pages:  # incremental (images.chunks): the chunks that make the page files
        pages = sum(int(m.data[name][int(i)][0]) for order in m.pages.values()
                    for name, i in order)
    else:
        pages = sum(size for name, size in m.files.items() if name.startswith("pages-"))
    # bytes of files another generation holds too (hard links)
    shared = sum(size for name, size in m.files.items()
                 if name in m.data and (directory / name).stat().st_nlink > 1)
    return {
        "image": str(directory), "program": m.program, "argv": m.argv, "host": m.host,
        "computation": m.comp_id, "tree": m.tree_id, "generation": m.generation,
        "time": m.time, "time_text": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(m.time)),
        "trees_in_generation": m.num_trees, "criu_version": m.criu_version,
        "bytes": m.total_bytes, "memory_bytes": pages, "compression": m.compression or None,
        "chunks": sum(len(order) for order in m.pages.values()), "shared_bytes": shared,
        "processes": _processes(directory, m),
        "sockets": _sockets(directory, m),
        "files": _files(directory),
        # kept: their bytes are in the image; checked: only read, so only
        # their size, mtime (and digest) are, for the check at restart
        "saved_files": [s["path"] for s in m.shared_files if "data" in s]
        + [f["path"] for f in m.temp_files.get("files", [])],
        "checked_files": [s["path"] for s in m.shared_files if "data" not in s],
        "stdio": {fd: d.get("kind") for fd, d in sorted(m.stdio.items())},
    }


def text(info: dict) -> list[str]:
    """The human-readable form of describe()'s answer."""
    procs = info["processes"]
    lines = [
        f"{info['image']}",
        f"  program      {info['program']} ({' '.join(info['argv'])})",
        f"  host         {info['host']}",
        f"  computation  {info['computation']}, tree {info['tree']}, generation "
        f"{info['generation']} of {info['trees_in_generation']} trees",
        f"  taken        {info['time_text']}",
        *([f"  copies       {', '.join(info['copies'])}"] if info.get("copies") else []),
        f"  size         {info['bytes']} bytes ({info['memory_bytes']} of memory pages"
        + (f", {info['compression']}" if info["compression"] else "") + f"), "
        f"CRIU {info['criu_version']}",
        *([f"  chunks       {info['chunks']} of memory; {info['shared_bytes']} bytes in "
           "files other generations hold too (hard links)"] if info.get("chunks") else []),
        f"  processes    {len(procs)}, threads {sum(p['threads'] for p in procs)} "
        "(not counting the checkpoint threads)",
    ]
    for p in procs:
        lines.append(f"    pid {p['pid']:<7} ppid {p['ppid']:<7} {p['program']:<16} "
                     f"{p['threads']} thread{'s' if p['threads'] != 1 else ''}"
                     + ("" if p["under_control"] else "  (tree init)"))
    lines.append(f"  sockets      {len(info['sockets'])}")
    for s in info["sockets"]:
        what = "listening" if s["listening"] else (
            "outside the computation" if s["outside"] else
            f"connection {s['connection']}" if s["connection"] else "unconnected")
        extra = []
        if s["drained_bytes"]:
            extra.append(f"{s['drained_bytes']} bytes in flight")
        if s["queued_datagrams"]:
            extra.append(f"{s['queued_datagrams']} datagrams queued")
        lines.append(f"    {s['kind']:<4} {address_text(s['local'])} -> "
                     f"{address_text(s['peer'])}  {what}"
                     + (f"  ({', '.join(extra)})" if extra else ""))
    lines.append(f"  files        {len(info['files'])} open or mapped")
    lines += [f"    {f['path']}" for f in info["files"]]
    if info["saved_files"]:
        lines.append(f"  kept in the image: {len(info['saved_files'])} files")
        lines += [f"    {p}" for p in info["saved_files"]]
    if info["checked_files"]:
        lines.append(f"  only read, checked at restart: {len(info['checked_files'])} files")
        lines += [f"    {p}" for p in info["checked_files"]]
    return lines
