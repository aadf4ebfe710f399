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
use belljar_vmm_api::net::{MacAddr, NetConfig};
use belljar_vmm_api::{ControlClient, DEFAULT_CMDLINE, ExitReason};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_belljar-vmm");

/// Processes surviving a memory snapshot, a killed VMM and two restores. (A test crate's
/// root resolves `mod` next to itself, where `tests/snapshot.rs` is another test crate.)
#[path = "linux_boot/snapshot.rs"]
mod snapshot;

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

/// The guest's and the stand-in gateway's addresses in the net test.
const GUEST_MAC: [u8; 6] = [0x02, 0x62, 0x6a, 0, 0, 2];
const GATEWAY_MAC: [u8; 6] = [0x02, 0x62, 0x6a, 0, 0, 1];
const GATEWAY_IP: [u8; 4] = [10, 0, 2, 2];

/// A root filesystem whose init (busybox sh) prints eth0's MAC and MTU, configures eth0 and
/// pings the gateway once, then reboots.
fn busybox_net_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    for d in ["bin", "dev", "proc", "sys"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("copy /bin/busybox (install busybox-static)");
    let init = root.join("init");
    std::fs::write(
        &init,
        "#!/bin/busybox sh\n\
         B=/bin/busybox\n\
         $B mount -t proc proc /proc\n\
         $B mount -t sysfs sys /sys\n\
         echo \"NET-MAC $($B cat /sys/class/net/eth0/address) MTU $($B cat /sys/class/net/eth0/mtu)\"\n\
         $B ip link set eth0 up\n\
         $B ip addr add 10.0.2.15/24 dev eth0\n\
         if $B ping -c 1 -W 20 10.0.2.2; then echo NET-PING-OK; else echo NET-PING-FAILED; fi\n\
         $B reboot -f\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let img = dir.join("net-root.ext4");
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&root)
        .arg(&img)
        .arg("16M")
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfs.ext4 -d failed");
    img
}

/// The gateway's answer to one guest frame: an ARP reply for the gateway's address or an
/// ICMP echo reply from it; `None` for anything else (IPv6 router solicitations, ...).
fn gateway_answer(f: &[u8]) -> Option<Vec<u8>> {
    let ethertype = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    if ethertype == 0x0806 && f.len() >= 42 && f[20..22] == [0, 1] && f[38..42] == GATEWAY_IP {
        let mut r = Vec::with_capacity(42);
        r.extend_from_slice(&f[6..12]);
        r.extend_from_slice(&GATEWAY_MAC);
        r.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
        r.extend_from_slice(&GATEWAY_MAC);
        r.extend_from_slice(&GATEWAY_IP);
        r.extend_from_slice(&f[22..28]);
        r.extend_from_slice(&f[28..32]);
        return Some(r);
    }
    if ethertype != 0x0800 || f.len() < 34 || f[23] != 1 || f[30..34] != GATEWAY_IP {
        return None;
    }
    let ihl = usize::from(f[14] & 0xf) * 4;
    let end = 14 + usize::from(u16::from_be_bytes([f[16], f[17]]));
    let icmp = 14 + ihl;
    if end > f.len() || icmp + 8 > end || f[icmp] != 8 {
        return None;
    }
    let mut r = f[..end].to_vec();
    r[..6].copy_from_slice(&f[6..12]);
    r[6..12].copy_from_slice(&GATEWAY_MAC);
    // Swapping the addresses leaves the IP header checksum as it was.
    r[26..30].copy_from_slice(&f[30..34]);
    r[30..34].copy_from_slice(&f[26..30]);
    r[icmp] = 0;
    r[icmp + 2..icmp + 4].copy_from_slice(&[0, 0]);
    let sum = internet_checksum(&r[icmp..end]);
    r[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
    Some(r)
}

fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap()
}

/// virtio-net end to end: the guest's frames reach the frame socket with the configured MAC,
/// and the test, standing in for the daemon's stack, answers ARP and ping through it.
#[test]
#[ignore = "needs hardware KVM, the guest kernel and busybox-static"]
fn guest_pings_through_the_frame_socket() {
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("net.sock");
    let cfg = VmConfig {
        kernel: Some(kernel()),
        cmdline: format!("{DEFAULT_CMDLINE} root=/dev/vda rw rootfstype=ext4 init=/init"),
        memory_mib: 256,
        disks: vec![DiskConfig {
            path: busybox_net_rootfs(dir.path()),
            read_only: false,
            id: "root".into(),
        }],
        net: Some(NetConfig {
            socket: socket.clone(),
            mac: MacAddr(GUEST_MAC),
            mtu: 1500,
        }),
        serial: SerialConfig {
            log: Some(dir.path().join("console.log")),
            echo: false,
        },
        ..Default::default()
    };
    let path = dir.path().join("vm.json");
    std::fs::write(&path, cfg.to_json()).unwrap();
    let t = Instant::now();
    let mut vmm = spawn_vmm(&path);
    let log = dir.path().join("console.log");
    // The VMM binds the socket before the guest runs.
    let peer = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
    let addr = SocketAddrUnix::new(&socket).unwrap();
    while rustix::net::connect(&peer, &addr).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "no frame socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    rustix::net::sockopt::set_socket_timeout(
        &peer,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_millis(200)),
    )
    .unwrap();
    let (mut frames, mut answered) = (0, 0);
    let mut buf = vec![0u8; 2048];
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("NET-PING-") {
            break text;
        }
        if let Some(status) = vmm.0.try_wait().unwrap() {
            panic!("VMM exited ({status}) before the ping:\n{text}");
        }
        assert!(t.elapsed() < timeout(), "no ping result in time:\n{text}");
        let n = match rustix::net::recv(&peer, &mut buf[..], RecvFlags::empty()) {
            Ok((_, n)) => n,
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(e) => panic!("frame socket: {e}"),
        };
        // End of stream: the guest printed its result and powered off between the log check
        // above and this read (the VMM closes the socket as it exits). The next turn of the
        // loop reads the result, or sees the VMM's exit.
        if n == 0 {
            continue;
        }
        let f = &buf[..n];
        frames += 1;
        assert_eq!(f[6..12], GUEST_MAC, "source MAC of frame {frames}");
        if let Some(answer) = gateway_answer(f) {
            match rustix::net::send(&peer, &answer, SendFlags::NOSIGNAL) {
                Ok(_) => answered += 1,
                // A late frame (an ARP retransmit, say) of a guest that has since printed its
                // result and powered off: the VMM is gone, and the next turn sees why.
                Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => {}
                Err(e) => panic!("frame socket send: {e}"),
            }
        }
    };
    eprintln!(
        "ping result after {:?}: {frames} frames, {answered} answered",
        t.elapsed()
    );
    assert!(
        text.contains("NET-MAC 02:62:6a:00:00:02 MTU 1500"),
        "{text}"
    );
    assert!(text.contains("NET-PING-OK"), "{text}");
    assert!(answered >= 2, "ARP and ICMP answered: {answered}");
    let status = vmm.0.wait().unwrap();
    assert_eq!(
        ExitReason::from_exit_code(status.code()),
        Some(ExitReason::Reset)
    );
}

#[test]
fn gateway_answers_arp_and_ping_with_valid_checksums() {
    // An ARP request from the guest for 10.0.2.2.
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&GUEST_MAC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&GUEST_MAC);
    arp.extend_from_slice(&[10, 0, 2, 15, 0, 0, 0, 0, 0, 0]);
    arp.extend_from_slice(&GATEWAY_IP);
    let r = gateway_answer(&arp).unwrap();
    assert_eq!(
        (r.len(), &r[..6], &r[20..22]),
        (42, &GUEST_MAC[..], &[0, 2][..])
    );
    assert_eq!(&r[28..32], &GATEWAY_IP);
    assert_eq!(&r[38..42], &[10, 0, 2, 15]);
    // An echo request: 20-byte IP header, 8-byte ICMP header, 4 bytes of data.
    let mut ip = vec![0x45, 0, 0, 32, 0, 1, 0x40, 0, 64, 1, 0, 0, 10, 0, 2, 15];
    ip.extend_from_slice(&GATEWAY_IP);
    let csum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let mut icmp = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1, 1, 2, 3, 4];
    let csum = internet_checksum(&icmp);
    icmp[2..4].copy_from_slice(&csum.to_be_bytes());
    let mut ping = GATEWAY_MAC.to_vec();
    ping.extend_from_slice(&GUEST_MAC);
    ping.extend_from_slice(&[0x08, 0]);
    ping.extend_from_slice(&ip);
    ping.extend_from_slice(&icmp);
    let r = gateway_answer(&ping).unwrap();
    assert_eq!(r[34], 0, "echo reply");
    assert_eq!(internet_checksum(&r[14..34]), 0, "IP checksum");
    assert_eq!(internet_checksum(&r[34..]), 0, "ICMP checksum");
    assert_eq!(
        (&r[26..30], &r[30..34]),
        (&GATEWAY_IP[..], &[10, 0, 2, 15][..])
    );
    assert!(gateway_answer(&ping[..20]).is_none());
}
