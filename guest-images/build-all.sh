#!/usr/bin/env bash
# Builds everything a sandbox boots from: the static guest agent, the guest
# kernel and the guest images. Every part is cached, so a second run takes
# seconds. Used by scripts/setup.sh (and so by CI).
#
# Usage: guest-images/build-all.sh [--node] [--images "NAME ..."]
#   --node           also build the node22 image
#   --images LIST    build exactly these images (default: base python3.13 node24; node24 is
#                    Vercel's default runtime, which the compat examples use as written)
#
# Output: progress on stderr; on stdout one line per artifact:
#   agent PATH
#   kernel PATH
#   image NAME DIGEST_DIR
#
# Environment: BELLJAR_CACHE (see kernel/build.sh and build-image.sh),
# CARGO_TARGET_DIR (where cargo puts the agent; default <repo>/target).
set -euo pipefail
# Errors inside $(...) must stop the build too.
shopt -s inherit_errexit

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"

images=(base python3.13 node24)
while (($#)); do
    case "$1" in
    --node)
        images+=(node22)
        shift
        ;;
    --images)
        [[ $# -ge 2 ]] || { echo "usage: $0 [--node] [--images \"NAME ...\"]" >&2; exit 2; }
        read -r -a images <<<"$2"
        shift 2
        ;;
    *)
        echo "usage: $0 [--node] [--images \"NAME ...\"]" >&2
        exit 2
        ;;
    esac
done

say() { printf '\n==> %s\n' "$*" >&2; }
start=$SECONDS

# The agent is PID 1 of every image, so it links statically (glibc, since the
# musl target is not available everywhere).
say "building belljar-agent (static, release)"
target_triple=x86_64-unknown-linux-gnu
(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build -p belljar-agent --release --target "$target_triple")
agent="${CARGO_TARGET_DIR:-$repo/target}/$target_triple/release/belljar-agent"
[[ -f "$agent" ]] || { echo "error: cargo did not produce $agent" >&2; exit 1; }
printf 'agent %s\n' "$agent"

say "building the guest kernel"
kernel="$("$here/kernel/build.sh" | tail -n 1)"
printf 'kernel %s\n' "$kernel"

# debootstrap, chroot and device nodes need root, so only images that are not current are
# built, through sudo for an ordinary user (scripts/lib/root.sh: one password prompt that
# says what it is for). An ordinary user's PATH on Debian has no sbin directories, where
# debootstrap, chroot and mkfs.ext4 live, so they are added to it.
# shellcheck source=scripts/lib/root.sh
. "$repo/scripts/lib/root.sh"
todo=()
for image in "${images[@]}"; do
    if dir="$("$here/build-image.sh" "$image" --agent "$agent" --current)"; then
        printf 'image %s %s\n' "$image" "$dir"
    else
        todo+=("$image")
    fi
done
if ((${#todo[@]})); then
    # Asked here, in this shell, so that sudo's ticket is kept fresh for all of them.
    as_root "build the guest images ${todo[*]} (debootstrap, chroot)" true
fi
for image in "${todo[@]}"; do
    say "building the $image image"
    dir="$(as_root "build the $image guest image" \
        env "BELLJAR_CACHE=$BELLJAR_CACHE" "PATH=/usr/local/sbin:/usr/sbin:/sbin:$PATH" \
        "$here/build-image.sh" "$image" --agent "$agent" | tail -n 1)"
    printf 'image %s %s\n' "$image" "$dir"
done

say "guest kernel, agent and images ready in $((SECONDS - start))s"
