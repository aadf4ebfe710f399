#!/bin/busybox sh
# PID 1 of the L1 guest of scripts/test-microvm.sh (packed into its initramfs with busybox and
# the kernel modules it needs). It loads KVM with nested SVM and 9p, mounts the host's root
# read-only and the writable results share, chroots into the host's root and runs the job
# that the host described in `job.env` on the results share. The job's status goes to the
# results share and to the console; then the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
say() { echo "belljar-l1: $*" > /dev/console; }
say "up after $(cut -d' ' -f1 /proc/uptime)s"

# The module list is in dependency order (built from modules.dep by the harness).
while read -r m; do
  insmod "/lib/modules/$m" || say "insmod $m failed"
done < /modules.order
[ -c /dev/kvm ] || say "no /dev/kvm after loading kvm-amd"

fail() {
  say "$*"
  echo "BELLJAR-L1-STATUS=99" > /dev/console
  poweroff -f
}

mkdir -p /host /results
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro,cache=loose" hostroot /host || fail "cannot mount the host's root"
mount -t 9p -o "$opts" results /results || fail "cannot mount the results share"
. /results/job.env

# The host's root is read-only: give the chroot its own /dev, /proc, /sys, /tmp and /run.
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /host/dev/pts
mount -t tmpfs shm /host/dev/shm
ln -sf /proc/self/fd /host/dev/fd
ln -sf /proc/self/fd/0 /host/dev/stdin
ln -sf /proc/self/fd/1 /host/dev/stdout
ln -sf /proc/self/fd/2 /host/dev/stderr
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup 2> /dev/null
# The host's /tmp stays reachable for what the job needs from it (a clone of the repository
# under /tmp, say): its paths are bound back over the chroot's own tmpfs.
mkdir -p /hosttmp
mount --bind /host/tmp /hosttmp
mount -t tmpfs -o mode=1777 tmp /host/tmp
for keep in ${KEEP_PATHS:-}; do
  case "$keep" in
    /tmp/?*)
      mkdir -p "/host$keep"
      mount --bind "/hosttmp${keep#/tmp}" "/host$keep" || say "cannot keep $keep"
      ;;
  esac
done
mount -t tmpfs run /host/run
mkdir -p /host/run/belljar-results
mount --move /results /host/run/belljar-results
say "chroot ready after $(cut -d' ' -f1 /proc/uptime)s; running the job"

# The host's root is moved over the initramfs's root, as switch_root does, rather than only
# chrooted into: the kernel refuses user namespaces to a chrooted process (its root is not its
# mount namespace's), and the rootless job (tests/microvm/rootless.sh) needs them. This shell
# keeps the initramfs as its own root, so busybox's poweroff below is still found.
(cd /host && mount --move . / && exec chroot . /usr/bin/env -i \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 BELLJAR_RESULTS=/run/belljar-results BELLJAR_IN_L1=1 \
  $JOB_ENV /bin/bash "$JOB_SCRIPT") > /dev/console 2>&1
status=$?
sync
echo "BELLJAR-L1-STATUS=$status" > /dev/console
poweroff -f
