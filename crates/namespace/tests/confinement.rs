//! What a real namespace sandbox (as root here, with the stand-in agent from
//! `belljar_namespace::testing` as PID 1) may reach and use: the image's owners, its own
//! namespaces, capabilities and seccomp filter, its cgroups and their limits, a sized disk, and
//! a clean signal state whatever the daemon's.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use belljar_namespace::Limits;
use belljar_namespace::testing;
use common::{Guard, T, sh, spec, tmpdir};
use procfs_core::process::Status;
use procfs_core::{FromRead, ProcessCGroups};

#[test]
fn probe_reports_this_host() {
    let p = belljar_namespace::probe();
    assert!(p.available, "{}", p.reason);
    assert!(!p.rootless);
    assert_eq!(p.cgroup, belljar_namespace::CgroupMode::V1);
}

#[test]
fn image_ownership_namespaces_and_confinement() {
    let tmp = tmpdir();
    let spec = spec(tmp.path(), "confined", Limits::default());
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).unwrap();
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    let check = |cmd: &str, want: &str| {
        let out = sh(&running.socket, cmd);
        assert_eq!(out.text.trim(), want, "{cmd}");
    };
    // The image's owners show through the idmapped lower layer.
    check(
        "stat -c '%u:%g %a' /workspace /etc/passwd /root",
        "1000:1000 755\n0:0 644\n0:0 700",
    );
    check(
        "su belljar -s /bin/sh -c 'id -u; touch /workspace/mine && stat -c %u /workspace/mine'",
        "1000\n1000",
    );
    // Loopback, up, and the tap the daemon's network stack attaches to (nothing else: the
    // sandbox reaches no host interface).
    check("ls /sys/class/net", "eth0\nlo");
    check("ping -c1 -W2 127.0.0.1 >/dev/null && echo ok", "ok");
    // Own PID namespace: few processes, PID 1 is the agent.
    check(
        "ls /proc | grep -c '^[0-9]*$' | awk '{print ($1 < 10)}'",
        "1",
    );
    // Mount points and the agent binary.
    check("grep -c ' / overlay' /proc/self/mounts", "1");
    check("touch /sbin/belljar-agent >/dev/null 2>&1; echo $?", "1");
    // The agent's socket is not in the sandbox's filesystem; /run/belljar is its own to write.
    check("ls -A /run/belljar | grep -c sock", "0");
    check("test -w /run/belljar && echo writable", "writable");
    // Capabilities are cut down; these need CAP_SYS_ADMIN or are refused by seccomp.
    // The agent's own extra (CAP_NET_ADMIN) is dropped by the agent before it serves.
    let caps = belljar_namespace::caps::KEPT.iter();
    let bounding: u64 = caps.map(|(c, _)| 1u64 << c).sum();
    check(
        "grep CapBnd /proc/self/status",
        &format!("CapBnd:\t{bounding:016x}"),
    );
    let refused = |cmd: &str| {
        check(
            &format!("({cmd}) >/dev/null 2>&1 && echo allowed || echo refused"),
            "refused",
        )
    };
    refused("unshare -U true");
    refused("unshare -n true");
    refused("nsenter -t 1 -m true");
    refused("swapoff -a");
    // Host-wide kernel knobs stay out of reach of the sandbox's root.
    refused("echo h > /proc/sysrq-trigger");
    refused("echo 1 > /proc/sys/vm/drop_caches");
    refused(
        "echo x > /proc/sys/kernel/hostname_of_host_does_not_exist || echo 2 > /proc/sys/kernel/randomize_va_space",
    );
    refused("head -c1 /proc/kcore");
    refused("dmesg");
    refused("echo 1 > /sys/kernel/mm/ksm/run");
    refused("mknod /tmp/sda b 8 0 && head -c1 /tmp/sda");
    // The seccomp filter: each call gets EPERM inside (ENOSYS for clone3, so libc falls back
    // to clone), while on the host the same call fails differently or succeeds — so the
    // refusal inside is the filter's doing.
    check("grep -E '^Seccomp:' /proc/self/status", "Seccomp:\t2");
    let probe = |args: &str| format!("/usr/local/bin/belljar-probe syscall {args}");
    let on_host = |args: &str| {
        let mut argv = args.split(' ');
        let out = Command::new(&spec.agent)
            .arg("syscall")
            .args(argv.by_ref())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let calls = [
        (libc::SYS_keyctl, "0 -1 0"),
        (libc::SYS_add_key, "0 0 0 0 0"),
        (libc::SYS_io_uring_setup, "0 0"),
        (libc::SYS_perf_event_open, "0 0 -1 -1 0"),
        (libc::SYS_unshare, "0"),
        (libc::SYS_bpf, "0 0 0"),
    ];
    for (nr, args) in calls {
        let args = format!("{nr} {args}");
        check(&probe(&args), "1");
        assert_ne!(
            on_host(&args),
            "1",
            "syscall {args} is refused on the host too"
        );
    }
    check(
        &probe(&format!("{} 0 0", libc::SYS_clone3)),
        &libc::ENOSYS.to_string(),
    );
    // The hostname and mounts are the sandbox's own: changing them (possible only while the
    // sandbox keeps CAP_SYS_ADMIN for the agent) does not touch the host.
    let host = nix::unistd::gethostname().unwrap();
    let sys_admin = belljar_namespace::caps::AGENT_NEEDS
        .iter()
        .any(|(c, _)| *c == 21);
    if sys_admin {
        check("hostname evil && hostname", "evil");
        check(
            "mount -t tmpfs t /tmp && touch /tmp/x && umount /tmp && echo ok",
            "ok",
        );
    } else {
        refused("hostname evil");
        check("hostname", "confined-host");
        refused("mount -t tmpfs t /tmp");
        refused("umount /run/belljar");
        refused("ip link set lo down");
    }
    assert_eq!(nix::unistd::gethostname().unwrap(), host);
    check(
        "reboot -f 2>/dev/null; sleep 0.2; echo still here",
        "still here",
    );
    // Host clock is not settable.
    check(
        "date -s 2000-01-01 >/dev/null 2>&1; date +%Y | awk '{print ($1 > 2020)}'",
        "1",
    );
    belljar_namespace::destroy(&spec.state_dir).unwrap();
}

/// `disk_bytes` is a real filesystem of that size under the sandbox's writable layer.
#[test]
fn the_disk_limit_holds_inside() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("not root: no sized disk");
        return;
    }
    let tmp = tmpdir();
    let limits = Limits {
        disk_bytes: Some(32 << 20),
        ..Limits::default()
    };
    let spec = spec(tmp.path(), "disk", limits);
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).expect("launch");
    assert!(running.limits.disk.is_enforced(), "{:?}", running.limits);
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    let out = sh(
        &running.socket,
        "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; echo rc=$?",
    );
    assert!(out.text.contains("No space left on device"), "{}", out.text);
    // Stopped and started again, the files are still there, on the same disk.
    belljar_namespace::stop(&spec.state_dir, Duration::from_secs(2)).unwrap();
    let again = belljar_namespace::launch(&spec).expect("relaunch");
    belljar_namespace::wait_ready(&again.socket, T).unwrap();
    let out = sh(&again.socket, "ls /workspace");
    assert!(out.text.contains("big"), "{}", out.text);
    belljar_namespace::destroy(&spec.state_dir).unwrap();
    assert!(!spec.state_dir.exists());
}

#[test]
fn limits_are_enforced_with_cgroups() {
    let tmp = tmpdir();
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        cpu: Some(0.25),
        pids: Some(40),
        disk_bytes: None,
    };
    let spec = spec(tmp.path(), "limited", limits);
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).unwrap();
    assert!(running.limits.memory.is_enforced(), "{:?}", running.limits);
    assert!(running.limits.cpu.is_enforced(), "{:?}", running.limits);
    assert!(running.limits.pids.is_enforced(), "{:?}", running.limits);
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    // Memory: a hog is OOM-killed inside the sandbox's cgroup; PID 1 survives.
    let out = sh(
        &running.socket,
        "a=xxxxxxxxxxxxxxxx; while true; do a=$a$a; done",
    );
    assert_eq!(out.code, 137, "killed by SIGKILL: {}", out.text);
    let usage = belljar_namespace::usage(&spec.state_dir).unwrap();
    assert!(usage.oom_kills.unwrap_or(1) >= 1, "{usage:?}");
    assert!(usage.memory_peak_bytes.unwrap() <= 64 << 20, "{usage:?}");
    assert_eq!(sh(&running.socket, "echo alive").text, "alive\n");
    // PIDs: forks beyond the limit fail.
    let out = sh(
        &running.socket,
        "for i in $(seq 60); do sleep 30 >/dev/null 2>&1 & done 2>&1 | grep -c fork; kill -9 -1; true",
    );
    assert!(
        out.text.trim().parse::<u32>().unwrap_or(0) > 0,
        "{}",
        out.text
    );
    // CPU: a busy loop for one second of wall time gets about a quarter of a CPU.
    let before = belljar_namespace::usage(&spec.state_dir)
        .unwrap()
        .cpu_usec
        .unwrap();
    sh(&running.socket, "timeout 1 sh -c 'while :; do :; done'");
    let used = belljar_namespace::usage(&spec.state_dir)
        .unwrap()
        .cpu_usec
        .unwrap()
        - before;
    assert!(
        used < 600_000,
        "used {used} us of CPU in 1 s with a 0.25 CPU quota"
    );
    // Freezing returns once every process is frozen (before, it returned as soon as freezing
    // began, with busy processes still running for a moment).
    sh(
        &running.socket,
        "for i in 1 2 3; do (while :; do :; done) >/dev/null 2>&1 & done",
    );
    for _ in 0..30 {
        belljar_namespace::freeze(&spec.state_dir).unwrap();
        assert!(belljar_namespace::is_frozen(&spec.state_dir).unwrap());
        belljar_namespace::thaw(&spec.state_dir).unwrap();
    }
    // Freeze and thaw.
    belljar_namespace::freeze(&spec.state_dir).unwrap();
    let frozen = testing::shell(&running.socket, "echo thawed", Duration::from_millis(300));
    assert!(frozen.is_err(), "frozen sandbox answered: {frozen:?}");
    belljar_namespace::thaw(&spec.state_dir).unwrap();
    assert_eq!(sh(&running.socket, "echo thawed").text, "thawed\n");
    belljar_namespace::destroy(&spec.state_dir).unwrap();
}

/// PID 1 is born in each of the sandbox's groups: the v1 ones joined through `tasks`, the v2
/// one (this host mounts an empty v2 hierarchy next to v1, and a sandbox gets a group there
/// for its freezer) through `clone3(CLONE_INTO_CGROUP)`. Its cgroup namespace is rooted at
/// its own group in each of them.
#[test]
fn pid1_starts_in_every_group_of_the_sandbox() {
    let tmp = tmpdir();
    let limits = Limits {
        memory_bytes: Some(256 << 20),
        cpu: Some(1.0),
        pids: Some(100),
        disk_bytes: None,
    };
    let spec = spec(tmp.path(), "grouped", limits);
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).unwrap();
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        || Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists();
    // A controller's group; "" is the v2 hierarchy's, which names no controller.
    let mut joined = vec!["memory", "pids", "cpu", "cpuacct"];
    if v2 {
        joined.push("");
    }
    let group_of = |text: &str, controller: &str| -> String {
        let groups = ProcessCGroups::from_read(text.as_bytes()).expect(text);
        groups
            .0
            .into_iter()
            .find(|g| match controller {
                "" => g.hierarchy == 0,
                c => g.controllers.iter().any(|x| x == c),
            })
            .unwrap_or_else(|| panic!("no {controller:?} line in {text}"))
            .pathname
    };
    let host = std::fs::read_to_string(format!("/proc/{}/cgroup", running.pid)).unwrap();
    let inside = sh(&running.socket, "cat /proc/1/cgroup").text;
    let group = format!("/belljar/{}", spec.id);
    for c in joined {
        let path = group_of(&host, c);
        assert!(path.ends_with(&group), "{c:?}: {path} (host view)");
        assert_eq!(group_of(&inside, c), "/", "{c:?} (the sandbox's view)");
    }
    belljar_namespace::destroy(&spec.state_dir).unwrap();
}

/// A daemon may ignore signals (SIGHUP under `nohup`, a real-time one for a library) or block
/// them in the thread that launches; both survive `fork` and `execve`, and the sandbox's PID 1
/// (and through it every command) must start with none of them.
#[test]
fn the_sandbox_starts_with_no_signal_of_the_daemon_ignored_or_blocked() {
    const RT: i32 = 34;
    // SAFETY: setting dispositions to SIG_IGN (process-wide: harmless to the other tests here,
    // which never rely on these signals) and blocking signals in this test's own thread.
    unsafe {
        assert_ne!(libc::signal(libc::SIGHUP, libc::SIG_IGN), libc::SIG_ERR);
        assert_ne!(libc::signal(RT, libc::SIG_IGN), libc::SIG_ERR);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigaddset(&mut set, RT + 1);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
            0
        );
    }
    let tmp = tmpdir();
    let spec = spec(tmp.path(), "signals", Limits::default());
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).expect("launch");
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    // A command's own mask and dispositions, as it started (`cat` inherits them from `sh`).
    let command = sh(&running.socket, "cat /proc/self/status").text;
    // PID 1's, read from the host once the agent has answered: while it spawns a command its
    // spawning thread blocks every signal for an instant, so reading /proc/1/status from that
    // very command could catch it mid-spawn.
    let agent = std::fs::read_to_string(format!("/proc/{}/status", running.pid)).unwrap();
    let bit = |sig: i32| 1u64 << (sig - 1);
    for out in [&command, &agent] {
        let status = Status::from_read(out.as_bytes()).expect(out);
        // The stand-in is a Rust program, which ignores SIGPIPE for itself: only ours count.
        assert_eq!(status.sigign & (bit(libc::SIGHUP) | bit(RT)), 0, "{out}");
        assert_eq!(status.sigblk, 0, "{out}");
    }
    belljar_namespace::destroy(&spec.state_dir).unwrap();
}
