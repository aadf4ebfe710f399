//! The agent outside plain mode, as far as a test can take it without touching the host:
//! namespace mode as PID 1 of fresh PID, mount, UTS and network namespaces (private mount
//! propagation, so nothing it mounts is seen outside), and the AF_VSOCK listener.

mod common;

use std::time::Duration;

use belljar_agent_proto::ShutdownAction;
use common::Agent;

fn have_unshare() -> bool {
    common::is_root()
        && std::process::Command::new("unshare")
            .args([
                "--mount",
                "--pid",
                "--fork",
                "--uts",
                "--net",
                "--propagation",
                "private",
                "true",
            ])
            .status()
            .is_ok_and(|s| s.success())
}

#[tokio::test]
async fn namespace_mode_is_init_of_its_namespaces() {
    if !have_unshare() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root with unshare"
        );
        eprintln!("not run: needs root and unshare");
        return;
    }
    let wrapper = [
        "unshare",
        "--mount",
        "--pid",
        "--fork",
        "--uts",
        "--net",
        "--propagation",
        "private",
    ];
    let mut agent = Agent::start_wrapped(&wrapper, "namespace", &["--hostname", "nsbox"]).await;
    let info = agent.client.health().await.unwrap();
    assert_eq!(info.pid, 1);
    assert_eq!(info.hostname, "nsbox");

    // /proc is the namespace's own, and orphans are reaped by the agent as init.
    let (cmd, out, _) = agent
        .sh("(sleep 0.2 &) ; sleep 0.6; for s in /proc/[0-9]*/stat; do cat $s; done; hostname")
        .await;
    assert_eq!(cmd.exit_code, Some(0));
    assert!(
        out.lines().any(|l| l.starts_with("1 (belljar-agent) ")),
        "{out}"
    );
    assert!(!out.contains(") Z "), "a zombie was left: {out}");
    assert!(out.ends_with("nsbox\n"), "{out}");

    // Loopback is up in the fresh network namespace.
    let (cmd, out, err) = agent
        .sh("command -v python3 >/dev/null || { echo lo-ok; exit 0; }; python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); socket.create_connection(s.getsockname()); print('lo-ok')\"")
        .await;
    assert_eq!((cmd.exit_code, out.as_str()), (Some(0), "lo-ok\n"), "{err}");

    // A PTY works with the namespace's own devpts instance.
    let start = belljar_agent_proto::StartCommand {
        argv: ["/bin/sh", "-c", "tty"].map(String::from).to_vec(),
        pty: Some(belljar_agent_proto::PtySize { rows: 10, cols: 20 }),
        ..Default::default()
    };
    let (cmd, lines) = agent.run(start).await;
    assert_eq!(cmd.exit_code, Some(0));
    assert!(String::from_utf8_lossy(&common::split(&lines).0).starts_with("/dev/pts/"));

    // Shutting down kills everything in the namespace and ends it.
    let sleeper = agent
        .client
        .start_command(&common::argv(&["sleep", "100"]))
        .await
        .unwrap();
    agent
        .client
        .shutdown(ShutdownAction::Poweroff)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while agent.child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "namespace did not end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sleeper.pid > 0);
}

#[test]
fn listens_on_vsock() {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    if socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI machines have AF_VSOCK"
        );
        eprintln!("not run: no AF_VSOCK here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = 20000 + (std::process::id() % 20000);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_belljar-agent"))
        .args(["--mode", "plain", "--listen", &format!("vsock:{port}")])
        .arg("--state-dir")
        .arg(dir.path())
        .env("BELLJAR_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The port is bound once the agent says it listens; its log ends early if it exits.
    let (said, heard) = std::sync::mpsc::channel();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut log = Vec::new();
    while !log
        .iter()
        .any(|l: &String| l.contains("belljar-agent listening"))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match heard.recv_timeout(left) {
            Ok(line) => log.push(line),
            Err(e) => panic!("the agent did not listen on vsock ({e}): {log:?}"),
        }
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "agent exited on a vsock listen"
    );
    // The port is taken now: a second bind fails.
    let fd = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    let addr = nix::sys::socket::VsockAddr::new(libc::VMADDR_CID_ANY, port);
    let second = nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(second, Err(nix::errno::Errno::EADDRINUSE));
}

/// The client's hybrid vsock path end to end: a stand-in for the VMM's socket that speaks the
/// `CONNECT`/`OK` handshake and then splices bytes to the agent, as the VMM splices them to the
/// guest's AF_VSOCK port.
#[tokio::test]
async fn client_connects_through_a_hybrid_vsock_socket() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let agent = Agent::start().await;
    let hybrid = agent.dir.path().join("vsock.sock");
    let listener = tokio::net::UnixListener::bind(&hybrid).unwrap();
    let target = agent.socket.clone();
    tokio::spawn(async move {
        let (mut host, _) = listener.accept().await.unwrap();
        let mut line = Vec::new();
        loop {
            let b = host.read_u8().await.unwrap();
            if b == b'\n' {
                break;
            }
            line.push(b);
        }
        assert_eq!(line, b"CONNECT 1024");
        host.write_all(b"OK 1073741824\n").await.unwrap();
        let mut guest = tokio::net::UnixStream::connect(target).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut host, &mut guest).await;
    });
    let client = belljar_agent_proto::client::AgentClient::connect_hybrid_vsock(&hybrid, 1024)
        .await
        .unwrap();
    assert_eq!(client.health().await.unwrap().pid, agent.pid());
    let started = client
        .start_command(&common::argv(&["echo", "via vsock"]))
        .await
        .unwrap();
    let done = client.wait_command(&started.id).await.unwrap();
    assert_eq!(done.exit_code, Some(0));
}
