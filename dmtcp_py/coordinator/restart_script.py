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

_TEMPLATE = """#!/bin/bash
# Restarts computation {comp_id}, generation {generation}, checkpointed {when}.
#
# usage: {name} [-h|--coord-host HOST] [-p|--coord-port PORT]
#               [--map OLD_HOST=NEW_HOST]... [other dmtcp_restart options]
#
# Trees are restarted on the host they ran on unless --map moves them; a host
# other than this one is reached with ssh (the computation's token goes
# along: DMTCP_COORD_TOKEN, else this host's token file).  Defaults come from
# DMTCP_COORD_HOST and DMTCP_COORD_PORT, then from the checkpointing run.
set -u
coord_host=${{DMTCP_COORD_HOST:-{coord_host}}}
coord_port=${{DMTCP_COORD_PORT:-{coord_port}}}
dmtcp_restart=${{DMTCP_RESTART:-{dmtcp_restart}}}
declare -A hostmap=()
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--coord-host) coord_host=$2; shift 2 ;;
        -p|--coord-port) coord_port=$2; shift 2 ;;
        --map) hostmap[${{2%%=*}}]=${{2#*=}}; shift 2 ;;
        --help) sed -n '2,9p' "$0"; exit 0 ;;
        *) extra+=("$1"); shift ;;
    esac
done

token=${{DMTCP_COORD_TOKEN:-}}
token_file=${{DMTCP_TMPDIR:-/tmp}}/dmtcp-$(id -un)@$(hostname)/coordinator-$coord_port.token
if [ -z "$token" ] && [ -r "$token_file" ]; then token=$(cat "$token_file"); fi

restart_on() {{  # restart_on OLD_HOST IMAGE...
    local old=$1; shift
    local new=${{hostmap[$old]:-$old}}
    echo "${{0##*/}}: trees of $old restart on $new" >&2
    if [ "$new" = "$(hostname)" ] || [ "$new" = localhost ]; then
        "$dmtcp_restart" --coord-host "$coord_host" --coord-port "$coord_port" "${{extra[@]}}" "$@"
    else
        # ssh hands the remote shell one line: quote every word for it
        ssh "$new" "$(printf '%q ' env "DMTCP_COORD_TOKEN=$token" \\
            ${{DMTCP_TMPDIR:+"DMTCP_TMPDIR=$DMTCP_TMPDIR"}} "$dmtcp_restart" --join \\
            --coord-host "$coord_host" --coord-port "$coord_port" "${{extra[@]}}" "$@")"
    fi
}}

{body}
"""


def render(images: Sequence[ImageInfo], *, comp_id: str, generation: int,
           coord_host: str, coord_port: int, name: str = "dmtcp_restart_script.sh") -> str:
    by_host: OrderedDict[str, list[str]] = OrderedDict()
    for image in images:
        by_host.setdefault(image.host, []).append(image.path)
    lines = []
    for host, paths in by_host.items():
        lines.append("restart_on " + " ".join(shlex.quote(x) for x in [host, *paths]))
    if len(lines) == 1:
        body = lines[0] + "\n"
    else:
        body = "pids=()\n" + "".join(f"{line} &\npids+=($!)\n" for line in lines) + \
            'rc=0\nfor p in "${pids[@]}"; do wait "$p" || rc=$?; done\nexit $rc\n'
    return _TEMPLATE.format(
        comp_id=comp_id, generation=generation, name=name,
        when=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        coord_host=shlex.quote(coord_host), coord_port=int(coord_port),
        dmtcp_restart=shlex.quote(tool("dmtcp_restart")), body=body)


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
        os.replace(link_tmp, directory / "dmtcp_restart_script.sh")
        written.append(target)
    return written
