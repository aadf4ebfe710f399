#!/usr/bin/env bash
# Users' images: a pull and first command of a ~100 MB image from a registry on loopback,
# Belljar against podman in the same run, and a create from the cached image against `base`.
# Prints figures, no pass or fail.
#
#   bench/images.sh [ROUNDS]      (default 5; p50 of the rounds)
#
# Needs root, `buildah`, `podman` (with `runc` on cgroup v1 hosts) and Debian's `docker-registry` (scripts/setup.sh installs
# them) and the `base` image. Runs its own daemon in a temporary BELLJAR_HOME from BIN
# (default target/release: build belljard, belljar-cli and belljar-agent first) and podman
# with overlay storage of its own in a temporary directory; the image is made by buildah from files
# the script writes (busybox and 100 MB of random data in two layers, gzip as buildah pushes
# it), so nothing is downloaded. Each round of a pull starts with the image removed from
# both.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BIN:-$repo/target/release}"
rounds="${1:-5}"
work="$(mktemp -d /tmp/belljar-images-bench.XXXXXX)"
export BELLJAR_HOME="$work/home" BELLJARD="$bin/belljard"
cli="$bin/belljar"
registry_pid=""

cleanup() {
    "$cli" daemon stop >/dev/null 2>&1 || true
    [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null || true
    podman "${pod[@]}" system reset -f >/dev/null 2>&1 || true
    buildah --root "$work/buildah" --runroot "$work/buildah-run" rm -a >/dev/null 2>&1 || true
    umount -R "$work"/*/overlay 2>/dev/null || true
    rm -rf "$work"
}
pod=(--root "$work/podman" --runroot "$work/podman-run" --storage-driver overlay)
# crun raises the open-files limit to its default unless told, which a host with a lower hard
# limit refuses (snapshot_bench says the same); crun refuses cgroup v1 hosts with v2 mounted
# too (hybrid), runc does not.
limits=(--ulimit=nofile=1024:1024 --ulimit=nproc=1024:1024 --network=none)
command -v runc >/dev/null && pod+=(--runtime runc)
trap cleanup EXIT

for tool in buildah podman docker-registry; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
done
busybox="$(command -v busybox)"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/registry"
cat > "$work/registry.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$work/registry.yml" >/dev/null 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
ref="127.0.0.1:$port/bench/big:1"

echo "making the image (buildah, vfs storage)" >&2
B=(buildah --root "$work/buildah" --runroot "$work/buildah-run" --storage-driver vfs)
c=$("${B[@]}" from scratch)
m=$("${B[@]}" mount "$c")
mkdir -p "$m/bin"
cp "$busybox" "$m/bin/busybox"
for a in sh true cat; do ln -s busybox "$m/bin/$a"; done
head -c 60M /dev/urandom > "$m/data1"
"${B[@]}" unmount "$c" >/dev/null
"${B[@]}" commit -q "$c" bench-l1 >/dev/null
c=$("${B[@]}" from bench-l1)
m=$("${B[@]}" mount "$c")
head -c 40M /dev/urandom > "$m/data2"
"${B[@]}" unmount "$c" >/dev/null
"${B[@]}" config --cmd '["/bin/true"]' "$c"
"${B[@]}" commit -q "$c" bench-big >/dev/null
"${B[@]}" push -q --tls-verify=false bench-big "docker://$ref"

ms() { # milliseconds a command takes; "failed" when it fails
    local t0 t1
    t0=$(date +%s%N)
    if "$@" >/dev/null 2>"$work/err"; then
        t1=$(date +%s%N)
        echo $(((t1 - t0) / 1000000))
    else
        echo failed
        sed 's/^/    /' "$work/err" >&2
    fi
}
p50() { sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else print a[int((NR + 1) / 2)] }'; }

echo "machine: $(nproc) vCPUs; kernel $(uname -r); commit $(git -C "$repo" rev-parse --short HEAD); $rounds rounds"
"$cli" daemon start >/dev/null
"$cli" run --backend namespace base -- true >/dev/null # the daemon's first sandbox warms its caches

belljar_pull=() podman_pull=() belljar_cached=() podman_cached=() base=()
for _ in $(seq "$rounds"); do
    "$cli" images rm "$ref" >/dev/null 2>&1 || true
    "$cli" images prune >/dev/null 2>&1 || true
    belljar_pull+=("$(ms "$cli" run --backend namespace "$ref" -- /bin/true)")
    podman "${pod[@]}" rmi -f "$ref" >/dev/null 2>&1 || true
    podman_pull+=("$(ms podman "${pod[@]}" run --rm "${limits[@]}" --tls-verify=false "$ref" /bin/true)")
done
for _ in $(seq "$rounds"); do
    belljar_cached+=("$(ms "$cli" run --backend namespace "$ref" -- /bin/true)")
    base+=("$(ms "$cli" run --backend namespace base -- /bin/true)")
    podman_cached+=("$(ms podman "${pod[@]}" run --rm "${limits[@]}" "$ref" /bin/true)")
done
show() { printf '%s\n' "$@" | grep -v failed | p50; }
size=$(du -sm "$work/registry" | cut -f1)
echo "image: 2 layers, ~100 MB of files, $size MiB in the registry"
printf '%-44s %10s %10s\n' "p50, ms" belljar podman
printf '%-44s %10s %10s\n' "pull + first command (run, image not here)" "$(show "${belljar_pull[@]}")" "$(show "${podman_pull[@]}")"
printf '%-44s %10s %10s\n' "run of the cached image" "$(show "${belljar_cached[@]}")" "$(show "${podman_cached[@]}")"
printf '%-44s %10s %10s\n' "run of base (Belljar's own image)" "$(show "${base[@]}")" "-"
echo "rounds: belljar pull ${belljar_pull[*]}; podman pull ${podman_pull[*]}; belljar cached ${belljar_cached[*]}; base ${base[*]}; podman cached ${podman_cached[*]}"
