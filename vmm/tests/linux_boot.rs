//! Boots the project's guest kernel with the agent as PID 1. Needs hardware KVM, the kernel
//! (`guest-images/kernel/build.sh`) and the base image (`guest-images/build-image.sh base`),
//! so it is ignored by default:
//!
//!     cargo test -p belljar-vmm -- --ignored
//!
//! Overrides: `BELLJAR_KERNEL` (vmlinux path), `BELLJAR_ROOTFS` (rootfs.ext4 path),
//! `BELLJAR_BOOT_TIMEOUT` (seconds, default 60; raise it a lot on software KVM).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use belljar_vmm_api::config::{DiskConfig, SerialConfig, VmConfig, VsockConfig};
use belljar_vmm_api::{ControlClient, DEFAULT_CMDLINE, ExitReason};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_belljar-vmm");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kernel() -> PathBuf {
    if let Some(k) = std::env::var_os("BELLJAR_KERNEL") {
        return k.into();
    }
    let out = Command::new(repo().join("guest-images/kernel/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run guest-images/kernel/build.sh");
    assert!(out.status.success(), "guest-images/kernel/build.sh failed");
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().expect("kernel path").trim())
}

fn rootfs() -> PathBuf {
    if let Some(r) = std::env::var_os("BELLJAR_ROOTFS") {
        return r.into();
    }
    let cache = std::env::var_os("BELLJAR_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| Path::new(&c).join("belljar")))
        .unwrap_or_else(|| Path::new(&std::env::var("HOME").unwrap()).join(".cache/belljar"));
    let p = cache.join("images/base/current/rootfs.ext4");
    assert!(
        p.exists(),
        "{} missing: run guest-images/build-image.sh base",
        p.display()
    );
    p
}

fn timeout() -> Duration {
    let secs = std::env::var("BELLJAR_BOOT_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

fn scratch_disk(dir: &Path) -> PathBuf {
    let p = dir.join("layer.ext4");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&p)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfs.ext4 failed");
    p
}

fn config(dir: &Path, extra_cmdline: &str) -> PathBuf {
    let cfg = VmConfig {
        kernel: Some(kernel()),
        cmdline: format!(
            "{DEFAULT_CMDLINE} root=/dev/vda ro init=/sbin/belljar-agent {extra_cmdline}"
        ),
        memory_mib: 512,
        vcpus: 2,
        disks: vec![
            DiskConfig {
                path: rootfs(),
                read_only: true,
                id: "root".into(),
            },
            DiskConfig {
                path: scratch_disk(dir),
                read_only: false,
                id: "layer".into(),
            },
        ],
        vsock: Some(VsockConfig {
            guest_cid: 3,
            uds_path: dir.join("vsock.sock"),
        }),
        serial: SerialConfig {
            log: Some(dir.join("console.log")),
            echo: false,
        },
        control_socket: Some(dir.join("vmm.sock")),
        ..Default::default()
    };
    let p = dir.join("vm.json");
    std::fs::write(&p, cfg.to_json()).unwrap();
    p
}

/// The VMM under test, killed when a failed assertion unwinds past it: a VMM left running
/// would keep the test's output open and its guest's CPU busy after the test ended.
struct Vmm(std::process::Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_vmm(cfg: &Path) -> Vmm {
    Vmm(Command::new(BIN).arg("--config").arg(cfg).spawn().unwrap())
}

#[test]
#[ignore = "needs hardware KVM, the guest kernel and the base image"]
fn agent_self_check_boots_to_marker() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "BELLJAR_SELFCHECK=1");
    let t = Instant::now();
    let mut vmm = spawn_vmm(&cfg);
    let child = &mut vmm.0;
    let log = dir.path().join("console.log");
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("BELLJAR-SELFCHECK-OK") {
            eprintln!("self-check marker after {:?}", t.elapsed());
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("VMM exited ({status}) before the marker:\n{text}");
        }
        assert!(t.elapsed() < timeout(), "no marker in time:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The agent powers off through the VMM's power-off port (exit status 11).
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "VMM did not exit after power-off"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        ExitReason::from_exit_code(status.code()),
        Some(ExitReason::PowerOff),
        "{status}"
    );
}

#[test]
#[ignore = "needs hardware KVM, the guest kernel and the base image"]
fn host_reaches_agent_over_hybrid_vsock() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "BELLJAR_LISTEN=vsock:1024");
    let mut vmm = spawn_vmm(&cfg);
    let child = &mut vmm.0;
    let uds = dir.path().join("vsock.sock");
    let t = Instant::now();
    // Retry until the agent listens: before that the guest answers with RST and the VMM
    // closes our socket.
    let line = loop {
        assert!(
            t.elapsed() < timeout(),
            "agent never accepted on vsock port 1024"
        );
        std::thread::sleep(Duration::from_millis(200));
        let Ok(mut s) = UnixStream::connect(&uds) else {
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"CONNECT 1024\n").unwrap();
        let mut line = String::new();
        if BufReader::new(&s).read_line(&mut line).is_ok() && line.starts_with("OK ") {
            break line;
        }
    };
    eprintln!("agent reachable after {:?}: {}", t.elapsed(), line.trim());
    let mut ctl =
        ControlClient::connect(&dir.path().join("vmm.sock"), Duration::from_secs(5)).unwrap();
    let m = ctl.metrics().unwrap();
    assert!(m.devices.iter().any(|d| d.name == "vsock") && m.rss_bytes > 0);
    ctl.stop().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        ExitReason::from_exit_code(status.code()),
        Some(ExitReason::Stopped)
    );
}
