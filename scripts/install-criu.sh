#!/usr/bin/env bash
# Build and install CRIU 4.2.1 from Debian's own source package (DESIGN.md s.1).
#
# Debian 12's criu 3.17 fails on this kernel and 4.1.1 cannot dump AF_INET
# sockets on kernels >= 6.16, so we build 4.2.1 from the unstable suite's
# orig tarball.  The machine's apt configuration is never touched: a private
# sources list, lists and cache directory live in a temporary directory.
#
# Our fixes of CRIU bugs met here are applied from scripts/criu-patches/
# (each says what it fixes); the installed build records which set it has.
#
# Result: /usr/local/sbin/criu; its copy for users who are not root,
# $USER_CRIU, with CAP_CHECKPOINT_RESTORE as a file capability (README,
# "Users who are not root"); and the source tree (with pycriu's generated
# protobuf modules) kept in $CRIU_SRC_ROOT for `pip install <src>/lib`.
# Idempotent: does nothing when criu 4.2.x with these patches is installed.
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_SRC_ROOT=${CRIU_SRC_ROOT:-/usr/local/src}
SRC="$CRIU_SRC_ROOT/criu-$CRIU_VERSION"
PATCH_DIR="$(cd "$(dirname "$0")" && pwd)/criu-patches"
PATCH_SUM=$(cat "$PATCH_DIR"/*.patch 2>/dev/null | sha256sum | cut -d' ' -f1)
BUILD_DEPS="libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
  libnl-3-dev libprotobuf-c-dev libprotobuf-dev pkgconf protobuf-c-compiler
  protobuf-compiler uuid-dev libaio-dev python3-protobuf gcc make patch"

USER_CRIU=/usr/local/libexec/dmtcp_py/criu

log() { echo "install-criu: $*" >&2; }
die() { echo "install-criu: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (CRIU needs CAP_SYS_ADMIN and installs to /usr/local/sbin)"

installed_ok() {
    [ -x /usr/local/sbin/criu ] &&
        /usr/local/sbin/criu --version 2>/dev/null | grep -q "Version: 4\.2" &&
        [ -f "$SRC/lib/pycriu/rpc_pb2.py" ] &&
        [ "$(cat "$SRC/.dmtcp-patches" 2>/dev/null)" = "$PATCH_SUM" ]
}

apply_patches() {
    for p in "$PATCH_DIR"/*.patch; do
        [ -f "$p" ] || continue
        if patch -d "$SRC" -p1 -R -s -f --dry-run < "$p" >/dev/null 2>&1; then
            continue  # already applied
        fi
        log "applying $(basename "$p")"
        patch -d "$SRC" -p1 -N -s < "$p" || die "patch $(basename "$p") does not apply"
    done
}

# The copy users who are not root run (criu --unprivileged).  Only
# CAP_CHECKPOINT_RESTORE: it is all a dump and a restore of one's own
# processes need on this kernel (>= 5.9); CAP_SYS_PTRACE would also let any
# user read any other user's processes through it.  The permission check of
# ptrace still applies, so a user dumps only processes they could trace.
# An administrator who wants fewer users to have it restricts the file
# (chgrp GROUP; chmod 0750): set-up keeps owner, group and mode once made.
install_user_copy() {
    if ! cmp -s /usr/local/sbin/criu "$USER_CRIU"; then
        if [ -e "$USER_CRIU" ]; then
            cp /usr/local/sbin/criu "$USER_CRIU.new"   # keeps nothing of the old file
            chown --reference="$USER_CRIU" "$USER_CRIU.new"
            chmod --reference="$USER_CRIU" "$USER_CRIU.new"
        else
            install -D -m 0755 /usr/local/sbin/criu "$USER_CRIU.new"
        fi
        mv -f "$USER_CRIU.new" "$USER_CRIU"
    fi
    if ! getcap "$USER_CRIU" | grep -q 'cap_checkpoint_restore=ep$'; then
        setcap cap_checkpoint_restore+ep "$USER_CRIU" \
            || die "cannot give $USER_CRIU CAP_CHECKPOINT_RESTORE (setcap failed)"
        log "installed $USER_CRIU with CAP_CHECKPOINT_RESTORE for users who are not root"
    fi
}

if installed_ok; then
    log "criu $(/usr/local/sbin/criu --version | sed -n 's/Version: //p') already installed"
    install_user_copy
    exit 0
fi

# shellcheck disable=SC2086
bash "$(dirname "$0")/apt-ensure.sh" $BUILD_DEPS

TMP=$(mktemp -d /tmp/install-criu.XXXXXX)
chmod 0755 "$TMP"  # apt drops to the _apt user for downloads
trap 'rm -rf "$TMP"' EXIT

if [ ! -f "$SRC/Makefile" ]; then
    # The mirror comes from this machine's own apt configuration.
    uri=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -n1 || true)
    if [ -z "$uri" ]; then
        uri=$(awk '$1=="deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    fi
    [ -n "$uri" ] || die "cannot find the Debian mirror in /etc/apt/sources.list.d/debian.sources"
    echo "deb-src $uri sid main" > "$TMP/sources.list"
    mkdir -p "$TMP/lists/partial" "$TMP/cache/archives/partial"
    APTO="-o Dir::Etc::sourcelist=$TMP/sources.list -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$TMP/lists -o Dir::Cache=$TMP/cache"
    log "fetching criu $CRIU_VERSION source"
    # shellcheck disable=SC2086
    apt-get $APTO update -qq >/dev/null
    # This exits non-zero because the .debian.tar.xz is not served; only the
    # orig tarball is needed, so check for that instead.
    # shellcheck disable=SC2086
    (cd "$TMP" && apt-get $APTO source --download-only "criu=$CRIU_VERSION-1" >/dev/null 2>&1) || true
    tarball="$TMP/criu_$CRIU_VERSION.orig.tar.xz"
    [ -f "$tarball" ] || die "could not download criu_$CRIU_VERSION.orig.tar.xz"
    echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - || die "checksum mismatch for $tarball"
    mkdir -p "$CRIU_SRC_ROOT"
    rm -rf "$SRC.partial"
    mkdir -p "$SRC.partial"
    tar -xJf "$tarball" -C "$SRC.partial" --strip-components=1
    rm -rf "$SRC"
    mv "$SRC.partial" "$SRC"
fi

apply_patches
log "building criu (about a minute)"
make -C "$SRC" -j"$(nproc)" criu >"$TMP/build.log" 2>&1 || { tail -n 30 "$TMP/build.log" >&2; die "criu build failed"; }
make -C "$SRC" lib >>"$TMP/build.log" 2>&1 || { tail -n 30 "$TMP/build.log" >&2; die "pycriu build failed"; }
install -D -m 0755 "$SRC/criu/criu" /usr/local/sbin/criu
echo "$PATCH_SUM" > "$SRC/.dmtcp-patches"
installed_ok || die "installed criu does not report version 4.2"
log "installed $(/usr/local/sbin/criu --version | head -n1) as /usr/local/sbin/criu"
install_user_copy
