//! Snapshots through the `belljar-vmm` binary, the way the daemon takes them: `snapshot` on
//! the control socket (with the files passed along, under the seccomp filter), `kill -9`,
//! then `belljar-vmm --restore` in a new process, twice from one snapshot. The tiny guest
//! prints its counter's bits 16-23 as one byte every 65536 steps, so the console shows
//! whether a restored guest went on counting or started over.
//!
//! Skipped (with a message) on hosts without /dev/kvm.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use belljar_vmm_api::config::{BootMode, SerialConfig, VmConfig};
use belljar_vmm_api::control::{ErrorCode, SNAPSHOT_STATE_FILE, VmState};
use belljar_vmm_api::exit::RESTORE_ERROR_STATUS;
use belljar_vmm_api::{ControlClient, client::ClientError};

const BIN: &str = env!("CARGO_BIN_EXE_belljar-vmm");

/// mov ebx, 0x200000; xor ecx, ecx; mov dx, 0x3f8
/// loop: inc ecx; mov [rbx], ecx; test ecx, 0xffff; jnz loop
///       mov eax, ecx; shr eax, 16; out dx, al; jmp loop
const PRINTING_GUEST: &[u8] = &[
    0xbb, 0x00, 0x00, 0x20, 0x00, // mov ebx, 0x200000
    0x31, 0xc9, // xor ecx, ecx
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
    0xff, 0xc1, // loop: inc ecx
    0x89, 0x0b, // mov [rbx], ecx
    0xf7, 0xc1, 0xff, 0xff, 0x00, 0x00, // test ecx, 0xffff
    0x75, 0xf4, // jnz loop
    0x89, 0xc8, // mov eax, ecx
    0xc1, 0xe8, 0x10, // shr eax, 16
    0xee, // out dx, al
    0xeb, 0xec, // jmp loop
];

fn have_kvm() -> bool {
    if Path::new("/dev/kvm").exists() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI machines have /dev/kvm"
    );
    eprintln!("not run: no /dev/kvm");
    false
}

/// The VMM under test, killed if the test fails past it.
struct Vmm(Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A config for one VMM process named `name` (its own log and control socket).
fn config(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let kernel = dir.join("guest.bin");
    std::fs::write(&kernel, PRINTING_GUEST).unwrap();
    let log = dir.join(format!("{name}.log"));
    let sock = dir.join(format!("{name}.sock"));
    let cfg = VmConfig {
        kernel: Some(kernel),
        boot: BootMode::Raw,
        memory_mib: 16,
        rng: false,
        serial: SerialConfig {
            log: Some(log.clone()),
            echo: false,
        },
        control_socket: Some(sock.clone()),
        seccomp: true,
        ..Default::default()
    };
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, cfg.to_json()).unwrap();
    (path, log, sock)
}

fn spawn(cfg: &Path, restore: Option<&Path>) -> Vmm {
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(cfg).stderr(Stdio::piped());
    if let Some(dir) = restore {
        cmd.arg("--restore").arg(dir);
    }
    Vmm(cmd.spawn().unwrap())
}

fn connect(sock: &Path) -> ControlClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ControlClient::connect(sock, Duration::from_secs(10)) {
            Ok(c) => return c,
            Err(e) => assert!(Instant::now() < deadline, "no control socket: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The bytes the guest printed so far.
fn printed(log: &Path) -> Vec<u8> {
    std::fs::read(log).unwrap_or_default()
}

fn wait_for_bytes(log: &Path, n: usize) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let b = printed(log);
        if b.len() >= n {
            return b;
        }
        assert!(Instant::now() < deadline, "only {b:?} printed");
        std::thread::yield_now();
    }
}

#[test]
fn snapshot_over_the_control_socket_then_kill_and_restore_twice() {
    if !have_kvm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let (cfg, log, sock) = config(dir.path(), "parent");
    let mut parent = spawn(&cfg, None);
    let mut ctl = connect(&sock);
    wait_for_bytes(&log, 3);
    // Paused first, so the console holds everything the snapshot's guest printed.
    assert_eq!(ctl.pause().unwrap(), VmState::Paused);
    let before = printed(&log);
    let last = *before.last().unwrap();
    let taken = ctl.snapshot(&snap).unwrap();
    eprintln!("snapshot over the control socket: {taken:?}");
    assert!(taken.state_bytes > 1000 && taken.memory_bytes >= 4096);
    // A second snapshot into the same directory is refused by the client: the files exist.
    assert!(matches!(ctl.snapshot(&snap), Err(ClientError::Io(_))));
    // The parent dies without a word, like a crashed host process.
    parent.0.kill().unwrap();
    parent.0.wait().unwrap();

    let mut children = Vec::new();
    for name in ["a", "b"] {
        let (cfg, log, sock) = config(dir.path(), name);
        let t = Instant::now();
        let child = spawn(&cfg, Some(&snap));
        let mut ctl = connect(&sock);
        assert_eq!(ctl.status().unwrap().state, VmState::Running);
        eprintln!(
            "child {name}: control socket answers {:?} after spawn",
            t.elapsed()
        );
        children.push((child, ctl, log));
    }
    for (_, _, log) in &children {
        let got = wait_for_bytes(log, 3);
        // It counts on: its first value follows the parent's last, it does not restart at 1.
        assert_eq!(
            got[0],
            last.wrapping_add(1),
            "parent ended at {last}, child {got:?}"
        );
        assert_eq!(got[1], last.wrapping_add(2));
    }
    // The children are independent: pausing one leaves the other running.
    assert_eq!(children[0].1.pause().unwrap(), VmState::Paused);
    let frozen = printed(&children[0].2).len();
    let other = printed(&children[1].2).len();
    wait_for_bytes(&children[1].2, other + 3);
    assert_eq!(printed(&children[0].2).len(), frozen);
    for (_, ctl, _) in &mut children {
        ctl.stop().unwrap();
    }
    for (mut child, _, _) in children {
        assert_eq!(child.0.wait().unwrap().code(), Some(0));
    }
}

#[test]
fn snapshot_without_files_and_a_damaged_restore_are_refused() {
    if !have_kvm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (cfg, log, sock) = config(dir.path(), "parent");
    let _parent = spawn(&cfg, None);
    let mut ctl = connect(&sock);
    wait_for_bytes(&log, 1);
    // `snapshot` sent as a plain line, without the two files.
    match ctl
        .call(belljar_vmm_api::control::Request::Snapshot)
        .unwrap()
    {
        belljar_vmm_api::control::Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::SnapshotFailed, "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    // The running VM went on running through a snapshot.
    let snap = dir.path().join("snap");
    ctl.snapshot(&snap).unwrap();
    assert_eq!(ctl.status().unwrap().state, VmState::Running);

    let state = snap.join(SNAPSHOT_STATE_FILE);
    let mut bytes = std::fs::read(&state).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&state, &bytes).unwrap();
    let (cfg, _, _) = config(dir.path(), "child");
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("--restore")
        .arg(&snap)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(i32::from(RESTORE_ERROR_STATUS)),
        "{stderr}"
    );
    assert!(stderr.trim_end().ends_with("(checksum)"), "{stderr}");
}
