#!/usr/bin/env bash
# One-stop, idempotent set-up: apt packages, CRIU 4.2.1, the venv, the shim.
# Quick when everything is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "setup: $*" >&2; }
[ "$(id -u)" = 0 ] || { echo "setup: error: run as root (CRIU needs it)" >&2; exit 1; }

# Runtime and test packages (CRIU's own build deps are in install-criu.sh).
bash scripts/apt-ensure.sh gcc make libc6-dev iproute2 procps bsdutils \
    python3 python3-venv libcap2-bin acl graphviz
# MPI jobs and the hosts of the multi-host tests (sshd per namespace)
bash scripts/apt-ensure.sh openmpi-bin libopenmpi-dev mpich libmpich-dev \
    openssh-server openssh-client
# the Slurm test cluster (scripts/slurm-cluster.sh); Debian's own munge and
# slurm services stay off: the cluster runs daemons of its own
bash scripts/apt-ensure.sh --services-off munge slurm-wlm slurmctld slurmd slurm-client

bash scripts/install-criu.sh

# The venv sits on Debian's own python3 (3.11): users who are not root run
# the same commands, which a build in root's home (0700) would refuse them,
# and it starts in half the time of a self-built one.
PY=${PYTHON:-/usr/bin/python3}
want_home=$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))')
if [ -f .venv/pyvenv.cfg ] && ! grep -qx "home = $want_home" .venv/pyvenv.cfg; then
    log "recreating .venv on $PY"
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.dmtcp-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing dmtcp_py into .venv"
    # pyproject.toml makes it a PEP 660 install: plain console scripts (not
    # easy_install's, which look their entry point up in importlib.metadata,
    # ~25 ms); compat mode: a plain path in a .pth file, where the default
    # editable finder costs every command ~25 ms at start-up
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' \
        --config-settings editable_mode=compat
    touch "$stamp"
fi
if ! .venv/bin/python -c 'import pycriu.rpc_pb2' 2>/dev/null; then
    log "installing pycriu from the CRIU source"
    .venv/bin/pip install -q --disable-pip-version-check /usr/local/src/criu-4.2.1/lib
fi

# The console scripts pip writes import re (~5 ms of every command's
# start-up) only to take a Windows suffix off argv[0]: not here.
for script in .venv/bin/dmtcp[-_]*; do
    if grep -qx 'import re' "$script"; then
        sed -i -e '/^import re$/d' -e '/re\.sub(/d' "$script"
    fi
done

# Byte-code for the package, whatever PYTHONDONTWRITEBYTECODE says: every
# dmtcp-launch would otherwise compile what changed since (~10 ms a module).
.venv/bin/python -m compileall -q dmtcp_py

make -s -C hijack
# DMTCP's C API for programs that talk to the checkpointer
cmp -s hijack/include/dmtcp.h /usr/local/include/dmtcp.h \
    || install -D -m 0644 hijack/include/dmtcp.h /usr/local/include/dmtcp.h
