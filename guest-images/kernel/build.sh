#!/usr/bin/env bash
# Builds the Belljar microVM guest kernel from Debian's linux-source package
# with the config fragment next to this script, and caches it.
#
# Usage: guest-images/kernel/build.sh [--cached]
# Output: the last stdout line is the path of the cached vmlinux; progress goes
# to stderr. Returns at once when the kernel for this fragment, script and
# linux-source version is already cached. With --cached it never builds: it
# prints the path if the kernel is cached and exits with status 3 if not.
#
# Environment:
#   BELLJAR_CACHE          cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/belljar)
#   BELLJAR_LINUX_SOURCE   a linux-source tarball to use instead of the newest
#                          /usr/src/linux-source-*.tar.xz
#   BELLJAR_KERNEL_JOBS    make -j value (default 2)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fragment="$here/microvm.config"
cache="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
jobs="${BELLJAR_KERNEL_JOBS:-2}"
cached_only=0
case "${1:-}" in
"") ;;
--cached) cached_only=1 ;;
*)
    echo "usage: $0 [--cached]" >&2
    exit 2
    ;;
esac

log() { printf '[kernel] %s\n' "$*" >&2; }
die() { printf '[kernel] error: %s\n' "$*" >&2; exit 1; }

tarball="${BELLJAR_LINUX_SOURCE:-}"
if [[ -z "$tarball" ]]; then
    tarball="$(ls -1 /usr/src/linux-source-*.tar.xz 2>/dev/null | sort -V | tail -n 1 || true)"
fi
[[ -n "$tarball" && -f "$tarball" ]] ||
    die "no linux-source tarball in /usr/src; install it with: apt-get install linux-source-6.1"

# The source version is the Debian package version when the tarball comes
# from a package, else the tarball's own hash.
if pkg="$(dpkg-query -S "$tarball" 2>/dev/null | cut -d: -f1)" && [[ -n "$pkg" ]]; then
    source_version="$pkg $(dpkg-query -W -f='${Version}' "$pkg")"
else
    source_version="$(basename "$tarball") $(sha256sum "$tarball" | cut -d' ' -f1)"
fi

key="$({
    sha256sum "$fragment" | cut -d' ' -f1
    sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1
    printf '%s\n' "$source_version"
} | sha256sum | cut -c1-16)"
out="$cache/kernel/$key"

if [[ -f "$out/vmlinux" ]]; then
    log "cached: $out/vmlinux ($source_version)"
    printf '%s\n' "$out/vmlinux"
    exit 0
fi
if ((cached_only)); then
    log "not built yet: $out/vmlinux; run guest-images/kernel/build.sh"
    exit 3
fi

mkdir -p "$cache/kernel"
exec 9>"$cache/kernel/.lock"
log "waiting for the kernel build lock"
flock 9
if [[ -f "$out/vmlinux" ]]; then
    log "cached (built by another process): $out/vmlinux"
    printf '%s\n' "$out/vmlinux"
    exit 0
fi

work="$cache/kernel/.build-$key"
rm -rf "$work"
mkdir -p "$work/src" "$work/obj"
trap 'rm -rf "$work"' EXIT

start=$(date +%s)
log "building $key from $source_version"
log "extracting $tarball"
nice -n 10 tar -xf "$tarball" -C "$work/src" --strip-components=1

kmake() { nice -n 10 make -C "$work/src" O="$work/obj" ARCH=x86_64 "$@"; }

log "configuring: tinyconfig + $(basename "$fragment")"
kmake -s tinyconfig >&2
"$work/src/scripts/kconfig/merge_config.sh" -m -O "$work/obj" \
    "$work/obj/.config" "$fragment" >"$work/merge.log" 2>&1 ||
    { cat "$work/merge.log" >&2; die "merge_config.sh failed"; }
kmake -s olddefconfig >&2

# merge_config.sh only warns when Kconfig drops an option (an unmet
# dependency); a silently missing driver would only show up as a guest that
# cannot find its disk, so fail here instead.
missing=()
while IFS= read -r line; do
    case "$line" in
    CONFIG_*=*)
        grep -qxF "$line" "$work/obj/.config" || missing+=("$line")
        ;;
    "# CONFIG_"*" is not set")
        opt="${line#\# }"
        opt="${opt%% *}"
        if grep -q "^$opt=" "$work/obj/.config"; then missing+=("$line"); fi
        ;;
    esac
done <"$fragment"
if ((${#missing[@]})); then
    printf '[kernel]   not in the final .config: %s\n' "${missing[@]}" >&2
    die "the config fragment does not apply cleanly to $source_version"
fi

log "compiling vmlinux with -j$jobs (this takes minutes)"
kmake -j"$jobs" vmlinux 2>&1 |
    while IFS= read -r line; do
        case "$line" in
        *warning:* | *error:* | *Error*) printf '%s\n' "$line" >&2 ;;
        "  CC "* | "  LD "* | "  AR "*) printf '\r[kernel] %-70.70s' "$line" >&2 ;;
        esac
    done
[[ "${PIPESTATUS[0]}" == 0 ]] || die "make vmlinux failed"
printf '\n' >&2

stage="$cache/kernel/.out-$key"
rm -rf "$stage"
mkdir -p "$stage"
cp "$work/obj/vmlinux" "$stage/vmlinux"
cp "$work/obj/.config" "$stage/config"
printf '%s\n' "$source_version" >"$stage/source-version"
mv -T "$stage" "$out"

log "built in $(($(date +%s) - start)) s: $out/vmlinux ($(du -h "$out/vmlinux" | cut -f1))"
printf '%s\n' "$out/vmlinux"
