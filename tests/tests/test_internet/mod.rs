//! The private test "internet" of `e2e_network`: two network namespaces joined by a veth
//! pair (the daemon's, 203.0.113.100, and the internet's, 203.0.113.1 and .9), a DNS server
//! for `*.test` names, plain HTTP on :80 and TLS on :443 with a test CA for several names.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command as Process;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub const INET: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
pub const INET2: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
pub const HOST: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 100);
pub const NAMES: &[&str] = &["a.test", "www.b.test", "sub.c.test", "c.test", "api.test"];
pub const SECRET: &str = "Bearer s3cret-XYZ";

fn ip(args: &[&str]) {
    let out = Process::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The two namespaces and the veth between them; deleted on drop.
pub struct TestNet {
    pub daemon_ns: String,
    pub inet_ns: String,
}

impl TestNet {
    pub fn new() -> Self {
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
    pub fn enter(ns: &str) {
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
#[allow(
    deprecated,
    reason = "ring's provider, deprecated from rustls 0.23.48 for lacking post-quantum key exchange; no lockfile is committed, so builds take either version"
)]
pub fn start_internet(net: &TestNet) -> (String, Arc<AtomicUsize>) {
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
