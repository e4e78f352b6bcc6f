#!/bin/sh
# keep.sh NEW LINK: keep the freshly built file NEW as kept/<LINK's name>-<digest
# of its content> beside LINK, never overwriting a kept file, and make LINK
# a relative symbolic link to it (Makefile says why).
set -eu
new=$1
link=$2
dir=$(dirname "$link")
name=$(basename "$link")
digest=$(sha256sum "$new" | cut -c1-16)
kept="kept/$name-$digest"
mkdir -p "$dir/kept"
if [ -e "$dir/$kept" ]; then
    rm -f "$new"
    touch "$dir/$kept"   # newer than its sources again, for make
else
    chmod a-w "$new"
    mv "$new" "$dir/$kept"
fi
ln -sfn "$kept" "$link.tmp"
mv -T "$link.tmp" "$link"
