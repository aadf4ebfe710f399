#!/usr/bin/env bash
# The rootless job of scripts/test-microvm.sh: Belljar as an ordinary user on a cgroup v2 host
# with delegation, inside the L1 guest (whose Debian kernel gives cgroup2 every controller).
# scripts/test.sh runs it in an L1 boot of its own (`BELLJAR_MICROVM_JOB=tests/microvm/rootless.sh
# scripts/test-microvm.sh --nested`), never on a real host: it remounts cgroups and binds files
# over /etc. It runs as root in L1 and makes the host a desktop user would have:
#
# - cgroup2 at /sys/fs/cgroup with every controller enabled down to the user's slice;
# - an ordinary user (uid 4242) with a /etc/subuid + /etc/subgid range: passwd, group, subuid
#   and subgid are bind-mounted over the read-only host files, in L1's mount namespace only;
# - a subtree delegated the way systemd delegates `user@UID.service`: the group, its
#   `cgroup.procs`, `cgroup.subtree_control` and `cgroup.threads` owned by the user, the
#   user's processes in a child `session.scope` (as a login session's are);
# - then, as that user: the namespace escape tests (host files and processes, the host's
#   sockets and loopback, other sandboxes unreachable, a fork bomb stopped at pids.max, a
#   memory hog killed in its own group), the daemon end to end on the `base` image (create,
#   exec, files, the memory, CPU and PID limits reported enforced on cgroup v2 and written in
#   the sandbox's group under the delegated subtree, pause/resume on the v2 freezer), and
#   `belljar doctor` (its findings here differ from the v1 root host's), and the network of a
#   rootless sandbox (its tap opened by belljard's attaching child): a forwarded port reached
#   from the host, DNS answered through the daemon, a denied subnet and deny-all;
# - the user's copy of `base` keeps its hard links (`perl`, `perl5.40.1`);
# - then, once doctor has said to join the `kvm` group and the user has joined it: one
#   microVM created, run and deleted by the daemon as that user, whose only privilege is
#   `/dev/kvm` (root:kvm 0660, as udev makes it).
#
# Input (environment): BELLJAR_JOB_BIN (belljard, belljar, belljar-agent), BELLJAR_ROOTLESS_TESTS
# (colon-separated test executables: escape, e2e_cli, e2e_limits, e2e_pause, doctor, e2e_ports,
# e2e_microvm), BELLJAR_FIXTURES (the namespace crate's test fixtures, built on the host),
# BELLJAR_CACHE, BELLJAR_RESULTS, BELLJAR_MICROVM_FILTER (optional: only the selected tests
# whose names contain it). Output:
# the tests' output; `summary` and `status` in BELLJAR_RESULTS. Exit status 0 only when every
# test passed.
set -uo pipefail
[ "${BELLJAR_IN_L1:-}" = 1 ] || { echo "rootless.sh runs only inside the harness's L1 guest" >&2; exit 2; }
: "${BELLJAR_JOB_BIN:?}" "${BELLJAR_ROOTLESS_TESTS:?}" "${BELLJAR_RESULTS:?}" "${BELLJAR_CACHE:?}"
: "${BELLJAR_FIXTURES:?}"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
start=$(now)
say() { echo "rootless: $*"; }
uid=4242 user=bjuser subid=3000000
cg=/sys/fs/cgroup

setup_failed() {
  say "set-up failed: $*"
  echo "rootless job: set-up failed: $*" > "$BELLJAR_RESULTS/summary"
  echo 1 > "$BELLJAR_RESULTS/status"
  exit 1
}

# --- L1's init brings up no interface, not even loopback: every connection to 127.0.0.1 (a
# forwarded port, the daemon's DNS upstream in e2e_ports) would fail with "network is
# unreachable". A desktop's loopback is up.
ip link set lo up || setup_failed "cannot bring up lo"

# --- cgroup v2 with every controller.
[ "$(stat -fc %T "$cg")" = cgroup2fs ] || mount -t cgroup2 cgroup2 "$cg" ||
  setup_failed "cannot mount cgroup2"
say "cgroup2 controllers: $(cat "$cg/cgroup.controllers")"
slice="$cg/user.slice/user-$uid.slice"
service="$slice/user@$uid.service"
mkdir -p "$service/session.scope" || setup_failed "cannot make $service"
for dir in "$cg" "$cg/user.slice" "$slice"; do
  for c in $(cat "$dir/cgroup.controllers"); do
    echo "+$c" > "$dir/cgroup.subtree_control" 2> /dev/null || say "cannot enable $c in $dir"
  done
done
# Delegation as systemd does it for user@UID.service: the directory and the three files. The
# session's scope is the user manager's own creation, so the user's too.
for dir in "$service" "$service/session.scope"; do
  chown "$uid:$uid" "$dir" "$dir/cgroup.procs" "$dir/cgroup.subtree_control" "$dir/cgroup.threads" ||
    setup_failed "cannot delegate $dir"
done
say "delegated $service ($(cat "$service/cgroup.controllers"))"

# --- The user, with subordinate ids, in this mount namespace only.
work=$(mktemp -d /tmp/belljar-rootless.XXXXXX)
chmod 755 "$work"
etc="$work/etc"
mkdir -p "$etc" "$work/home" "$work/bin/deps" "$work/cache"
cp /etc/passwd /etc/group "$etc/"
echo "$user:x:$uid:$uid:Belljar test user:$work/home:/bin/sh" >> "$etc/passwd"
echo "$user:x:$uid:" >> "$etc/group"
echo "$user:$subid:65536" > "$etc/subuid"
echo "$user:$subid:65536" > "$etc/subgid"
for f in passwd group subuid subgid; do
  mount --bind "$etc/$f" "/etc/$f" || setup_failed "cannot bind $etc/$f over /etc/$f"
done
chown "$uid:$uid" "$work/home"
# The image cache lives under /root (0700): the user reaches it through a read-only bind.
mount --bind -o ro "$BELLJAR_CACHE" "$work/cache" 2> /dev/null ||
  mount --bind "$BELLJAR_CACHE" "$work/cache" || setup_failed "cannot bind the image cache"
for b in belljard belljar belljar-agent belljar-vmm; do
  cp "$BELLJAR_JOB_BIN/$b" "$work/bin/$b"
done
IFS=: read -r -a tests <<< "$BELLJAR_ROOTLESS_TESTS"
for t in "${tests[@]}"; do cp "$t" "$work/bin/deps/"; done
chmod -R a+rX "$work/bin"
# The escape tests' busybox image and stand-in agent, built on the host (no compiler here),
# where the tests look for this uid's fixtures; the image is the user's, as a rootless
# build would make it.
fixtures="/tmp/belljar-ns-fixtures-$uid"
cp -a "$BELLJAR_FIXTURES" "$fixtures" && chown -R "$uid:$uid" "$fixtures" ||
  setup_failed "cannot stage the fixtures"
echo "$$" > "$service/session.scope/cgroup.procs" || setup_failed "cannot enter the session scope"
# /dev/kvm as udev leaves it on a desktop (L1 has no udev): the kvm group's, not everyone's.
grep -q '^kvm:' "$etc/group" || echo "kvm:x:990:" >> "$etc/group"
chgrp "$(sed -n 's/^kvm:x:\([0-9]*\):.*/\1/p' "$etc/group")" /dev/kvm && chmod 0660 /dev/kvm ||
  setup_failed "cannot give /dev/kvm to the kvm group"
say "set up in $(since "$start")s"

as_user() {
  setpriv --reuid="$uid" --regid="$uid" --init-groups \
    env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME="$work/home" USER="$user" \
    LOGNAME="$user" TMPDIR=/tmp LANG=C.UTF-8 BELLJAR_CACHE="$work/cache" RUST_BACKTRACE=1 \
    BELLJAR_AGENT_BIN=standin BELLJAR_DOCTOR_HOST=v2-rootless \
    BELLJAR_VMM="$work/bin/belljar-vmm" BELLJAR_TESTING_FORCE_MICROVM=1 \
    BELLJAR_READY_TIMEOUT=180s BELLJAR_BOOT_TIMEOUT=120 "$@"
}

# Which tests of each executable run here (the rest need root or a microVM).
selection() {
  case "$1" in
    escape) echo "host_files_are_not_reachable host_processes_are_not_visible other_sandboxes_are_not_reachable host_sockets_and_loopback_are_not_reachable fork_bomb_hits_the_pids_limit memory_hog_is_killed_inside_its_cgroup cpu_hog_is_held_to_its_quota" ;;
    e2e_cli) echo "create_ls_info_exec_and_exit_codes" ;;
    e2e_limits) echo "limits_are_enforced_in_the_sandbox_group_and_reported" ;;
    e2e_pause) echo "a_paused_sandbox_keeps_its_processes_and_their_state" ;;
    doctor) echo "doctor_as_an_ordinary_user_on_delegated_v2" ;;
    e2e_ports) echo "a_server_in_the_sandbox_answers_on_its_forwarded_port dns_goes_through_the_daemon_and_a_deny_policy_stops_a_flow" ;;
    e2e_microvm) echo "a_kvm_group_member_creates_execs_and_deletes" ;;
  esac
}

# The user's copy of the root-built `base` image (belljar_namespace::usertree), made here once
# so that its time is measured on its own and the first create does not pay it.
if [ -x "$BELLJAR_JOB_BIN/belljar-ns" ]; then
  cp "$BELLJAR_JOB_BIN/belljar-ns" "$work/bin/"
  t0=$(now)
  if (cd "$work/home" && as_user "$work/bin/belljar-ns" user-tree "$work/cache/images/base/current" \
    "$work/home/.cache/belljar-rootless"); then
    say "base unpacked for $user in $(since "$t0")s ($(du -sm "$work/home/.cache/belljar-rootless" | cut -f1) MiB)"
  else
    say "unpacking base for $user failed"
  fi
fi

. "$(dirname "$0")/progress.sh"
# Hard links survive the user's copy (belljar_namespace::usertree): one inode, two names.
if [ -z "$(progress_outcome rootless::hard_links)" ]; then
  copy=$(find "$work/home/.cache/belljar-rootless" -maxdepth 2 -name rootfs -type d | head -1)
  links=$(stat -c %i "$copy/usr/bin/perl" "$copy/usr/bin/perl5.40.1" 2> /dev/null | sort -u | wc -l)
  if [ -n "$copy" ] && [ "$links" = 1 ]; then
    say "hard links kept in the user's copy: perl and perl5.40.1 are inode $(stat -c %i "$copy/usr/bin/perl")"
    progress_record rootless::hard_links passed
  else
    say "hard links lost in the user's copy ${copy:-(none)}: perl and perl5.40.1 are $links inodes"
    progress_record rootless::hard_links failed
  fi
fi
# Runs one test as the user (progress_run's runner): sets rc, prints the output.
as_user_test() {
  local exe=$1 out=$2
  shift 2
  (cd "$work/home" && as_user "$exe" --include-ignored --test-threads=1 --nocapture "$@") > "$out" 2>&1
  rc=$?
  cat "$out"
}
for t in "${tests[@]}"; do
  exe="$work/bin/deps/$(basename "$t")"
  name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
  t0=$(now)
  # Each test alone, and not at all if an earlier L1 try finished it (tests/microvm/progress.sh).
  for test in $(selection "$name"); do
    [[ $test == *"${BELLJAR_MICROVM_FILTER:-}"* ]] || continue
    progress_run as_user_test "$exe" "$name::$test" "$test" "$work/$name.out"
  done
  say "$name: done in $(since "$t0")s"
  # L1 has no udev, so /dev/net/tun is root's 0600 and the doctor rightly warns (its fix:
  # 0666, what udev sets on desktops). After that check the host is made like a desktop, so
  # that the rootless sandboxes that follow get their network (e2e_ports).
  # Likewise doctor says to join the kvm group; the user joins it (what `usermod -aG kvm`
  # does, written in place: the file is a bind mount) for the microVM test that follows.
  # Every L1 try starts from a fresh L1, so this runs even when an earlier try ran doctor.
  if [ "$name" = doctor ]; then
    chmod 0666 /dev/net/tun
    sed "s/^\(kvm:[^:]*:[^:]*:\)\(.*\)$/\1\2${user}/; s/^\(kvm:[^:]*:[^:]*:.\+\)${user}$/\1,${user}/" "$etc/group" > "$work/group.new" &&
      cat "$work/group.new" > "$etc/group"
    say "joined kvm: $(grep '^kvm:' /etc/group)"
  fi
done
# Never write outside Belljar's own groups: the delegated subtree holds only the session and
# belljar/ (the sandboxes' parent), and belljar/ is empty once every sandbox is gone.
others=$(cd "$service" && find . -mindepth 1 -maxdepth 1 -type d ! -name session.scope ! -name belljar)
leftover=$(cd "$service" && find belljar -mindepth 1 -maxdepth 1 -type d 2> /dev/null)
if [ -n "$others$leftover" ]; then
  say "unexpected groups under $service: $others $leftover"
  progress_record rootless::only_its_own_groups failed
fi
status=0
progress_status || status=1
summary="rootless job: $(progress_counts) in $(since "$start")s"
echo "$summary"
echo "$summary" > "$BELLJAR_RESULTS/summary"
echo "$status" > "$BELLJAR_RESULTS/status"
exit "$status"
