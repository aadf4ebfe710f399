//! A forwarded port reaches a server inside a namespace sandbox: the host connects to
//! `127.0.0.1:<host_port>`, the daemon's userspace stack carries it through the sandbox's tap.
//! It runs as root, with the daemon told to open the tap through its attaching child
//! (`BELLJAR_TAP_VIA_CHILD=1`, the path a rootless daemon needs; as an ordinary user in the
//! harness's L1 guest the tap attached but no frame flowed, so rootless.sh does not run it
//! yet). (`e2e_network` covers the root thread's path, with the firewall.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use belljar_api::{AddPort, CreateSandbox, RunCommand};
use belljar_e2e::{Daemon, block_on, require_image};

const SERVER: &str = r#"$s=IO::Socket::INET->new(LocalPort=>8000,Listen=>5,ReuseAddr=>1) or die "listen: $!"; while($c=$s->accept){while(<$c>){last if /^\r?$/} print $c "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello from the sandbox\n"; close $c}"#;

fn get(host_port: u16) -> Option<String> {
    let mut c = TcpStream::connect(("127.0.0.1", host_port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    c.read_to_string(&mut body).ok()?;
    Some(body)
}

#[test]
fn a_server_in_the_sandbox_answers_on_its_forwarded_port() {
    require_image("base");
    let daemon = Daemon::start_with_env(&[
        ("BELLJAR_TAP_VIA_CHILD", "1"),
        ("BELLJAR_LOG", "belljard=debug,belljar_network=debug"),
    ]);
    let client = daemon.unix();
    block_on(async {
        let s = daemon
            .create(
                &client,
                CreateSandbox {
                    image: Some("base".into()),
                    ..Default::default()
                },
            )
            .await;
        let server = RunCommand {
            argv: vec![
                "perl".into(),
                "-MIO::Socket::INET".into(),
                "-e".into(),
                SERVER.into(),
            ],
            detached: true,
            ..Default::default()
        };
        client
            .run_command(&s.id, &server)
            .await
            .expect("start the server");
        let port = client
            .add_port(
                &s.id,
                &AddPort {
                    port: 8000,
                    host_port: None,
                },
            )
            .await
            .expect("forward port 8000");
        assert_eq!(port.url, format!("http://127.0.0.1:{}/", port.host_port));
        let host_port = port.host_port;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let body = loop {
            let got = tokio::task::spawn_blocking(move || get(host_port))
                .await
                .ok()
                .flatten()
                .filter(|b| b.contains("hello from the sandbox"));
            if let Some(body) = got {
                break body;
            }
            if std::time::Instant::now() > deadline {
                // What the sandbox's network looked like, for the failure message.
                let seen = belljar_e2e::sh(
                    &client,
                    &s.id,
                    "cat /proc/net/dev; for f in operstate flags address mtu; do echo $f=$(cat /sys/class/net/eth0/$f); done; \
                     ip -o addr 2>&1; ip route 2>&1; cat /etc/resolv.conf; cat /proc/net/tcp",
                )
                .await;
                let flows = client.network(&s.id).await;
                panic!(
                    "no answer behind 127.0.0.1:{host_port} in 30 s\nsandbox: {seen:?}\nflows: {flows:?}\ndaemon log:\n{}",
                    daemon.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
        client.delete_sandbox(&s.id).await.expect("delete");
    });
    let log = daemon.log();
    assert!(!log.contains("sent no tap"), "{log}");
}
