//! Sandboxes on the `microvm` backend end to end: a real daemon, the real `belljar-vmm`, the
//! project's guest kernel and the `base` image, driven through the `belljar` CLI.
//!
//! They need KVM, so they are ignored by default. `scripts/test-microvm.sh` runs them: on a
//! host with hardware KVM directly, elsewhere inside a QEMU-TCG guest whose emulated AMD SVM
//! gives it a nested `/dev/kvm`. Nested KVM fails the daemon's speed probe, so the script sets
//! `BELLJAR_TESTING_FORCE_MICROVM=1`, which lets the explicit `--backend microvm` used here
//! through; on hardware KVM it changes nothing.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use belljar_api::{CreateSandbox, RunCommand, SandboxStatus};
use belljar_client::Client;
use belljar_e2e::microvm::{console, create_vm, vm_state};
use belljar_e2e::{Daemon, eventually, random_file, same_file, sh_ok, stderr, stdout};
use belljar_vmm_api::control::VmState;

/// A one-line HTTP server for the guest (perl is in the base image).
const SERVER: &str = r#"$s=IO::Socket::INET->new(LocalPort=>8000,Listen=>5,ReuseAddr=>1) or die "listen: $!"; while($c=$s->accept){while(<$c>){last if /^\r?$/} print $c "HTTP/1.0 200 OK\r\n\r\nhello from the microvm\n"; close $c}"#;

/// One request to a forwarded port on the host: the answer, or why there is none yet.
fn get(host_port: u16) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", host_port))
        .map_err(|e| format!("connect: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    c.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut body = String::new();
    c.read_to_string(&mut body)
        .map_err(|e| format!("read: {e}"))?;
    Ok(body)
}

/// The one name the test's DNS server knows.
const HOST_NAME: &str = "host.belljar.test";

/// A DNS server on 127.0.0.1 (the daemon's upstream) that answers [`HOST_NAME`] with `addr`
/// and nothing else.
fn dns_server(addr: Ipv4Addr) -> std::net::SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let at = sock.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let answer = belljar_network::testing::dns_answer(&buf[..n], |name| {
                (name == HOST_NAME).then_some(addr)
            });
            if let Some(r) = answer {
                let _ = sock.send_to(&r, from);
            }
        }
    });
    at
}

/// An IPv4 address of this host other than loopback (a guest's own 127.0.0.1 is its own):
/// inside L1, the one `tests/microvm/job.sh` gives its loopback device.
fn host_address() -> Ipv4Addr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("run ip");
    stdout(&out)
        .split_whitespace()
        .filter_map(|w| w.split('/').next()?.parse::<Ipv4Addr>().ok())
        .find(|a| !a.is_loopback() && !a.is_link_local() && !a.is_unspecified())
        .unwrap_or_else(|| panic!("no IPv4 address besides loopback:\n{}", stdout(&out)))
}

/// `belljar create --backend microvm`; returns the id and how long it took.
fn create(d: &Daemon) -> (String, Duration) {
    let t = Instant::now();
    // A nested microVM under load can spend minutes in one test; the default 5 min timeout
    // would stop the sandbox mid-test (a 100 MiB download then ends in `connection_lost`).
    let out = d.cli(["create", "--backend", "microvm", "--timeout", "30m"]);
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "create failed: {}\nlog:\n{}\nconsoles:\n{}",
        stderr(&out),
        d.log(),
        console(d, "sbx_")
    );
    let id = stdout(&out).trim().to_string();
    assert!(id.starts_with("sbx_"), "create printed {id:?}");
    (id, took)
}

/// The VMM's device metrics of sandbox `id` (frames in and out of virtio-net), for failures.
fn vmm_metrics(d: &Daemon, id: &str) -> String {
    let sock = d
        .home
        .path()
        .join("data/sandboxes")
        .join(id)
        .join("microvm/vmm.sock");
    match belljar_vmm_api::client::ControlClient::connect(&sock, Duration::from_secs(5))
        .and_then(|mut c| c.metrics())
    {
        Ok(m) => format!("{:?}", m.devices),
        Err(e) => format!("{} unreadable: {e}", sock.display()),
    }
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(out), stderr(out)))
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn create_exec_files_and_stop() {
    let host_ip = host_address();
    let dns = dns_server(host_ip);
    let d = Daemon::start_via_cli_with_env(&[("BELLJAR_DNS_SERVERS", &dns.to_string())]);
    let (id, create_took) = create(&d);
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["backend"], "microvm", "{info}");

    // The first command: output, stderr and exit code come back from inside the microVM.
    let t = Instant::now();
    let out = d.cli([
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo hello from $(uname -r); echo oops >&2; exit 3",
    ]);
    let first_took = t.elapsed();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}\nconsole:\n{}",
        stderr(&out),
        console(&d, &id)
    );
    assert!(stdout(&out).starts_with("hello from "), "{}", stdout(&out));
    assert_eq!(stderr(&out), "oops\n");
    eprintln!(
        "microvm: create {create_took:?}, first command {first_took:?}, create -> first command {:?}",
        create_took + first_took
    );
    // A microVM runs its own kernel (the project's guest kernel, not the host's).
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!stdout(&out).contains(host.trim()), "{}", stdout(&out));

    // The network through the frame socket: a server in the microVM answers on a port added
    // while it runs (the handshake, the request and the answer cross virtio-net, the VMM's
    // frame socket and the daemon's stack).
    let out = d.cli([
        "exec",
        "--detach",
        &id,
        "--",
        "perl",
        "-MIO::Socket::INET",
        "-e",
        SERVER,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli(["port", "add", &id, "8000"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // `8000 -> http://127.0.0.1:N/`
    let host_port: u16 = stdout(&out)
        .trim()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port add printed {:?}", stdout(&out)));
    let t = Instant::now();
    let deadline = t + Duration::from_secs(120);
    let body = loop {
        let last = match get(host_port) {
            Ok(body) if body.contains("hello from the microvm") => break body,
            Ok(body) => format!("answered {body:?}"),
            Err(e) => e,
        };
        if Instant::now() > deadline {
            let guest = d.cli([
                "exec",
                &id,
                "--",
                "sh",
                "-c",
                "cat /proc/net/dev /proc/net/arp /proc/net/route /proc/net/tcp /proc/interrupts; ip addr; ps -ef | grep -c perl",
            ]);
            let flows = d.cli(["network", "flows", &id]);
            let metrics = vmm_metrics(&d, &id);
            panic!(
                "the microVM's server on port {host_port} never answered ({last})\nguest:\n{}{}\nflows:\n{}{}\nVMM metrics: {metrics}\nlog:\n{}\nconsole:\n{}",
                stdout(&guest),
                stderr(&guest),
                stdout(&flows),
                stderr(&flows),
                d.log(),
                console(&d, &id)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(body.starts_with("HTTP/1.0 200"), "{body}");
    eprintln!("microvm: forwarded port answered after {:?}", t.elapsed());

    // Outbound: a name through the daemon's DNS (whose upstream is this test's server) and a
    // TCP connection to a server on the host, which only an explicit `subnets.allow` entry
    // opens (the host's own addresses are closed to sandboxes otherwise).
    let server = std::net::TcpListener::bind((host_ip, 0)).unwrap();
    let server_port = server.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut c in server.incoming().flatten() {
            let _ = c.write_all(b"hello from the host\n");
        }
    });
    let out = d.cli([
        "network",
        "set",
        &id,
        "--allow-domain",
        HOST_NAME,
        "--allow-cidr",
        &format!("{host_ip}/32"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let client = format!(
        r#"$s=IO::Socket::INET->new(PeerAddr=>"{HOST_NAME}",PeerPort=>{server_port},Timeout=>30) or die "connect: $@"; print <$s>"#
    );
    let t = Instant::now();
    let out = d.cli([
        "exec",
        &id,
        "--",
        "perl",
        "-MIO::Socket::INET",
        "-e",
        &client,
    ]);
    if !stdout(&out).contains("hello from the host") {
        let flows = d.cli(["network", "flows", &id]);
        panic!(
            "the microVM did not reach {HOST_NAME} ({host_ip}:{server_port}): {}{}\nflows:\n{}{}\nVMM metrics: {}\nlog:\n{}",
            stdout(&out),
            stderr(&out),
            stdout(&flows),
            stderr(&flows),
            vmm_metrics(&d, &id),
            d.log()
        );
    }
    eprintln!(
        "microvm: a DNS lookup and a TCP exchange with the host took {:?}",
        t.elapsed()
    );

    // Files both ways: empty, binary, and 32 MiB (8192 of the guest's 4 KiB rx buffers up,
    // hundreds of credit windows and two HTTP/2 connection windows each way). 100 MiB took
    // 160-220 s under TCG on a loaded machine, a quarter of CI's microVM budget, and proved
    // nothing 32 MiB does not.
    let local = tempfile::tempdir().unwrap();
    let l = |name: &str| local.path().join(name);
    std::fs::write(l("empty"), b"").unwrap();
    random_file(&l("binary.bin"), 70_001);
    random_file(&l("big.bin"), 32 << 20);
    for name in ["empty", "binary.bin", "big.bin"] {
        let t = Instant::now();
        let up = d.cli([
            "cp".as_ref(),
            l(name).as_os_str(),
            format!("{id}:/tmp/").as_ref(),
        ]);
        assert!(
            up.status.success(),
            "upload {name}: {}\nconsoles:\n{}\nlog:\n{}",
            stderr(&up),
            console(&d, &id),
            d.log()
        );
        let back = l(&format!("back-{name}"));
        let down = d.cli([
            "cp".as_ref(),
            format!("{id}:/tmp/{name}").as_ref(),
            back.as_os_str(),
        ]);
        assert!(
            down.status.success(),
            "download {name}: {}\nconsoles:\n{}\nlog:\n{}",
            stderr(&down),
            console(&d, &id),
            d.log()
        );
        assert!(
            same_file(&l(name), &back),
            "{name} changed in the round trip"
        );
        eprintln!("microvm: {name} round trip {:?}", t.elapsed());
    }
    let out = d.cli(["exec", &id, "--", "sha256sum", "/tmp/binary.bin"]);
    let local_sum = std::process::Command::new("sha256sum")
        .arg(l("binary.bin"))
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out).split_whitespace().next(),
        stdout(&local_sum).split_whitespace().next()
    );

    // Stop ends the VMM; a stopped sandbox runs nothing.
    let out = d.cli(["stop", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["status"], "stopped");
    let out = d.cli(["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("(sandbox_not_running)"),
        "{}",
        stderr(&out)
    );
    let out = d.cli(["rm", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn detached_logs_and_pty() {
    let d = Daemon::start_via_cli();
    let (id, _) = create(&d);
    let out = d.cli([
        "exec",
        "--detach",
        &id,
        "--",
        "sh",
        "-c",
        "for i in 1 2 3; do echo line$i; sleep 0.2; done; echo oops >&2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cmd_id = stdout(&out).trim().to_string();
    assert!(cmd_id.starts_with("cmd_"), "{cmd_id}");
    let out = d.cli(["logs", "-f", &id, &cmd_id]);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");
    assert_eq!(stderr(&out), "oops\n");
    let out = d.cli(["logs", &id, &cmd_id]);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");

    // -t runs on a PTY inside the microVM.
    let out = d.cli([
        "exec",
        "-t",
        &id,
        "--",
        "sh",
        "-c",
        "test -t 1 && echo tty; stty size",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "tty\r\n24 80\r\n");

    // Watch: a change inside the microVM reaches the host as an event. The watch is installed
    // in the guest a moment after the stream opens, so files are made until one is seen.
    let client = d.unix();
    let seen = belljar_e2e::block_on(async {
        let mut watch = client.watch(&id, "/tmp", false).await.expect("watch");
        for i in 0..30 {
            let name = format!("/tmp/watched-{i}");
            let run = RunCommand {
                argv: vec!["touch".into(), name.clone()],
                ..Default::default()
            };
            client.run_command(&id, &run).await.expect("touch");
            let found = tokio::time::timeout(Duration::from_secs(3), async {
                while let Some(event) = watch.next().await.expect("watch stream") {
                    if event.path.starts_with("/tmp/watched-") {
                        return true;
                    }
                }
                false
            })
            .await;
            match found {
                Ok(true) => return Some(i),
                Ok(false) => return None, // the stream ended
                Err(_) => continue,       // not installed yet: make another file
            }
        }
        None
    });
    assert!(seen.is_some(), "no watch event from the microVM");
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn daemon_kill_9_adopts_the_running_microvm() {
    let d = Daemon::start_via_cli();
    let (id, _) = create(&d);
    let out = d.cli(["exec", &id, "--", "sh", "-c", "echo kept > /tmp/keep.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli([
        "exec",
        "--detach",
        &id,
        "--",
        "sh",
        "-c",
        "echo start; sleep 3; echo end; exit 6",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cmd_id = stdout(&out).trim().to_string();

    // The VMM runs in its own process group and outlives the daemon; the new daemon adopts it.
    d.kill9();
    d.restart();
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["status"], "running", "{info}\nlog:\n{}", d.log());
    let out = d.cli(["logs", "-f", &id, &cmd_id]);
    assert_eq!(stdout(&out), "start\nend\n", "{}", stderr(&out));
    let out = d.cli(["exec", &id, "--", "cat", "/tmp/keep.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "kept\n");
}

/// The counter a looping command writes in the guest.
async fn counter(c: &Client, id: &str) -> u64 {
    let out = sh_ok(c, id, "cat /tmp/c 2>/dev/null || echo 0").await;
    out.trim().parse().unwrap_or(0)
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn pause_keeps_the_processes_and_idle_pauses() {
    let d = Daemon::start_via_cli();
    let c = d.unix();
    belljar_e2e::block_on(async {
        let a = create_vm(
            &d,
            &c,
            CreateSandbox {
                idle_timeout_ms: Some(8_000),
                ..Default::default()
            },
        )
        .await;
        // A running command keeps the sandbox awake: no idle pause while it counts.
        let loop_cmd = c
            .run_command(
                &a.id,
                &RunCommand {
                    argv: vec![
                        "sh".into(),
                        "-c".into(),
                        "echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.05; done"
                            .into(),
                    ],
                    detached: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let before = eventually(Duration::from_secs(60), "the counter to start", || {
            let c = c.clone();
            let id = a.id.clone();
            async move { Some(counter(&c, &id).await).filter(|v| *v > 0) }
        })
        .await;

        let t = Instant::now();
        let paused = c.pause_sandbox(&a.id).await.unwrap();
        let pause_took = t.elapsed();
        assert_eq!(paused.status, SandboxStatus::Paused);
        assert_eq!(vm_state(&d, &a.id), VmState::Paused);
        let t = Instant::now();
        let resumed = c.resume_sandbox(&a.id).await.unwrap();
        let resume_took = t.elapsed();
        assert_eq!(resumed.status, SandboxStatus::Running);
        assert_eq!(vm_state(&d, &a.id), VmState::Running);
        // The same process counts on from where it was.
        eventually(Duration::from_secs(60), "the counter to go on", || {
            let c = c.clone();
            let id = a.id.clone();
            async move { Some(counter(&c, &id).await).filter(|v| *v > before) }
        })
        .await;
        let cmd = c.command(&a.id, &loop_cmd.id).await.unwrap();
        assert_eq!(cmd.status, belljar_api::CommandStatus::Running, "{cmd:?}");
        eprintln!("microvm: pause {pause_took:?}, resume {resume_took:?}");

        // Without a running command the idle timeout pauses it, and the next use resumes it.
        sh_ok(&c, &a.id, "kill $(cat /tmp/pid)").await;
        let last = counter(&c, &a.id).await;
        let idle = eventually(Duration::from_secs(120), "the idle pause", || {
            let c = c.clone();
            let id = a.id.clone();
            async move {
                let s = c.sandbox(&id).await.ok()?;
                (s.status == SandboxStatus::Paused).then_some(s)
            }
        })
        .await;
        assert_eq!(idle.status_reason.as_deref(), Some("idle"));
        assert_eq!(vm_state(&d, &a.id), VmState::Paused);
        assert_eq!(counter(&c, &a.id).await, last);
        assert_eq!(
            c.sandbox(&a.id).await.unwrap().status,
            SandboxStatus::Running
        );
        assert_eq!(vm_state(&d, &a.id), VmState::Running);
    });
}

/// The processes whose command line names `id` (a sandbox's VMM is given its directory).
fn processes_naming(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(id) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// A microVM as a desktop user runs one: the daemon is an ordinary user whose only privilege
/// is membership of `/dev/kvm`'s group (checked, not assumed). One microVM is created, runs a
/// command and is deleted, leaving no VMM and no state behind. `tests/microvm/rootless.sh`
/// runs it as its user; the root job (`job.sh`) skips it.
#[test]
#[ignore = "needs KVM as a kvm group member: run by tests/microvm/rootless.sh in the L1 harness"]
fn a_kvm_group_member_creates_execs_and_deletes() {
    use std::os::unix::fs::MetadataExt;
    assert!(
        !nix::unistd::Uid::effective().is_root(),
        "run this as an ordinary user"
    );
    let kvm = std::fs::metadata("/dev/kvm").expect("/dev/kvm");
    assert_eq!(kvm.mode() & 0o007, 0, "/dev/kvm is open to everyone");
    let groups = nix::unistd::getgroups().unwrap();
    assert!(
        groups.contains(&nix::unistd::Gid::from_raw(kvm.gid())),
        "not a member of /dev/kvm's group {}",
        kvm.gid()
    );
    let d = Daemon::start_via_cli();
    let (id, create_took) = create(&d);
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["backend"], "microvm", "{info}");
    let t = Instant::now();
    let out = d.cli(["exec", &id, "--", "sh", "-c", "id -u; uname -r"]);
    let first_took = t.elapsed();
    assert!(
        out.status.success(),
        "{}\nlog:\n{}\nconsole:\n{}",
        stderr(&out),
        d.log(),
        console(&d, &id)
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!stdout(&out).contains(host.trim()), "{}", stdout(&out));
    eprintln!(
        "microvm as a kvm group member: create {create_took:?}, first command {first_took:?} ({})",
        stdout(&out).replace('\n', " ")
    );
    assert!(!processes_naming(&id).is_empty(), "no VMM names {id}");
    let out = d.cli(["rm", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let gone = d.cli(["info", &id]);
    assert!(!gone.status.success(), "still known after delete");
    // The delete answers once the sandbox is gone for the API; the VMM's end and the state
    // directory's removal follow in the background teardown: give them a deadline.
    let state = d.paths.data.join("sandboxes").join(&id);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_naming(&id).is_empty() || state.exists() {
        assert!(
            Instant::now() < deadline,
            "after delete: still running {:?}, state directory there: {}",
            processes_naming(&id),
            state.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
