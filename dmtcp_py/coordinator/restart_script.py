"""dmtcp_restart_script.sh: one command that restarts the whole computation.

Written by the coordinator after every complete generation, as
dmtcp_restart_script_<comp_id>.sh plus the link dmtcp_restart_script.sh,
both replaced atomically.  Trees are grouped by the host they ran on; a
--map OLD=NEW option moves a host's trees elsewhere.
"""
from __future__ import annotations

import os
import shlex
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from dmtcp_py.paths import tool
from dmtcp_py.protocol.messages import ImageInfo

LINK = "dmtcp_restart_script.sh"   # the newest computation's script, in each directory

_TEMPLATE = """#!/bin/bash
# Restarts computation {comp_id}, generation {generation}, checkpointed {when}.
#
# usage: {name} [-h|--coord-host HOST] [-p|--coord-port PORT]
#               [--map OLD_HOST=NEW_HOST]... [--lost HOST]...
#               [--lazy] [other dmtcp_restart options]
#
# Trees are restarted on the host they ran on unless --map moves them; a host
# other than this one is reached with ssh, or the command in DMTCP_RSH (same
# arguments; dmtcp-slurm sets it inside a Slurm job), and the computation's
# token goes along: DMTCP_COORD_TOKEN, else this host's token file.  A moved tree's
# image is copied to its new host from its old one, or else from a replica
# (--replicas); --lost HOST: never try to copy from HOST.  Defaults come from
# DMTCP_COORD_HOST and DMTCP_COORD_PORT, then from the checkpointing run.
set -u
coord_host=${{DMTCP_COORD_HOST:-{coord_host}}}
coord_port=${{DMTCP_COORD_PORT:-{coord_port}}}
dmtcp_restart=${{DMTCP_RESTART:-{dmtcp_restart}}}
dmtcp_image=${{DMTCP_IMAGE:-{dmtcp_image}}}
declare -A hostmap=() lost=() copies=()
read -r -a rsh <<<"${{DMTCP_RSH:-ssh}}"
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--coord-host) coord_host=$2; shift 2 ;;
        -p|--coord-port) coord_port=$2; shift 2 ;;
        --map) hostmap[${{2%%=*}}]=${{2#*=}}; shift 2 ;;
        --lost) lost[$2]=1; shift 2 ;;
        --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) extra+=("$1"); shift ;;
    esac
done

token=${{DMTCP_COORD_TOKEN:-}}
token_file=${{DMTCP_TMPDIR:-/tmp}}/dmtcp-$(id -un)@$(hostname)/coordinator-$coord_port.token
if [ -z "$token" ] && [ -r "$token_file" ]; then token=$(cat "$token_file"); fi

on() {{  # on HOST COMMAND...: here, or over ssh
    local host=$1; shift
    if [ "$host" = "$(hostname)" ] || [ "$host" = localhost ]; then
        "$@"
    else
        "${{rsh[@]}}" -o ConnectTimeout=10 "$host" "$(printf '%q ' "$@")"
    fi
}}

locate() {{  # locate NEW OLD IMAGE: the image's path on NEW, copied there if need be
    local new=$1 old=$2 image=$3 src host path
    local -a sources=("$old:$image")
    if [ -n "${{copies[$image]:-}}" ]; then mapfile -t -O 1 sources <<<"${{copies[$image]}}"; fi
    for src in "${{sources[@]}}"; do
        if [ "${{src%%:*}}" = "$new" ]; then echo "${{src#*:}}"; return 0; fi
    done
    # already there: a checkpoint directory on shared storage, or a copy
    if on "$new" "$dmtcp_image" has "$image" --generation {generation} 2>/dev/null; then
        return 0
    fi
    for src in "${{sources[@]}}"; do
        host=${{src%%:*}}; path=${{src#*:}}
        [ -n "${{lost[$host]:-}}" ] && continue
        echo "${{0##*/}}: copying $path from $host to $new" >&2
        if (set -o pipefail; on "$host" "$dmtcp_image" send --generation {generation} "$path" \
                | on "$new" "$dmtcp_image" receive "${{image%/*}}"); then
            return 0
        fi
    done
    echo "${{0##*/}}: error: no copy of $image could be brought to $new" >&2
    return 1
}}

restart_on() {{  # restart_on OLD_HOST IMAGE...
    local old=$1; shift
    local new=${{hostmap[$old]:-$old}} image
    echo "${{0##*/}}: trees of $old restart on $new" >&2
    if [ "$new" != "$old" ]; then
        local -a here=()
        for image in "$@"; do
            here+=("$(locate "$new" "$old" "$image")") || return 1
        done
        set -- "${{here[@]}}"
    fi
    if [ "$new" = "$(hostname)" ] || [ "$new" = localhost ]; then
        "$dmtcp_restart" --coord-host "$coord_host" --coord-port "$coord_port" \\
            --generation {generation} "${{extra[@]}}" "$@"
    else
        # ssh hands the remote shell one line: quote every word for it
        "${{rsh[@]}}" "$new" "$(printf '%q ' env "DMTCP_COORD_TOKEN=$token" \\
            ${{DMTCP_TMPDIR:+"DMTCP_TMPDIR=$DMTCP_TMPDIR"}} "$dmtcp_restart" --join \\
            --coord-host "$coord_host" --coord-port "$coord_port" --generation {generation} \\
            "${{extra[@]}}" "$@")"
    fi
}}

{body}
"""


def render(images: Sequence[ImageInfo], *, comp_id: str, generation: int,
           coord_host: str, coord_port: int, name: str = LINK) -> str:
    by_host: OrderedDict[str, list[str]] = OrderedDict()
    for image in images:
        by_host.setdefault(image.host, []).append(image.path)
    known = "".join(  # replicas: where else each image is
        f"copies[{shlex.quote(i.path)}]=$'{_ansi_c(chr(10).join(f'{c.host}:{c.path}' for c in i.replicas))}'\n"
        for i in images if i.replicas)
    lines = ["restart_on " + " ".join(shlex.quote(x) for x in [host, *paths])
             for host, paths in by_host.items()]
    if len(lines) == 1:
        body = known + lines[0] + "\n"
    else:
        body = known + "pids=()\n" + "".join(f"{line} &\npids+=($!)\n" for line in lines) + \
            'rc=0\nfor p in "${pids[@]}"; do wait "$p" || rc=$?; done\nexit $rc\n'
    return _TEMPLATE.format(
        comp_id=comp_id, generation=generation, name=name,
        when=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        coord_host=shlex.quote(coord_host), coord_port=int(coord_port),
        dmtcp_restart=shlex.quote(tool("dmtcp_restart")),
        dmtcp_image=shlex.quote(tool("dmtcp_image")), body=body)


def copies_in(text: str) -> dict[str, list[tuple[str, str]]]:
    """What render() wrote of the replicas: image path -> [(host, path)]."""
    found: dict[str, list[tuple[str, str]]] = {}
    for line in text.splitlines():
        if not line.startswith("copies[") or "]=$'" not in line:
            continue
        key, _, value = line[len("copies["):].partition("]=$'")
        try:
            path = shlex.split(key)[0]
        except (ValueError, IndexError):
            continue
        where = value.rstrip("'").encode().decode("unicode_escape", errors="replace")
        found[path] = [tuple(w.split(":", 1)) for w in where.split("\n") if ":" in w]
    return found


def _ansi_c(text: str) -> str:
    """text inside bash's $'...' quotes (newlines stay \\n)."""
    return text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")


def write(images: Sequence[ImageInfo], *, comp_id: str, generation: int, coord_host: str, coord_port: int,
          ckptdir: Path | None) -> list[Path]:
    """Write the script into the checkpoint directory (the coordinator's, or
    else every directory that holds images of this generation)."""
    if ckptdir is not None:
        dirs = [Path(ckptdir)]
    else:
        dirs = list(OrderedDict.fromkeys(Path(i.path).parent for i in images))
    written = []
    for directory in dirs:
        if not directory.is_dir():
            continue
        name = f"dmtcp_restart_script_{comp_id}.sh"
        text = render(images, comp_id=comp_id, generation=generation,
                      coord_host=coord_host, coord_port=coord_port)
        target = directory / name
        tmp = directory / f".{name}.tmp"
        tmp.write_text(text)
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
        link_tmp = directory / ".dmtcp_restart_script.sh.tmp"
        link_tmp.unlink(missing_ok=True)
        os.symlink(name, link_tmp)
        os.replace(link_tmp, directory / LINK)
        written.append(target)
    return written
