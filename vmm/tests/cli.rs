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
/// Kills the VMM when an assertion fails, so it does not outlive the test (a VMM left
/// running holds the test's output pipe, and the test run never ends).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
        vec![
            "--config".into(),
            net_config(dir.path(), &k, "01:00:5e:00:00:01"),
        ],
        vec![
            "--config".into(),
            net_config(dir.path(), &k, "02:00:00:00:00"),
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
        // A bad config must end the VMM before any guest runs; what this bounds is a hang,
        // not the speed of a process start on a loaded machine (which took over 2 s in a
        // CI run with the workspace's other tests beside it).
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{args:?}: {:?}",
            t.elapsed()
        );
    }
}

/// A config file with virtio-net whose frame socket is `<dir>/net.sock`.
fn net_config(dir: &Path, kernel: &Path, mac: &str) -> String {
    let json = serde_json::json!({
        "kernel": kernel, "boot": "raw", "memory_mib": 16,
        "net": {"socket": dir.join("net.sock"), "mac": mac},
    });
    let p = dir.join(format!("net-{mac}.json"));
    std::fs::write(&p, json.to_string()).unwrap();
    p.display().to_string()
}

/// The frame socket under the seccomp filter: the VMM accepts the daemon, and a second
/// daemon (a restarted one) replaces the first, whose connection is closed.
#[test]
fn frame_socket_accepts_a_new_peer_under_seccomp() {
    if !have_kvm() {
        return;
    }
    use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketType};
    let dir = tempfile::tempdir().unwrap();
    let config = net_config(dir.path(), &guest(dir.path(), false), "02:62:6a:00:00:02");
    let child = KillOnDrop(
        Command::new(BIN)
            .args(["--config", &config])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Wait until the filter is on: the main thread reports seccomp mode 2.
    let t = Instant::now();
    let status = format!("/proc/{}/status", child.0.id());
    while !std::fs::read_to_string(&status)
        .unwrap_or_default()
        .contains("Seccomp:\t2")
    {
        assert!(t.elapsed() < Duration::from_secs(10), "no seccomp filter");
        std::thread::sleep(Duration::from_millis(10));
    }
    let connect = || {
        let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        let addr = SocketAddrUnix::new(dir.path().join("net.sock")).unwrap();
        rustix::net::connect(&fd, &addr).unwrap();
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_secs(10)),
        )
        .unwrap();
        fd
    };
    let first = connect();
    let _second = connect();
    // The first peer's read ends (0 bytes) once the VMM has accepted both: no timeout.
    let mut buf = [0u8; 64];
    let got = rustix::net::recv(&first, &mut buf[..], RecvFlags::empty());
    assert_eq!(got.map(|(_, n)| n), Ok(0));
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
    let mut child = KillOnDrop(
        Command::new(BIN)
            .arg("--kernel")
            .arg(guest(dir.path(), false))
            .args(["--boot", "raw", "--memory-mib", "32", "--vcpus", "2"])
            .arg("--control-socket")
            .arg(&sock)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
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
    // The control socket answers as soon as the VMM starts, before the first vCPU has run
    // its two `out`s on a loaded host: wait for them (the guest then halts for good).
    let t = Instant::now();
    let m = loop {
        let m = ctl.metrics().unwrap();
        if m.vcpus[0].io_exits >= 2 || t.elapsed() > Duration::from_secs(30) {
            break m;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(m.vcpus.len(), 2);
    assert!(m.vcpus[0].io_exits >= 2, "{m:?}");
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
    let status = child.0.wait().unwrap();
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
