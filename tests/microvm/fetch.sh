# Fetches what the L1 guest of scripts/test-microvm.sh boots with, without installing
# anything: Debian's QEMU from the release's backports and Debian's stock kernel, both by
# `apt-get download` through a private apt configuration under the cache, unpacked with
# `dpkg-deb -x`. The mirror is read from the machine's own apt sources, so no host name lives
# in the repository. Sourced by scripts/test-microvm.sh; every function caches by version.

# The machine's Debian mirror: the first URI whose suites include the release's codename.
apt_mirror() {
  local codename=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v c="$codename" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uri = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uri = u[1] }
          if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == c) ok = 1 }
        }
        if (ok && uri != "") { print uri; exit }
      }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -E 's/\[[^]]*\]//' "$f" | awk -v c="$codename" '$1 == "deb" && $3 == c { print $2; exit }'
  done
}

# Runs apt-get/apt-cache with the private configuration under $apt_dir.
papt() {
  local tool=$1
  shift
  "$tool" -o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=- \
    -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" \
    -o Dir::State::status=/var/lib/dpkg/status -o APT::Sandbox::User="$(id -un)" \
    -o Debug::NoLocking=1 "$@"
}

# Writes the private sources list and downloads its package lists.
apt_setup() {
  local codename mirror keyring=""
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || { echo "cannot tell the Debian release from /etc/os-release" >&2; return 1; }
  mirror=$(apt_mirror "$codename" | head -1)
  [ -n "$mirror" ] || { echo "no apt source for $codename in /etc/apt" >&2; return 1; }
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] &&
    keyring="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  printf 'deb %s%s %s main\ndeb %s%s %s-backports main\n' \
    "$keyring" "$mirror" "$codename" "$keyring" "$mirror" "$codename" > "$apt_dir/sources.list"
  echo "$codename" > "$apt_dir/codename"
  papt apt-get -qq update >&2
}

# Downloads PACKAGE (optionally PACKAGE/SUITE) into $2 and unpacks it into $3.
fetch_unpack() {
  local pkg=$1 dl=$2 root=$3
  mkdir -p "$dl" "$root"
  (cd "$dl" && papt apt-get -qq download "$pkg" >&2) || return 1
  local deb
  deb=$(ls -t "$dl"/"${pkg%%/*}"_*.deb | head -1)
  dpkg-deb -x "$deb" "$root"
}

# Sets qemu_bin and qemu_data to QEMU from backports, unpacked under $mv_cache/qemu-<version>;
# returns 1 when it cannot be had.
fetch_qemu() {
  local codename version dir
  codename=$(cat "$apt_dir/codename")
  version=$(papt apt-cache show "qemu-system-x86/$codename-backports" 2> /dev/null |
    awk '/^Version:/ { print $2; exit }')
  [ -n "$version" ] || return 1
  dir="$mv_cache/qemu-${version//[:~+]/_}"
  if [ ! -x "$dir/root/usr/bin/qemu-system-x86_64" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    for p in qemu-system-x86 qemu-system-common qemu-system-data seabios; do
      fetch_unpack "$p/$codename-backports" "$dir/debs" "$dir/root" ||
        fetch_unpack "$p" "$dir/debs" "$dir/root" || return 1
    done
    # One data directory for -L: QEMU's own files plus SeaBIOS's.
    local f
    for f in "$dir/root/usr/share/seabios/"*; do
      ln -sf "../seabios/${f##*/}" "$dir/root/usr/share/qemu/${f##*/}"
    done
    rm -rf "$dir/debs"
  fi
  use_qemu "$dir"
  LD_LIBRARY_PATH="$qemu_libs" "$qemu_bin" --version > /dev/null || return 1
  echo "$version ${dir##*/}" > "$mv_cache/qemu.version"
}

# Sets qemu_bin, qemu_data and qemu_libs to the QEMU unpacked in $1.
use_qemu() {
  qemu_bin="$1/root/usr/bin/qemu-system-x86_64"
  qemu_data="$1/root/usr/share/qemu"
  qemu_libs="$1/root/usr/lib/x86_64-linux-gnu"
}

# Sets l1_kernel_version and l1_kernel_root to Debian's stock kernel, unpacked under
# $mv_cache/kernel-<version>.
fetch_kernel() {
  local codename pkg version dir
  codename=$(cat "$apt_dir/codename")
  pkg=$(papt apt-cache depends "linux-image-amd64/$codename" 2> /dev/null |
    awk '/Depends: linux-image-/ { print $2; exit }')
  [ -n "$pkg" ] || return 1
  version=$(papt apt-cache show "$pkg" | awk '/^Version:/ { print $2; exit }')
  dir="$mv_cache/kernel-$pkg-$version"
  if [ ! -d "$dir/root/boot" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    fetch_unpack "$pkg" "$dir/debs" "$dir/root" || return 1
    rm -rf "$dir/debs"
    # The package ships no modules.dep (installing runs depmod); make it for the initramfs.
    local kver
    kver=$(ls "$dir/root/lib/modules")
    PATH="$PATH:/usr/sbin:/sbin" depmod -b "$dir/root" "$kver" || return 1
  fi
  l1_kernel_version="$pkg=$version"
  l1_kernel_root="$dir/root"
  echo "$l1_kernel_version ${dir##*/}" > "$mv_cache/kernel.version"
}
