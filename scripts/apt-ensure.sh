#!/usr/bin/env bash
# apt-ensure.sh [--services-off] PKG...: install the Debian packages that are
# missing, quietly.  Does nothing (and touches no package list) when all are
# installed.
#
# --services-off: Debian starts and enables a daemon's service when its
# package is installed (munge's munged at once, with a key of its own;
# slurmctld/slurmd as soon as /etc/slurm/slurm.conf exists).  The test
# cluster (scripts/slurm-cluster.sh) runs its own daemons, so the packages
# named here are installed with invoke-rc.d refusing every start (a
# policy-rc.d that exits 101, only for the install and only if the machine
# has none of its own), and the services they ship are then disabled.
set -euo pipefail
services_off=0
if [ "${1-}" = --services-off ]; then services_off=1; shift; fi
missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
echo "apt-ensure: installing ${missing[*]}" >&2
apt-get update -qq
policy=/usr/sbin/policy-rc.d
if [ "$services_off" = 1 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[ "$services_off" = 1 ] || exit 0
for p in "${missing[@]}"; do
    for f in $(dpkg -L "$p" | grep -E '^(/usr)?/lib/systemd/system/[^/]+\.service$|^/etc/init\.d/[^/]+$'); do
        unit=$(basename "$f" .service)
        if [ -d /run/systemd/system ]; then
            systemctl disable --now --quiet "$unit.service" 2>/dev/null || true
        elif [ "${f#/etc/init.d/}" != "$f" ] && command -v update-rc.d >/dev/null; then
            update-rc.d "$unit" disable >/dev/null 2>&1 || true
        fi
    done
done
