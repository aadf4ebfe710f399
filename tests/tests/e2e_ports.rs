//! A rootless or root namespace sandbox's network end to end, through the daemon's userspace
//! stack and the sandbox's tap: a forwarded port reaches a server inside (the host connects to
//! `127.0.0.1:<host_port>`), DNS goes through the daemon to the host's resolver (here the
//! test's own), and the firewall denies a subnet and then everything. The first test makes the
//! daemon open the tap through its attaching child (`BELLJAR_TAP_VIA_CHILD=1`), the path a
//! rootless daemon always takes, so that root runs it too; the second takes the default path
//! of whoever runs it. `tests/microvm/rootless.sh` runs both as an ordinary user in the
//! harness's L1 guest. (`e2e_network` covers the firewall in depth, as root.)

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
        ("BELLJAR_LOG", "belljard=debug,belljar_network=trace"),
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

/// The address the test's DNS server gives `svc.test` (TEST-NET-2: nothing answers there).
const SVC_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 51, 100, 7);

/// A DNS server on the host's loopback for the daemon to forward to (`BELLJAR_DNS_SERVERS`):
/// `svc.test` is [`SVC_ADDR`], every other name NXDOMAIN. Returns its address.
fn dns_server() -> std::net::SocketAddr {
    let socket = std::net::UdpSocket::bind(("127.0.0.1", 0)).expect("bind the DNS server");
    let addr = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            if let Some(answer) = belljar_network::testing::dns_answer(&buf[..n], |name| {
                (name == "svc.test").then_some(SVC_ADDR)
            }) {
                let _ = socket.send_to(&answer, from);
            }
        }
    });
    addr
}

/// The sandbox's DNS is the daemon (which forwards to the host's resolver, here the test's),
/// and the firewall decides each flow: a denied subnet's connection is refused and logged
/// as denied, and `deny-all` takes DNS away too.
#[test]
fn dns_goes_through_the_daemon_and_a_deny_policy_stops_a_flow() {
    require_image("base");
    let dns = dns_server();
    let daemon = Daemon::start_with_env(&[
        ("BELLJAR_DNS_SERVERS", &dns.to_string()),
        ("BELLJAR_LOG", "belljard=debug,belljar_network=trace"),
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
        let id = s.id.as_str();
        let resolv = belljar_e2e::sh_ok(&client, id, "cat /etc/resolv.conf").await;
        assert!(resolv.contains("nameserver 10.0.2.2"), "{resolv}");
        let (code, out) = belljar_e2e::sh(&client, id, "getent ahostsv4 svc.test").await;
        assert_eq!(code, 0, "{out}\ndaemon log:\n{}", daemon.log());
        assert!(out.starts_with(&SVC_ADDR.to_string()), "{out}");

        client
            .set_network_policy(
                id,
                &serde_json::from_str(r#"{"subnets":{"deny":["198.51.100.0/24"]}}"#).unwrap(),
            )
            .await
            .expect("deny the subnet");
        let (code, out) = belljar_e2e::sh(&client, id, "curl -sS -m 5 http://svc.test/").await;
        assert_ne!(code, 0, "{out}");
        let mut flows = client.network_flows(id, false).await.expect("flows");
        let mut denied = false;
        while let Some(f) = flows.next().await.expect("a flow") {
            denied |= f.dst.starts_with(&SVC_ADDR.to_string())
                && f.verdict == belljar_api::FlowVerdict::Denied;
        }
        assert!(denied, "no denied flow to {SVC_ADDR}");

        client
            .set_network_policy(id, &serde_json::from_str(r#""deny-all""#).unwrap())
            .await
            .expect("deny all");
        let (code, out) = belljar_e2e::sh(&client, id, "getent ahostsv4 svc.test").await;
        assert_ne!(code, 0, "deny-all still resolves: {out}");
        client.delete_sandbox(id).await.expect("delete");
    });
}
