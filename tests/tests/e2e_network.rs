//! End to end: a namespace sandbox's network through the daemon's userspace stack, against a
//! private test "internet". The test builds two network namespaces joined by a veth pair:
//! the daemon's (203.0.113.100) and the internet's (203.0.113.1 and .9: a DNS server for
//! `*.test` names, plain HTTP on :80, TLS on :443 with a test CA for several names). The
//! daemon runs inside the first (it inherits the test thread's namespace), so nothing here
//! leaves the namespaces the test made. Needs root (CI runs it as root).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command as Process;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use belljar_api::{
    AddPort, BackendChoice, CreateSandbox, ErrorCode, FlowVerdict, ForkSandbox, NetworkFlow,
    NetworkPolicy, RunCommand, Sandbox, SandboxStatus,
};
use belljar_client::Client;
use belljar_client::commands::log_bytes;
use belljar_e2e::{Daemon, block_on, eventually, microvm};

const INET: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const INET2: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const HOST: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 100);
const NAMES: &[&str] = &["a.test", "www.b.test", "sub.c.test", "c.test", "api.test"];
const SECRET: &str = "Bearer s3cret-XYZ";

fn ip(args: &[&str]) {
    let out = Process::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The two namespaces and the veth between them; deleted on drop.
struct TestNet {
    daemon_ns: String,
    inet_ns: String,
}

impl TestNet {
    fn new() -> Self {
        let id = std::process::id();
        let (d, i) = (format!("bjn-d-{id}"), format!("bjn-i-{id}"));
        let n = Self {
            daemon_ns: d.clone(),
            inet_ns: i.clone(),
        };
        ip(&["netns", "add", &d]);
        ip(&["netns", "add", &i]);
        ip(&[
            "link", "add", "bjn-d", "netns", &d, "type", "veth", "peer", "name", "bjn-i", "netns",
            &i,
        ]);
        ip(&[
            "-n",
            &d,
            "addr",
            "add",
            &format!("{HOST}/24"),
            "dev",
            "bjn-d",
        ]);
        ip(&[
            "-n",
            &i,
            "addr",
            "add",
            &format!("{INET}/24"),
            "dev",
            "bjn-i",
        ]);
        ip(&[
            "-n",
            &i,
            "addr",
            "add",
            &format!("{INET2}/24"),
            "dev",
            "bjn-i",
        ]);
        for (ns, dev) in [(&d, "bjn-d"), (&i, "bjn-i")] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        n
    }

    /// Moves the calling thread (and the threads and processes it starts) into `ns`.
    fn enter(ns: &str) {
        let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
        nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for ns in [&self.daemon_ns, &self.inet_ns] {
            let _ = Process::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Serves one HTTP/1.1 request: `host=<Host> auth=brokered|none`, or on `/slow` a byte every
/// 100 ms for a minute.
fn serve_http(mut conn: impl Read + Write, slow: &AtomicUsize) {
    let mut reader = BufReader::new(&mut conn);
    let (mut host, mut auth, mut path) = (String::new(), "-".to_owned(), String::new());
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 0 {
        let l = line.trim_end().to_owned();
        line.clear();
        if l.is_empty() {
            break;
        }
        if path.is_empty() {
            path = l.split(' ').nth(1).unwrap_or("/").to_owned();
        } else if let Some((k, v)) = l.split_once(':') {
            match k.to_ascii_lowercase().as_str() {
                "host" => host = v.trim().to_owned(),
                "authorization" => auth = v.trim().to_owned(),
                _ => {}
            }
        }
    }
    drop(reader);
    if path == "/slow" {
        slow.fetch_add(1, Ordering::SeqCst);
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
        for _ in 0..600 {
            if conn.write_all(b".").and_then(|()| conn.flush()).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        return;
    }
    // The server says whether it got the secret, never the secret itself (the sandbox reads
    // this answer).
    let auth = if auth == SECRET { "brokered" } else { "none" };
    let body = format!("host={host} auth={auth}\n");
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.flush();
}

/// Starts the internet's servers (threads inside its namespace); returns the test CA (PEM)
/// and the counter of `/slow` requests.
fn start_internet(net: &TestNet) -> (String, Arc<AtomicUsize>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let tls = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap(),
    );
    let slow = Arc::new(AtomicUsize::new(0));
    let (ns, slow2) = (net.inet_ns.clone(), slow.clone());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        TestNet::enter(&ns);
        let dns = UdpSocket::bind((INET, 53)).unwrap();
        let http = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 80)).unwrap();
        let https = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 443)).unwrap();
        ready_tx.send(()).unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = dns.recv_from(&mut buf) {
                if let Some(r) = belljar_network::testing::dns_answer(&buf[..n], |name| {
                    NAMES.contains(&name).then_some(INET)
                }) {
                    let _ = dns.send_to(&r, from);
                }
            }
        });
        let slow3 = slow2.clone();
        std::thread::spawn(move || {
            for conn in https.incoming().flatten() {
                let (tls, slow) = (tls.clone(), slow3.clone());
                std::thread::spawn(move || {
                    let server = rustls::ServerConnection::new(tls).unwrap();
                    serve_http(rustls::StreamOwned::new(server, conn), &slow);
                });
            }
        });
        for conn in http.incoming().flatten() {
            let slow = slow2.clone();
            std::thread::spawn(move || serve_http(conn, &slow));
        }
    });
    ready_rx.recv().expect("the internet's servers started");
    (ca.pem(), slow)
}

/// Runs `script` as root in the sandbox: exit code and stdout+stderr.
async fn run(c: &Client, id: &str, script: &str) -> (i32, String) {
    let req = RunCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        sudo: true,
        ..Default::default()
    };
    let cmd = c.run_command(id, &req).await.expect("run command");
    let cmd = c.wait_command(id, &cmd.id).await.expect("wait");
    let mut lines = c.command_logs(id, &cmd.id, false).await.expect("logs");
    let mut out = Vec::new();
    while let Some(line) = lines.next().await.unwrap() {
        out.extend(log_bytes(&line));
    }
    (
        cmd.exit_code.unwrap_or(-1),
        String::from_utf8_lossy(&out).into_owned(),
    )
}

fn policy(json: &str) -> NetworkPolicy {
    serde_json::from_str(json).unwrap()
}

/// Whether the sandbox reaches `url` (`curl -k`: the firewall is under test, not the server's
/// certificate).
async fn reaches(c: &Client, id: &str, url: &str) -> bool {
    let (code, out) = run(c, id, &format!("curl -ksS -m 5 {url}")).await;
    code == 0 && out.contains("host=")
}

async fn flows(c: &Client, id: &str) -> Vec<NetworkFlow> {
    let mut s = c.network_flows(id, false).await.expect("flows");
    let mut all = Vec::new();
    while let Some(f) = s.next().await.unwrap() {
        all.push(f);
    }
    all
}

#[test]
fn namespace_sandboxes_reach_the_test_internet_through_the_firewall() {
    through_the_firewall(BackendChoice::Namespace);
}

/// The same on microVMs: the guest's frames reach the daemon's stack through the VMM's frame
/// socket, so the policy, brokering, ports and `kill -9` must behave alike.
#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn microvm_sandboxes_reach_the_test_internet_through_the_firewall() {
    through_the_firewall(BackendChoice::Microvm);
}

/// A sandbox of `backend`: a microVM gets 512 MiB (L1 has 3 GiB) and 30 minutes (a nested
/// microVM can spend minutes in this test).
async fn create(d: &Daemon, c: &Client, backend: BackendChoice, req: CreateSandbox) -> Sandbox {
    let req = CreateSandbox {
        backend: Some(backend),
        ..req
    };
    if backend == BackendChoice::Microvm {
        let req = CreateSandbox {
            memory_mib: req.memory_mib.or(microvm::small().memory_mib),
            ..req
        };
        microvm::create_vm(d, c, req).await
    } else {
        d.create(c, req).await
    }
}

fn through_the_firewall(backend: BackendChoice) {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "this test needs root"
    );
    let vm = backend == BackendChoice::Microvm;
    let net = TestNet::new();
    let (test_ca, slow) = start_internet(&net);
    TestNet::enter(&net.daemon_ns);
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), &test_ca).unwrap();
    // Something on the daemon's host that no sandbox may reach.
    let host_service = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let host_port = host_service.local_addr().unwrap().port();
    let d = Daemon::start_with_env(&[
        ("BELLJAR_DNS_SERVERS", &format!("{INET}:53")),
        ("BELLJAR_BROKER_CA", ca_file.path().to_str().unwrap()),
    ]);
    let c = d.unix();
    block_on(async {
        // Bad input: 400 naming the field, before anything starts.
        for (body, field) in [
            (
                r#"{"network_policy":{"allow":["*.*.com"]}}"#,
                "network_policy.allow",
            ),
            (
                r#"{"network_policy":{"allow":["*example.com"]}}"#,
                "network_policy.allow",
            ),
            (
                r#"{"network_policy":{"allow":["a..com"]}}"#,
                "network_policy.allow",
            ),
            (
                r#"{"network_policy":{"subnets":{"deny":["10.0.0.0/33"]}}}"#,
                "network_policy.subnets.deny",
            ),
            (r#"{"ports":[70000]}"#, "ports[0]"),
        ] {
            let req: CreateSandbox = serde_json::from_str(body).unwrap();
            let e = c.create_sandbox(&req).await.expect_err(body);
            assert_eq!(e.code(), ErrorCode::BadRequest.to_string(), "{body}: {e}");
            assert!(e.to_string().contains(field), "{body}: {e}");
        }

        let req = CreateSandbox {
            ports: Some(vec![8000]),
            ..Default::default()
        };
        let s = create(&d, &c, backend, req).await;
        let id = s.id.clone();
        assert_eq!(s.network_policy, Some(NetworkPolicy::default()));

        // allow-all: DNS, HTTP by name, TLS by name.
        let (code, out) = run(&c, &id, "getent hosts a.test").await;
        assert_eq!(code, 0, "{out}\n{}", d.log());
        assert!(out.starts_with("203.0.113.1"), "{out}");
        assert!(reaches(&c, &id, "http://a.test/").await, "{}", d.log());
        assert!(reaches(&c, &id, "https://sub.c.test/").await);
        // eth0 is a tap: the largest frames, far fewer for the stack per byte (at 1500 a
        // download ran at a sixth of pasta's speed). A microVM's virtio-net keeps Ethernet's.
        let (_, mtu) = run(&c, &id, "cat /sys/class/net/eth0/mtu").await;
        assert_eq!(mtu.trim(), if vm { "1500" } else { "65520" });
        // Commands cannot reconfigure the host's network (CAP_NET_ADMIN is gone). A microVM's
        // kernel is its own: its root may change its eth0, which is its own link to its own
        // stack in the daemon, where the policy holds either way.
        let (_, caps) = run(&c, &id, "grep CapBnd /proc/self/status").await;
        let bnd =
            u64::from_str_radix(caps.trim().trim_start_matches("CapBnd:").trim(), 16).unwrap();
        assert_eq!(bnd & (1 << 12) != 0, vm, "{caps}");
        // Never the host itself, nor the gateway (where the daemon would be).
        assert!(!reaches(&c, &id, &format!("http://{HOST}:{host_port}/")).await);
        let daemon_port = d.addr().port();
        assert!(!reaches(&c, &id, &format!("http://10.0.2.2:{daemon_port}/")).await);

        // Exposed port: a server in the sandbox, reached from the host.
        let ports = c.ports(&id).await.unwrap().ports;
        assert_eq!(ports.len(), 1);
        let mapped = ports[0].host_port;
        let server = "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>8000,Listen=>5,ReuseAddr=>1) or die; while($c=$s->accept){print $c \"from-sandbox\\n\"; close $c}'";
        let bg = RunCommand {
            argv: vec!["sh".into(), "-c".into(), server.into()],
            detached: true,
            ..Default::default()
        };
        c.run_command(&id, &bg).await.unwrap();
        let from_sandbox = || {
            let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, mapped)).ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            text.contains("from-sandbox").then_some(())
        };
        eventually(
            Duration::from_secs(20),
            "the forwarded port answers",
            || async { from_sandbox() },
        )
        .await;
        // A host port already taken is refused, naming the field.
        let e = c
            .add_port(
                &id,
                &AddPort {
                    port: 9000,
                    host_port: Some(u32::from(mapped)),
                },
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("host_port"), "{e}");

        // deny-all, DNS included.
        c.set_network_policy(&id, &policy(r#""deny-all""#))
            .await
            .unwrap();
        assert_ne!(run(&c, &id, "getent hosts a.test").await.0, 0);
        assert!(!reaches(&c, &id, &format!("http://{INET}/")).await);

        // Domains: `*.c.test` (not its parent), `www.*.test` (one middle label).
        c.set_network_policy(&id, &policy(r#"{"allow":["*.c.test","www.*.test"]}"#))
            .await
            .unwrap();
        assert!(reaches(&c, &id, "https://sub.c.test/").await);
        assert!(
            reaches(&c, &id, "http://sub.c.test/").await,
            "plain HTTP by Host"
        );
        assert!(reaches(&c, &id, "https://www.b.test/").await);
        assert!(!reaches(&c, &id, "https://c.test/").await);
        assert!(!reaches(&c, &id, "https://a.test/").await);

        // Subnets: allow a range, deny one address in it (deny wins). By PUT on the policy's
        // own route, which replaces it whole: the domain list above is gone, not merged.
        let subnets = policy(r#"{"subnets":{"allow":["203.0.113.0/24"],"deny":["203.0.113.9"]}}"#);
        let info = c.put_network_policy(&id, &subnets).await.unwrap();
        assert_eq!(info.policy, subnets);
        assert_eq!(c.network(&id).await.unwrap().policy, subnets);
        // A bad policy is refused naming the field, and the one in force stays.
        let e = c
            .put_network_policy(&id, &policy(r#"{"allow":["*.*.test"]}"#))
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::BadRequest.to_string(), "{e}");
        assert!(e.to_string().contains("network_policy.allow"), "{e}");
        assert_eq!(c.network(&id).await.unwrap().policy, subnets);
        assert!(reaches(&c, &id, &format!("http://{INET}/")).await);
        assert!(!reaches(&c, &id, &format!("http://{INET2}/")).await);

        // A new policy cuts an open flow it denies.
        c.set_network_policy(&id, &policy(r#""allow-all""#))
            .await
            .unwrap();
        let long = RunCommand {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "curl -sS -m 60 http://a.test/slow >/dev/null".into(),
            ],
            detached: true,
            ..Default::default()
        };
        let long = c.run_command(&id, &long).await.unwrap();
        eventually(
            Duration::from_secs(20),
            "the slow download starts",
            || async { (slow.load(Ordering::SeqCst) > 0).then_some(()) },
        )
        .await;
        let cut_at = Instant::now();
        c.set_network_policy(&id, &policy(r#""deny-all""#))
            .await
            .unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(20), c.wait_command(&id, &long.id))
            .await
            .expect("the denied flow was not cut")
            .unwrap();
        assert_ne!(ended.exit_code, Some(0));
        assert!(cut_at.elapsed() < Duration::from_secs(20));

        // Credential brokering: the server sees the header, the sandbox never the secret.
        c.set_network_policy(
            &id,
            &policy(&format!(
                r#"{{"allow":{{"api.test":[{{"transform":[{{"headers":{{"Authorization":"{SECRET}"}}}}]}}]}}}}"#
            )),
        )
        .await
        .unwrap();
        let (code, out) = run(&c, &id, "curl -sS -m 10 https://api.test/").await;
        assert_eq!(code, 0, "{out}\n{}", d.log());
        assert!(out.contains("auth=brokered"), "{out}");
        let (_, out) = run(
            &c,
            &id,
            "grep -rsl -e 's3cret-XY[Z]' /etc /root /tmp /run /home /usr/local /proc/[0-9]*/environ /proc/[0-9]*/cmdline; true",
        )
        .await;
        assert_eq!(out, "", "the secret is visible in the sandbox");
        let shown = c.sandbox(&id).await.unwrap();
        assert!(!serde_json::to_string(&shown).unwrap().contains("s3cret"));

        // The flow log: denied and allowed flows, with names and bytes.
        let log = flows(&c, &id).await;
        assert!(
            log.iter()
                .any(|f| f.verdict == FlowVerdict::Denied && f.name.as_deref() == Some("a.test")),
            "{log:#?}"
        );
        assert!(
            log.iter()
                .any(|f| f.verdict == FlowVerdict::Allowed && f.bytes_in > 0)
        );
        let kept = log.len();

        // kill -9: the sandbox keeps its network; new flows work once the daemon is back.
        c.set_network_policy(&id, &policy(r#""allow-all""#))
            .await
            .unwrap();
        d.kill9();
        d.restart();
        let c = d.unix();
        assert_eq!(c.sandbox(&id).await.unwrap().status, SandboxStatus::Running);
        assert!(reaches(&c, &id, "http://a.test/").await, "{}", d.log());
        assert_eq!(c.ports(&id).await.unwrap().ports[0].host_port, mapped);
        eventually(
            Duration::from_secs(20),
            "the port answers after the restart",
            || async { from_sandbox() },
        )
        .await;
        assert!(flows(&c, &id).await.len() > kept, "the flow log was lost");
        let usage = c.network(&id).await.unwrap().usage;
        assert!(
            usage.ingress_bytes > 0 && usage.egress_bytes > 0,
            "{usage:?}"
        );

        // The CLI: policy flags at create, `network set|show|flows`, `port add|ls|rm`.
        let backend_name = if vm { "microvm" } else { "namespace" };
        let out = d.cli([
            "create",
            "--backend",
            backend_name,
            "--memory",
            "512",
            "--timeout",
            "30m",
            "--allow-domain",
            "a.test",
            "--deny-cidr",
            "203.0.113.9/32",
            "--broker",
            "api.test:Authorization=Bearer cli-secret",
            "--port",
            "8080",
            "--json",
        ]);
        assert!(out.status.success(), "{}", belljar_e2e::stderr(&out));
        let made: belljar_api::Sandbox = serde_json::from_slice(&out.stdout).unwrap();
        let shown = serde_json::to_string(&made.network_policy).unwrap();
        assert!(
            shown.contains("a.test") && shown.contains("203.0.113.9/32"),
            "{shown}"
        );
        assert!(!shown.contains("cli-secret"), "{shown}");
        assert!(reaches(&c, &made.id, "https://a.test/").await);
        assert!(!reaches(&c, &made.id, "https://sub.c.test/").await);
        let out = d.cli(["network", "set", &made.id, "--network", "deny-all"]);
        assert!(out.status.success(), "{}", belljar_e2e::stderr(&out));
        assert!(!reaches(&c, &made.id, "https://a.test/").await);
        let out = d.cli(["network", "show", &made.id]);
        assert!(belljar_e2e::stdout(&out).contains("deny-all"), "{out:?}");
        let out = d.cli(["network", "flows", &made.id]);
        let text = belljar_e2e::stdout(&out);
        assert!(
            text.contains("denied") && text.contains("allowed"),
            "{text}"
        );
        let out = d.cli(["port", "ls", &made.id]);
        assert!(
            belljar_e2e::stdout(&out).starts_with("8080 -> http://127.0.0.1:"),
            "{out:?}"
        );
        let out = d.cli(["port", "add", &made.id, "9090"]);
        assert!(
            belljar_e2e::stdout(&out).starts_with("9090 -> http://127.0.0.1:"),
            "{out:?}"
        );
        assert!(d.cli(["port", "rm", &made.id, "8080"]).status.success());
        let left = c.ports(&made.id).await.unwrap().ports;
        assert_eq!(left.iter().map(|p| p.port).collect::<Vec<_>>(), [9090]);
        // A fork exposes the source's ports again, each on a host port of its own (the source
        // keeps its mapping), and carries its policy.
        let fork = c
            .fork_sandbox(&made.id, &ForkSandbox::default())
            .await
            .unwrap();
        let forked = c.ports(&fork.id).await.unwrap().ports;
        assert_eq!(forked.iter().map(|p| p.port).collect::<Vec<_>>(), [9090]);
        assert_ne!(forked[0].host_port, left[0].host_port);
        assert_eq!(c.ports(&made.id).await.unwrap().ports, left);
        assert!(!reaches(&c, &fork.id, "https://a.test/").await, "deny-all");
        c.delete_sandbox(&fork.id).await.unwrap();
        let out = d.cli(["network", "set", &made.id, "--allow-domain", "*.*.test"]);
        assert!(!out.status.success());
        assert!(
            belljar_e2e::stderr(&out).contains("network_policy.allow"),
            "{out:?}"
        );
    });
    drop(d);
    drop(net);
}
