#!/usr/bin/env bash
# Installs everything Belljar needs on a Debian 12 machine, run as root or as an ordinary user
# with sudo (used only for missing Debian packages and the image build, which needs root; a
# password is asked for once, saying what for: scripts/lib/root.sh):
# Debian packages, the UI's npm packages, the Rust binaries (the CLI, `belljar`, on PATH), and
# the guest kernel and images.
# Every step is idempotent and cached, so a second run takes seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

# shellcheck source=scripts/env.sh
. "$here/scripts/env.sh"
# shellcheck source=scripts/lib/root.sh
. "$here/scripts/lib/root.sh"

# Rust is checked, not installed: Debian 12's rustc (1.63) predates edition 2024. Node.js 18
# (Debian 12's `nodejs` and `npm`, installed below when there is no npm) or later builds the UI
# and runs its tests.
command -v cargo >/dev/null || {
  echo "error: cargo is not on PATH: install Rust (stable, through rustup) first (README, Set-up and run)" >&2
  exit 1
}
node_packages=()
if command -v npm >/dev/null; then
  node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  [ "$node_major" -ge 18 ] || {
    echo "error: Node.js $(node --version 2>/dev/null || echo '(none)') is too old: the UI needs 18 or later (Debian 12's nodejs)" >&2
    exit 1
  }
else
  node_packages=(nodejs npm)
fi

packages=(
  # guest kernel and images
  linux-source bc flex bison libelf-dev libssl-dev cpio xz-utils e2fsprogs debootstrap
  debian-archive-keyring util-linux
  qemu-system-x86 uidmap busybox-static git curl ca-certificates pkg-config build-essential
  # the namespace backend's seccomp filter (libseccomp compiles it)
  libseccomp-dev
  # desktop app (Tauri 2)
  libwebkit2gtk-4.1-dev libgtk-3-dev libayatana-appindicator3-dev librsvg2-dev libsoup-3.0-dev
  libxdo-dev librsvg2-bin
  # UI tests
  chromium xvfb webkit2gtk-driver
  # API fuzzing (tests/api-fuzz)
  python3-venv
  # OCI images' tests: a real registry on loopback and the tools that make and push images
  docker-registry buildah skopeo
  # the UI's build and tests, when there is no npm yet
  "${node_packages[@]}"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  # `env`: sudo drops the caller's environment, DEBIAN_FRONTEND with it.
  as_root "install Debian packages" apt-get update -q
  as_root "install Debian packages" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

step "installing npm packages"
# `npm ci`: exactly the committed lock files. They list every platform's optional packages
# (regenerate with `rm package-lock.json && npm install --package-lock-only`; each directory's
# .npmrc keeps registry addresses out of them). ui/package.json pins @tauri-apps/cli and rollup
# to releases whose platform packages all exist, so that the lock file stays complete.
for dir in ui tests/ui; do
  [ -f "$dir/package.json" ] || continue
  # A stamp of the lock file it came from lets a second run skip the reinstall.
  stamp="$dir/node_modules/.belljar-lock.sha256"
  if ! sha256sum "$dir/package-lock.json" 2>/dev/null | cmp -s - "$stamp"; then
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    sha256sum "$dir/package-lock.json" >"$stamp"
  fi
done

# Schemathesis for tests/api-fuzz/run.sh, in a virtualenv under the cache; a stamp of the
# requirements file it came from lets a second run skip the install.
venv="${BELLJAR_VENV:-$BELLJAR_CACHE/venv}"
if ! sha256sum tests/api-fuzz/requirements.txt | cmp -s - "$venv/.belljar-requirements.sha256"; then
  step "installing schemathesis into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/api-fuzz/requirements.txt
  sha256sum tests/api-fuzz/requirements.txt >"$venv/.belljar-requirements.sha256"
fi

step "building the web UI"
(cd ui && npm run build --silent)

step "building the Rust binaries"
trim_cargo_target
cargo build --workspace --bins --quiet

# README's commands use `belljar` bare. A link, not a copy: the CLI finds belljard (and belljard
# the agent and the VMM) beside its real path, and a rebuild updates what the link runs.
# root's goes in /usr/local/bin, on every Debian user's PATH; an ordinary user's in
# ~/.local/bin, on that user's PATH (Debian's ~/.profile adds it once it exists), so that it
# needs no sudo and never replaces a link another user's `belljar` runs (a link into someone
# else's home fails with "Permission denied"). BELLJAR_BIN_DIR picks another directory.
if [ "$(id -u)" -eq 0 ]; then
  bin_dir="${BELLJAR_BIN_DIR:-/usr/local/bin}"
else
  bin_dir="${BELLJAR_BIN_DIR:-$HOME/.local/bin}"
  mkdir -p "$bin_dir"
fi
cli="$(cd "$CARGO_TARGET_DIR" && pwd)/debug/belljar"
if [ "$(readlink "$bin_dir/belljar" 2>/dev/null)" != "$cli" ]; then
  step "linking $bin_dir/belljar -> $cli"
  if [ -w "$bin_dir" ]; then
    ln -sfn "$cli" "$bin_dir/belljar"
  else
    as_root "link belljar into $bin_dir" ln -sfn "$cli" "$bin_dir/belljar"
  fi
fi
case ":$PATH:" in
  *":$bin_dir:"*) ;;
  *) step "$bin_dir is not on your PATH yet: log in again, or run: export PATH=\"$bin_dir:\$PATH\"" ;;
esac

# BELLJAR_IMAGES names the images to build (default: base python3.13 node24); `base` alone
# saves ~2.7 GB and minutes when the other runtimes are not wanted.
step "building the guest kernel, agent and images (cached under $BELLJAR_CACHE)"
if [ -n "${BELLJAR_IMAGES:-}" ]; then
  guest-images/build-all.sh --images "$BELLJAR_IMAGES"
else
  guest-images/build-all.sh
fi
