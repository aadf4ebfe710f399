#!/usr/bin/env bash
# Builds a Belljar guest image from guest-images/recipes/NAME and caches it.
#
# Usage: guest-images/build-image.sh NAME [--agent PATH] [--prune | --current]
#   --prune    afterwards delete NAME's other digest directories (only safe when
#              no sandbox still uses an older image)
#   --current  build nothing: print the digest directory and exit 0 when NAME
#              is built and current for this recipe and agent, else exit 1
#              (needs no root, so a caller asks for root only when it must)
#
# Outputs under $CACHE/images/NAME/DIGEST/:
#   rootfs/        the root directory tree (namespace backend)
#   rootfs.ext4    the same tree as a read-only ext4 disk (microVM backend)
#   manifest.json  {name, digest, created, size_bytes, ext4_bytes, recipe, ...}
# and the symlink $CACHE/images/NAME/current -> DIGEST. The last stdout line is
# the digest directory; progress goes to stderr.
#
# Two cached stages: the tree (debootstrap + packages, keyed by the recipe
# chain and lib/rootfs.sh) and the image (tree + agent + ext4, keyed by the
# tree key, the agent's hash and this script). A new agent only redoes the
# second, cheap stage.
#
# Environment:
#   BELLJAR_CACHE           cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/belljar)
#   BELLJAR_DEBIAN_MIRROR   Debian mirror URL (default: read from the host's apt sources)
#   BELLJAR_AGENT           agent binary when --agent is not given (default: an
#                           installed package's belljar-agent beside this script, the
#                           static build under $CARGO_TARGET_DIR, $CACHE/cargo-target
#                           or <repo>/target, x86_64-unknown-linux-gnu/release/)
set -euo pipefail
# Errors inside $(...) must stop the build too.
shopt -s inherit_errexit

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
images="$cache/images"
stages="$images/.stages"
# shellcheck source=lib/rootfs.sh
source "$here/lib/rootfs.sh"

usage() {
    echo "usage: $0 NAME [--agent PATH] [--prune | --current]" >&2
    echo "images: $(cd "$here/recipes" && ls -1 | tr '\n' ' ')" >&2
    exit 2
}

name=""
agent="${BELLJAR_AGENT:-}"
prune=0
current_only=0
while (($#)); do
    case "$1" in
    --agent)
        [[ $# -ge 2 ]] || usage
        agent=$2
        shift 2
        ;;
    --agent=*)
        agent=${1#--agent=}
        shift
        ;;
    --prune)
        prune=1
        shift
        ;;
    --current)
        current_only=1
        shift
        ;;
    -h | --help) usage ;;
    -*) usage ;;
    *)
        [[ -z "$name" ]] || usage
        name=$1
        shift
        ;;
    esac
done
[[ -n "$name" ]] || usage
[[ -f "$here/recipes/$name/recipe.sh" ]] || { echo "error: no recipe $here/recipes/$name" >&2; usage; }

# Without --agent: the agent an installed package ships beside this script, else the static
# agent that build-all.sh builds under $CARGO_TARGET_DIR, the cache's cargo-target
# (scripts/env.sh) or <repo>/target.
if [[ -z "$agent" && -f "$here/belljar-agent" ]]; then
    agent="$here/belljar-agent"
fi
if [[ -z "$agent" ]]; then
    for target_dir in ${CARGO_TARGET_DIR:+"$CARGO_TARGET_DIR"} "$cache/cargo-target" "$repo/target"; do
        agent="$target_dir/x86_64-unknown-linux-gnu/release/belljar-agent"
        [[ -f "$agent" ]] && break
    done
fi
[[ -f "$agent" ]] || {
    echo "error: agent binary $agent not found; build it with guest-images/build-all.sh or pass --agent PATH" >&2
    exit 1
}

# ---------------------------------------------------------------- progress --

is_tty=0
[[ -t 2 ]] && is_tty=1
build_start=$SECONDS

note() { printf '[%s] %s\n' "$1" "$2" >&2; }

# step IMAGE LOG TITLE COMMAND...: runs COMMAND with its output in LOG and
# shows the step, its elapsed time and the log's last line meanwhile.
step() {
    local image=$1 log=$2 title=$3
    shift 3
    printf '\n==== %s: %s\n' "$image" "$title" >>"$log"
    local start=$SECONDS last_beat=$SECONDS rc=0
    ("$@") >>"$log" 2>&1 </dev/null &
    local pid=$!
    if ((is_tty)); then
        while kill -0 "$pid" 2>/dev/null; do
            local line
            line="$(tail -n 1 "$log" 2>/dev/null | tr -d '\r\t' | cut -c1-50)"
            printf '\r\033[K[%s] %s %3ds  %s' "$image" "$title" $((SECONDS - start)) "$line" >&2
            sleep 0.5
        done
        printf '\r\033[K' >&2
    else
        note "$image" "$title ..."
        while kill -0 "$pid" 2>/dev/null; do
            if ((SECONDS - last_beat >= 30)); then
                last_beat=$SECONDS
                note "$image" "  ... $((SECONDS - start))s: $(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-70)"
            fi
            sleep 1
        done
    fi
    wait "$pid" || rc=$?
    if ((rc != 0)); then
        note "$image" "$title FAILED (exit $rc) after $((SECONDS - start))s; last lines of $log:"
        tail -n 40 "$log" | sed 's/^/    /' >&2
        exit 1
    fi
    note "$image" "$title done in $((SECONDS - start))s"
}

# ------------------------------------------------------------------ mirror --

# The Debian mirrors the host's apt already uses: "deb" entries of the
# one-line sources.list format and of deb822 .sources files whose suites are
# Debian release names. Prints "URI suite" lines.
host_debian_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk '
            /^[ \t]*deb[ \t]/ {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                print $i, $(i + 1)
            }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk '
            function flush(   n, u, s, i, j) {
                if (types ~ /(^| )deb( |$)/ && enabled != "no") {
                    n = split(uris, u, " "); m = split(suites, s, " ")
                    for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) print u[i], s[j]
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            {
                key = tolower($0); sub(/:.*/, "", key)
                val = $0; sub(/^[^:]*:[ \t]*/, "", val)
                if (key == "types") types = val
                else if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "enabled") enabled = tolower(val)
            }
            END { flush() }' "$f"
    done
}

debian_suite_re='^(buster|bullseye|bookworm|trixie|forky|duke|sid|stable|testing|unstable|oldstable)'

find_mirror() {
    if [[ -n "${BELLJAR_DEBIAN_MIRROR:-}" ]]; then
        printf '%s\n' "${BELLJAR_DEBIAN_MIRROR%/}"
        return
    fi
    host_debian_sources | awk -v re="$debian_suite_re" '
        $2 ~ re && $2 !~ /security/ && $1 !~ /security/ { sub(/\/$/, "", $1); print $1; exit }'
}

find_security_mirror() {
    host_debian_sources | awk -v re="$debian_suite_re" '
        $2 ~ re && $2 ~ /-security$/ { sub(/\/$/, "", $1); print $1; exit }'
}

# ------------------------------------------------------------------ stages --

sha() { sha256sum | cut -d' ' -f1; }

# tree_key NAME: hash of the recipe chain (parent first) and lib/rootfs.sh.
tree_key() {
    local name=$1 parent_key=""
    local PARENT=""
    # shellcheck source=/dev/null
    PARENT="$(source "$here/recipes/$name/recipe.sh" && printf '%s' "${PARENT:-}")"
    if [[ -n "$PARENT" ]]; then
        parent_key="$(tree_key "$PARENT")"
    fi
    {
        printf 'parent %s\n' "$parent_key"
        sha256sum "$here/lib/rootfs.sh" | cut -d' ' -f1
        (cd "$here/recipes/$name" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    } | sha
}

# ensure_tree NAME: builds the tree stage of NAME (and of its parents) unless
# cached; prints the tree directory.
ensure_tree() {
    local name=$1 key dir
    key="$(tree_key "$name")"
    dir="$stages/$name/$key"
    if [[ -d "$dir/tree" ]]; then
        note "$name" "tree cached ($key)"
        printf '%s\n' "$dir/tree"
        return
    fi

    local PARENT="" PACKAGES=() NODE_SPEC="" NPM_SPEC="npm" SETUP="" VERIFY=""
    # shellcheck source=/dev/null
    source "$here/recipes/$name/recipe.sh"
    local parent_tree=""
    if [[ -n "$PARENT" ]]; then
        parent_tree="$(ensure_tree "$PARENT")"
    fi

    mkdir -p "$stages/$name"
    exec {lock}>"$stages/$name/.lock"
    flock "$lock"
    if [[ -d "$dir/tree" ]]; then
        exec {lock}>&-
        printf '%s\n' "$dir/tree"
        return
    fi

    local tmp="$stages/$name/.tmp-$key" log="$stages/$name/build-$key.log"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    : >"$log"
    note "$name" "building the tree stage $key (log: $log)"
    local tree="$tmp/tree" start=$SECONDS

    if [[ -z "$parent_tree" ]]; then
        local mirror security
        mirror="$(find_mirror)"
        security="$(find_security_mirror)"
        [[ -n "$mirror" ]] || {
            note "$name" "error: no Debian mirror in /etc/apt/sources.list*; set BELLJAR_DEBIAN_MIRROR"
            exit 1
        }
        note "$name" "Debian mirror from the host's apt sources: $mirror"
        step "$name" "$log" "debootstrap $DEBIAN_SUITE (minbase)" tree_debootstrap "$tree" "$mirror"
        step "$name" "$log" "apt sources" tree_apt_sources "$tree" "$mirror" "$security"
    else
        step "$name" "$log" "copy the $PARENT tree" cp -a "$parent_tree" "$tree"
        step "$name" "$log" "resolver for apt" cp -L /etc/resolv.conf "$tree/etc/resolv.conf"
        printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
        chmod 0755 "$tree/usr/sbin/policy-rc.d"
    fi
    if ((${#PACKAGES[@]})); then
        step "$name" "$log" "apt-get install ${#PACKAGES[@]} packages" tree_apt_install "$tree" "${PACKAGES[@]}"
    fi
    step "$name" "$log" "system and user belljar" tree_configure_system "$tree"
    if [[ -n "$NODE_SPEC" ]]; then
        step "$name" "$log" "install $NODE_SPEC and $NPM_SPEC" tree_install_node "$tree" "$NODE_SPEC" "$NPM_SPEC" "$cache/downloads"
    fi
    if [[ -n "$SETUP" ]]; then
        step "$name" "$log" "setup" in_tree "$tree" /bin/sh -ec "$SETUP"
    fi
    if [[ -n "$VERIFY" ]]; then
        step "$name" "$log" "verify" in_tree "$tree" /bin/sh -ec "$VERIFY"
    fi
    step "$name" "$log" "finalize" tree_finalize "$tree"

    mv -T "$tmp" "$dir"
    # Trees of older recipes are only inputs of images already copied out.
    find "$stages/$name" -mindepth 1 -maxdepth 1 \( -name '.tmp-*' -o -name 'build-*.log' -o -type d \) \
        ! -name "$key" ! -name "build-$key.log" -exec rm -rf {} +
    exec {lock}>&-
    note "$name" "tree stage built in $((SECONDS - start))s"
    printf '%s\n' "$dir/tree"
}

# ------------------------------------------------------------------- image --

# make_ext4 TREE OUT: a read-only root disk holding TREE, sized to its content
# plus a margin (grown and retried if mkfs.ext4 runs out of room).
make_ext4() {
    local tree=$1 out=$2
    local used_kib inodes size_kib
    used_kib="$(du -sk --apparent-size "$tree" | cut -f1)"
    inodes="$(find "$tree" -xdev | wc -l)"
    inodes=$((inodes + inodes / 10 + 1024))
    # 4 KiB blocks waste about half a block per file; ext4 metadata ~ 3%.
    size_kib=$((used_kib + used_kib / 20 + inodes * 2 + inodes / 4 + 32768))
    local attempt
    for attempt in 1 2 3 4; do
        rm -f "$out"
        truncate -s "${size_kib}K" "$out"
        if mkfs.ext4 -q -F -b 4096 -m 0 -N "$inodes" -O ^has_journal \
            -L "belljar-$name" -E root_owner=0:0 -d "$tree" "$out"; then
            e2fsck -fn "$out" >/dev/null
            return 0
        fi
        echo "mkfs.ext4 -d did not fit in ${size_kib} KiB (attempt $attempt), growing"
        size_kib=$((size_kib + size_kib / 4))
    done
    return 1
}

agent_sha="$(sha256sum "$agent" | cut -d' ' -f1)"
# image_digest TREE_KEY: the image stage's key (the tree, the agent and this script).
image_digest() {
    {
        printf 'tree %s\nagent %s\n' "$1" "$agent_sha"
        sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1
    } | sha
}

if ((current_only)); then
    key="$(tree_key "$name")"
    digest="$(image_digest "$key")"
    [[ -d "$stages/$name/$key/tree" && -f "$images/$name/$digest/manifest.json" &&
        "$(readlink "$images/$name/current" 2>/dev/null)" == "$digest" ]] || exit 1
    printf '%s\n' "$images/$name/$digest"
    exit 0
fi

[[ $(id -u) == 0 ]] || { echo "error: building images needs root (debootstrap, chroot, device nodes)" >&2; exit 1; }
# The image stage's tools must be on PATH, or it fails far from the cause (a missing
# mkfs.ext4 read as "did not fit" four times): root's PATH has the sbin directories, an
# ordinary user's, passed through `sudo env`, had none.
for tool in mkfs.ext4 e2fsck; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not on PATH ($PATH)" >&2; exit 1; }
done

start=$SECONDS
tree="$(ensure_tree "$name")"
tree_key_value="$(basename "$(dirname "$tree")")"
if readelf -l "$agent" 2>/dev/null | grep -q 'Requesting program interpreter'; then
    note "$name" "warning: $agent is dynamically linked; the image expects a static agent"
fi
digest="$(image_digest "$tree_key_value")"
out="$images/$name/$digest"

if [[ -f "$out/manifest.json" ]]; then
    note "$name" "image cached: $digest"
else
    mkdir -p "$images/$name"
    exec {image_lock}>"$images/$name/.lock"
    flock "$image_lock"
    if [[ -f "$out/manifest.json" ]]; then
        note "$name" "image cached (built by another process): $digest"
    else
        tmp="$images/$name/.tmp-$digest"
        log="$images/$name/.build-$digest.log"
        # Under the lock no other build of NAME runs, so every .tmp-* is a failed build's
        # leftover (~0.5-1.5 GB each; a later build of another digest never reused them).
        rm -rf "$images/$name"/.tmp-*
        mkdir -p "$tmp"
        : >"$log"
        install_agent() {
            cp -a "$tree" "$tmp/rootfs"
            install -m 0755 "$agent" "$tmp/rootfs/sbin/belljar-agent"
        }
        step "$name" "$log" "copy the tree and install the agent" install_agent
        step "$name" "$log" "mkfs.ext4 rootfs.ext4" make_ext4 "$tmp/rootfs" "$tmp/rootfs.ext4"
        size_bytes="$(du -sb "$tmp/rootfs" | cut -f1)"
        ext4_bytes="$(stat -c %s "$tmp/rootfs.ext4")"
        cat >"$tmp/manifest.json" <<JSON
{
  "name": "$name",
  "digest": "$digest",
  "created": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "size_bytes": $size_bytes,
  "ext4_bytes": $ext4_bytes,
  "recipe": "guest-images/recipes/$name",
  "tree_key": "$tree_key_value",
  "agent_sha256": "$agent_sha",
  "debian_suite": "$DEBIAN_SUITE"
}
JSON
        mv -T "$tmp" "$out"
        rm -f "$log"
    fi
    exec {image_lock}>&-
fi

ln -sfn "$digest" "$images/$name/.current.tmp"
mv -T "$images/$name/.current.tmp" "$images/$name/current"
if ((prune)); then
    find "$images/$name" -mindepth 1 -maxdepth 1 -type d ! -name "$digest" ! -name ".tmp-*" -print \
        -exec rm -rf {} + | sed "s|^|[$name] pruned |" >&2
fi
note "$name" "ready in $((SECONDS - start))s: $out (rootfs $(du -sh "$out/rootfs" | cut -f1), ext4 $(du -h --apparent-size "$out/rootfs.ext4" | cut -f1))"
printf '%s\n' "$out"
