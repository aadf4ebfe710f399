//! The `belljar-vmm` binary as the daemon uses it: config file, exit statuses, control
//! socket (with the seccomp filter installed), all with tiny raw guests.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use belljar_vmm_api::config::{BootMode, SerialConfig, VmConfig};
use belljar_vmm_api::control::{ErrorCode, Response, VmState};
use belljar_vmm_api::exit::CONFIG_ERROR_STATUS;
use belljar_vmm_api::{ControlClient, ExitReason};

const BIN: &str = env!("CARGO_BIN_EXE_belljar-vmm");

fn have_kvm() -> bool {
    let ok = Path::new("/dev/kvm").exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI machines have /dev/kvm"
        );
        eprintln!("not run: no /dev/kvm");
    }
    ok
}

/// print "hi", then either reset through the i8042 or wait halted (interrupts off).
fn guest(dir: &Path, reset: bool) -> std::path::PathBuf {
    let mut code = vec![0x66, 0xba, 0xf8, 0x03, 0xb0, b'h', 0xee, 0xb0, b'i', 0xee];
    if reset {
        code.extend([0xb0, 0xfe, 0xe6, 0x64]);
    }
    code.extend([0xfa, 0xf4]); // cli; hlt
    let p = dir.join("guest.bin");
    std::fs::write(&p, code).unwrap();
    p
}

#[test]
fn bad_configs_fail_fast_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let k = guest(dir.path(), true);
    let cases: Vec<Vec<String>> = vec![
        vec![],
        vec!["--kernel".into(), "/nonexistent/vmlinux".into()],
        vec![
            "--kernel".into(),
            k.display().to_string(),
            "--memory-mib".into(),
            "0".into(),
        ],
        vec![
            "--kernel".into(),
            k.display().to_string(),
            "--disk".into(),
            "/nonexistent/disk.img,ro".into(),
        ],
    ];
    for args in cases {
        let t = Instant::now();
        let out = Command::new(BIN).args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(i32::from(CONFIG_ERROR_STATUS)),
            "{args:?}"
        );
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}

#[test]
fn guest_reset_exits_10_and_logs_console() {
    if !have_kvm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = VmConfig {
        kernel: Some(guest(dir.path(), true)),
        boot: BootMode::Raw,
        memory_mib: 16,
        serial: SerialConfig {
            log: Some(dir.path().join("console.log")),
            echo: true,
        },
        ..Default::default()
    };
    let cfg_path = dir.path().join("vm.json");
    std::fs::write(&cfg_path, cfg.to_json()).unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&cfg_path)
        .output()
        .unwrap();
    assert_eq!(
        ExitReason::from_exit_code(out.status.code()),
        Some(ExitReason::Reset),
        "{out:?}"
    );
    assert_eq!(out.stdout, b"hi");
    assert_eq!(
        std::fs::read(dir.path().join("console.log")).unwrap(),
        b"hi"
    );
}

/// The agent's way to power off: one byte on Belljar's power-off port ends the VMM with 11.
#[test]
fn guest_power_off_port_exits_11() {
    if !have_kvm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // mov al, 1; mov dx, 0x501; out dx, al; cli; hlt
    let code = [0xb0, 0x01, 0x66, 0xba, 0x01, 0x05, 0xee, 0xfa, 0xf4];
    let kernel = dir.path().join("guest.bin");
    std::fs::write(&kernel, code).unwrap();
    let out = Command::new(BIN)
        .arg("--kernel")
        .arg(&kernel)
        .args(["--boot", "raw", "--memory-mib", "16"])
        .output()
        .unwrap();
    assert_eq!(
        ExitReason::from_exit_code(out.status.code()),
        Some(ExitReason::PowerOff),
        "{out:?}"
    );
}

#[test]
fn control_socket_pause_resume_metrics_stop() {
    if !have_kvm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vmm.sock");
    let mut child = Command::new(BIN)
        .arg("--kernel")
        .arg(guest(dir.path(), false))
        .args(["--boot", "raw", "--memory-mib", "32", "--vcpus", "2"])
        .arg("--control-socket")
        .arg(&sock)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut ctl = loop {
        match ControlClient::connect(&sock, Duration::from_secs(5)) {
            Ok(c) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("control socket: {e}"),
        }
    };

    let s = ctl.status().unwrap();
    assert_eq!(s.state, VmState::Running);
    assert_eq!(s.exit_reason, None);
    assert_eq!(ctl.pause().unwrap(), VmState::Paused);
    assert_eq!(ctl.resume().unwrap(), VmState::Running);
    let m = ctl.metrics().unwrap();
    assert_eq!(m.vcpus.len(), 2);
    assert!(m.vcpus[0].io_exits >= 2);
    assert!(m.rss_bytes > 0);
    assert_eq!(m.guest_memory_bytes, 32u64 << 20);
    assert_eq!(m.devices[0].name, "serial");
    assert_eq!(m.devices[0].bytes_in, 2);

    // What the typed client cannot send: an unknown command and a malformed line, on a
    // raw connection, get the contract's error codes.
    let mut raw = UnixStream::connect(&sock).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(raw.try_clone().unwrap());
    for (line, code) in [
        ("{\"cmd\":\"fly\"}\n", ErrorCode::UnknownCommand),
        ("{\"cmd\":\"stop\",\"now\":true}\n", ErrorCode::BadRequest),
    ] {
        raw.write_all(line.as_bytes()).unwrap();
        let mut answer = String::new();
        reader.read_line(&mut answer).unwrap();
        match serde_json::from_str::<Response>(&answer).unwrap() {
            Response::Error(e) => assert_eq!(e.code, code, "{line}"),
            other => panic!("{line}: {other:?}"),
        }
    }

    assert_eq!(ctl.stop().unwrap(), VmState::Stopping);
    let status = child.wait().unwrap();
    assert_eq!(
        ExitReason::from_exit_code(status.code()),
        Some(ExitReason::Stopped)
    );
}

#[test]
fn sigterm_stops_with_status_0() {
    if !have_kvm() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .arg("--kernel")
        .arg(guest(dir.path(), false))
        .args(["--boot", "raw", "--memory-mib", "16", "--echo"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The guest's "hi" on the echoed console means its vCPU runs, and the VMM installs its
    // signal handlers before it starts any: from then on SIGTERM is a clean stop.
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut hi = [0u8; 2];
        let _ = tx.send(stdout.read_exact(&mut hi).map(|()| hi));
        // Keep draining so the VMM never blocks on a full pipe.
        let _ = std::io::copy(&mut stdout, &mut std::io::sink());
    });
    let hi = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("guest output within 10 s")
        .unwrap();
    assert_eq!(&hi, b"hi");
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: plain kill(2) on our own child, which has not been waited for yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}
