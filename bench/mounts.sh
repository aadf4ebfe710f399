#!/usr/bin/env bash
# Host folders in namespace sandboxes: what the id-mapped bind mount costs against the same
# folder on the host. Prints figures, no pass or fail.
#
#   bench/mounts.sh
#
# Needs root (the daemon mounts) and the `base` image. Runs its own daemon in a temporary
# BELLJAR_HOME from BIN (default target/release: build belljard, belljar-cli and
# belljar-agent first). The tree is the kernel's sources (/usr/src/linux-source-*.tar.*),
# unpacked once into $BELLJAR_CACHE/bench-tree, or a copy of /usr/share when that is absent.
# For each of: a `git status`-like metadata walk (`find -printf` of every entry's size and
# time), a full read of every file (`tar c | wc -c`), and a 1 GiB sequential write then read
# (`dd`, the page cache dropped between), it prints the seconds on the host and in a sandbox
# that mounts the folder.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BIN:-$repo/target/release}"
cache="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
home="$(mktemp -d /tmp/belljar-mounts.XXXXXX)"
scratch="$(mktemp -d /tmp/belljar-mounts-data.XXXXXX)"
export BELLJAR_HOME="$home" BELLJARD="$bin/belljard"
cli="$bin/belljar"
id=""

cleanup() {
    [ -n "$id" ] && "$cli" rm "$id" >/dev/null 2>&1 || true
    umount "$scratch/tree" 2>/dev/null || true
    "$cli" daemon stop >/dev/null 2>&1 || true
    rm -rf "$home" "$scratch"
}
trap cleanup EXIT

tree="$cache/bench-tree"
if [ ! -d "$tree/done" ]; then
    rm -rf "$tree" && mkdir -p "$tree/src"
    if src=$(ls /usr/src/linux-source-*.tar.* 2>/dev/null | head -n 1) && [ -n "$src" ]; then
        echo "unpacking $src into $tree (once)" >&2
        tar -xf "$src" -C "$tree/src"
    else
        echo "copying /usr/share into $tree (once)" >&2
        cp -a /usr/share "$tree/src/"
    fi
    mkdir "$tree/done"
fi
chmod 755 "$scratch"
chown 1000:1000 "$scratch" 2>/dev/null || true
# The cache is the daemon's own (its images), which no sandbox may mount: the tree is shown
# to it at a path of its own.
mkdir "$scratch/tree"
mount --bind -o ro "$tree/src" "$scratch/tree"

echo "machine: $(nproc) vCPUs; kernel $(uname -r); commit $(git -C "$repo" rev-parse --short HEAD)"
echo "tree: $(find "$tree/src" | wc -l) entries, $(du -sh "$tree/src" | cut -f1)"
"$cli" daemon start >/dev/null
id=$("$cli" create --backend namespace --disk 2048 --timeout 30m \
    -v "$scratch/tree:/tree:ro" -v "$scratch:/scratch")

secs() { # seconds a command takes; "failed" when it fails
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || { echo failed; return; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }' 
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
inside() { "$cli" exec "$id" -- sh -c "set -o pipefail 2>/dev/null; $1"; }

walk='find TREE -printf "%s %T@ %p\n" | wc -l'
read_all='tar -C TREE -cf - . | wc -c'
write='dd if=/dev/zero of=SCRATCH/big-WHO bs=1M count=1024 conv=fsync'
readback='dd if=SCRATCH/big-WHO of=/dev/null bs=1M'

cold=1
row() { # name, host command, sandbox command; the page cache dropped first unless warm
    local host sandbox
    [ "$cold" = 1 ] && drop
    host=$(secs bash -o pipefail -c "$2")
    [ "$cold" = 1 ] && drop
    sandbox=$(secs inside "$3")
    printf '%-28s host %8s s   sandbox %8s s\n' "$1" "$host" "$sandbox"
}

for pass in cold warm; do
    echo "-- $pass cache"
    [ "$pass" = warm ] && cold=0
    row "metadata walk" "${walk//TREE/$tree/src}" "${walk//TREE//tree}"
    row "read every file" "${read_all//TREE/$tree/src}" "${read_all//TREE//tree}"
done
cold=1
host_write=${write//SCRATCH/$scratch}
host_read=${readback//SCRATCH/$scratch}
sandbox_write=${write//SCRATCH//scratch}
sandbox_read=${readback//SCRATCH//scratch}
row "1 GiB sequential write" "${host_write//WHO/host}" "${sandbox_write//WHO/sandbox}"
row "1 GiB sequential read" "${host_read//WHO/host}" "${sandbox_read//WHO/sandbox}"
echo "(each sandbox figure includes one \`belljar exec\`, a few ms)"
