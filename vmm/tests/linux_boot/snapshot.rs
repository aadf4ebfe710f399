//! Memory snapshots of a running Linux guest (part of `linux_boot`, run by
//! `scripts/test-microvm.sh`): the processes inside must survive the VMM being killed.

use super::*;

/// A root filesystem whose init (busybox sh) prints `COUNT n` on the console every 200 ms
/// and runs the agent (the base image's static binary) listening on vsock port 1024.
fn counter_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("counter-root");
    for d in ["bin", "sbin", "dev", "proc", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("copy /bin/busybox (install busybox-static)");
    let agent = root.join("sbin/belljar-agent");
    let ok = Command::new("debugfs")
        .arg("-R")
        .arg(format!("dump /sbin/belljar-agent {}", agent.display()))
        .arg(rootfs())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(
        ok && agent.exists(),
        "cannot take the agent out of the base image"
    );
    let init = root.join("init");
    std::fs::write(
        &init,
        "#!/bin/busybox sh\n\
         B=/bin/busybox\n\
         $B mount -t proc proc /proc\n\
         $B mount -t tmpfs tmp /tmp\n\
         (i=0; while :; do i=$((i+1)); echo \"COUNT $i\"; $B sleep 0.2; done) &\n\
         BELLJAR_LISTEN=vsock:1024 BELLJAR_MODE=plain BELLJAR_STATE_DIR=/tmp/agent /sbin/belljar-agent &\n\
         wait\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in [&init, &agent] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let img = dir.join("counter-root.ext4");
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&root)
        .arg(&img)
        .arg("32M")
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfs.ext4 -d failed");
    img
}

/// The counts in a console log (`COUNT n` lines, whole ones only).
fn counts(log: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("COUNT ")?.parse().ok())
        .collect()
}

/// Whether the agent accepts a new host connection on vsock port 1024.
fn agent_answers(uds: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(uds) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut line = String::new();
    s.write_all(b"CONNECT 1024\n").is_ok()
        && BufReader::new(&s).read_line(&mut line).is_ok()
        && line.starts_with("OK ")
}

/// One VMM's config for the snapshot test: its own console, vsock and control socket.
fn counter_config(dir: &Path, root: &Path, name: &str) -> PathBuf {
    let cfg = VmConfig {
        kernel: Some(kernel()),
        cmdline: format!("{DEFAULT_CMDLINE} root=/dev/vda ro rootfstype=ext4 init=/init"),
        memory_mib: 256,
        vcpus: 2,
        disks: vec![DiskConfig {
            path: root.to_path_buf(),
            read_only: true,
            id: "root".into(),
        }],
        vsock: Some(VsockConfig {
            guest_cid: 3,
            uds_path: dir.join(format!("{name}.vsock")),
        }),
        serial: SerialConfig {
            log: Some(dir.join(format!("{name}.log"))),
            echo: false,
        },
        control_socket: Some(dir.join(format!("{name}.sock"))),
        ..Default::default()
    };
    let p = dir.join(format!("{name}.json"));
    std::fs::write(&p, cfg.to_json()).unwrap();
    p
}

/// Waits for `cond` until the boot timeout, showing `log` if it never holds.
fn wait_for(what: &str, log: &Path, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(t.elapsed() < timeout(), "{what}: not in time:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Memory snapshot of a running Linux guest: a shell loop counting on the console and the
/// agent on vsock. The VMM is killed after the snapshot; two VMMs restored from it (a fork)
/// go on counting from where it stopped, and their agents take new vsock connections.
#[test]
#[ignore = "needs hardware KVM, the guest kernel, the base image and busybox-static"]
fn processes_survive_snapshot_kill_and_restore_twice() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = counter_rootfs(d);
    let t = Instant::now();
    let mut parent = spawn_vmm(&counter_config(d, &root, "parent"));
    let log = d.join("parent.log");
    wait_for("the agent on vsock", &log, || {
        counts(&log).len() >= 5 && agent_answers(&d.join("parent.vsock"))
    });
    eprintln!("parent counting, agent up after {:?}", t.elapsed());
    let mut ctl = ControlClient::connect(&d.join("parent.sock"), Duration::from_secs(60)).unwrap();
    ctl.pause().unwrap();
    let last = *counts(&log).last().unwrap();
    let taken = ctl.snapshot(&d.join("snap")).unwrap();
    eprintln!("snapshot of 256 MiB, 2 vCPUs at COUNT {last}: {taken:?}");
    parent.0.kill().unwrap();
    parent.0.wait().unwrap();

    let mut children = Vec::new();
    for name in ["a", "b"] {
        let t = Instant::now();
        let cfg = counter_config(d, &root, name);
        let snap = d.join("snap");
        let child = Vmm(Command::new(BIN)
            .args([Path::new("--config"), &cfg, Path::new("--restore"), &snap])
            .spawn()
            .unwrap());
        let (sock, log) = (
            d.join(format!("{name}.sock")),
            d.join(format!("{name}.log")),
        );
        wait_for("the restored VMM's control socket", &log, || {
            ControlClient::connect(&sock, Duration::from_secs(10))
                .is_ok_and(|mut c| c.status().is_ok())
        });
        let answered = t.elapsed();
        wait_for("the restored guest's count", &log, || {
            !counts(&log).is_empty()
        });
        eprintln!(
            "child {name}: restored and answering after {answered:?}, first COUNT after {:?}",
            t.elapsed()
        );
        children.push((child, name, sock, log));
    }
    for (_, name, sock, log) in &children {
        wait_for("more counts", log, || counts(log).len() >= 5);
        let c = counts(log);
        // It went on from the snapshot: no restart at 1, no gap, still counting.
        assert!(
            c[0] > last && c[0] <= last + 2,
            "{name}: {c:?} after {last}"
        );
        assert!(c.windows(2).all(|w| w[1] == w[0] + 1), "{name}: {c:?}");
        let uds = d.join(format!("{name}.vsock"));
        wait_for("the agent after restore", log, || agent_answers(&uds));
        ControlClient::connect(sock, Duration::from_secs(10))
            .unwrap()
            .stop()
            .unwrap();
    }
    for (mut child, ..) in children {
        assert_eq!(child.0.wait().unwrap().code(), Some(0));
    }
}
