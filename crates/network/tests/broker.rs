//! Credential brokering end to end: the kernel guest speaks TLS to a domain whose policy entry
//! sets a header; the daemon terminates it with the sandbox's CA, sets the header and talks TLS
//! to the real server (certificate from a test CA, verified). The server sees the secret; the
//! guest never does, and a request naming another host than the brokered domain never reaches
//! the server at all.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;

use belljar_network::config::GATEWAY_V4;
use belljar_network::{Broker, DomainPattern, NetworkPolicy, Rules, Transform};
use common::pki::*;
use common::tapnet::*;
use common::*;
use rustls::pki_types::{CertificateDer, ServerName};

const SECRET: &str = "Bearer s3cret-token";
const HTTPS_PORT: u16 = 8443;

/// An HTTPS server answering each request with what it saw: whether the secret came
/// (`injected` or `missing`), how many `authorization` headers, the `host`, and the request's
/// number on its connection.
fn https_server(listener: TcpListener, config: Arc<rustls::ServerConfig>) {
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { return };
        let config = config.clone();
        std::thread::spawn(move || {
            let tls = rustls::ServerConnection::new(config).unwrap();
            let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tcp));
            for n in 1.. {
                let (mut auth, mut auths, mut host) = (None, 0, String::new());
                let mut line = String::new();
                loop {
                    line.clear();
                    if stream.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("authorization: ") {
                        auth = Some(v.trim_end().to_string());
                        auths += 1;
                    }
                    if let Some(v) = line.strip_prefix("host: ") {
                        host = v.trim_end().to_string();
                    }
                }
                let secret = if auth.as_deref() == Some(SECRET) {
                    "injected"
                } else {
                    "missing"
                };
                let body = format!("{secret} auth={auths} host={host} n={n}");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.get_mut().write_all(reply.as_bytes()).is_err() {
                    return;
                }
            }
        });
    }
}

/// Reads one response with a `content-length` and returns its head and body.
fn read_response(r: &mut impl BufRead) -> std::io::Result<(String, String)> {
    let mut head = String::new();
    let mut len = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length: ") {
            len = v.trim().parse().unwrap();
        }
        head.push_str(&line);
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok((head, String::from_utf8(body).unwrap()))
}

/// The guest's requests, one connection, to a brokered domain, the daemon trusting the test
/// internet's CA or not; the answers as (head, body).
fn brokered_exchange(
    trust_server: bool,
    requests: Vec<String>,
) -> std::io::Result<Vec<(String, String)>> {
    let name = "api.example.test";
    let (test_ca, server_config) = test_pki(name);
    let mut roots = rustls::RootCertStore::empty();
    if trust_server {
        roots.add(test_ca).unwrap();
    }
    let broker = Arc::new(Broker::generate(Some(roots)).unwrap());
    let domain = DomainPattern::parse("*.example.test").unwrap();
    let policy = NetworkPolicy::Rules(Rules {
        allow: Some(vec![domain.clone()]),
        transforms: vec![Transform::new(domain, &[("Authorization", SECRET)]).unwrap()],
        ..Rules::default()
    });
    let s = setup_with(policy, false, Some(broker.clone()));
    let listener = s
        .internet
        .net
        .spawn(|| TcpListener::bind((SERVER_IP, HTTPS_PORT)))
        .join()
        .unwrap()
        .unwrap();
    let server_config = Arc::new(server_config);
    std::thread::spawn(move || https_server(listener, server_config));

    // The sandbox trusts its CA (the agent installs it) and nothing else.
    let sandbox_ca = rustls_pemfile_der(broker.ca_pem());
    s.guest
        .spawn(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.set_read_timeout(Some(IO_DEADLINE)).unwrap();
            sock.send_to(&dns_query(3, name), (GATEWAY_V4, 53)).unwrap();
            let mut buf = [0; 1500];
            let n = sock.recv(&mut buf).expect("DNS answer");
            let (_, addrs) = dns_answer(&buf[..n]);
            let tls = rustls::ClientConnection::new(
                client_config(sandbox_ca),
                ServerName::try_from(name).unwrap(),
            )
            .unwrap();
            let tcp = TcpStream::connect((addrs[0], HTTPS_PORT))?;
            tcp.set_read_timeout(Some(IO_DEADLINE))?;
            let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tcp));
            let mut seen = Vec::new();
            for req in requests {
                stream.get_mut().write_all(req.as_bytes())?;
                seen.push(read_response(&mut stream)?);
            }
            Ok(seen)
        })
        .join()
        .expect("guest client")
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\n{extra}\r\n")
}

#[test]
fn brokered_requests_carry_the_secret_the_guest_never_sees() {
    // Two requests on one connection: each gets the header, in place of the guest's own.
    let guessed = "Authorization: guest-guess\r\nAuthorization: Bearer other\r\n";
    let seen = brokered_exchange(
        true,
        vec![
            get("/a", &format!("Host: api.example.test\r\n{guessed}")),
            get(
                "/b",
                &format!("Host: API.example.test:{HTTPS_PORT}\r\n{guessed}"),
            ),
        ],
    )
    .expect("two answers");
    assert_eq!(seen.len(), 2);
    for (i, (head, body)) in seen.iter().enumerate() {
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body.starts_with("injected auth=1 host="), "{body}");
        assert!(body.ends_with(&format!(" n={}", i + 1)), "{body}");
        assert!(!head.contains("s3cret"));
    }
}

#[test]
fn a_request_naming_another_host_gets_no_secret_and_never_reaches_the_server() {
    let refused = [
        // A shared front end would route these to another tenant, secret attached.
        get("/", "Host: other.example.test\r\n"),
        get("/", &format!("Host: other.example.test:{HTTPS_PORT}\r\n")),
        get("/", "Host: api.example.test:443\r\n"),
        get("https://other.example.test/", "Host: api.example.test\r\n"),
        get(
            "/",
            "Host: api.example.test\r\nHost: other.example.test\r\n",
        ),
        // TRACE would echo the secret back to the guest.
        "TRACE / HTTP/1.1\r\nHost: api.example.test\r\n\r\n".to_string(),
    ];
    let mut requests = refused.to_vec();
    // The same connection still serves a request for the brokered domain, with its port.
    requests.push(get(
        "/ok",
        &format!("Host: api.example.test:{HTTPS_PORT}\r\n"),
    ));
    let seen = brokered_exchange(true, requests).expect("every request answered");
    let codes: Vec<&str> = seen[..refused.len()]
        .iter()
        .map(|(head, _)| head.get(9..12).unwrap_or(head))
        .collect();
    assert_eq!(codes, ["421", "421", "421", "421", "400", "405"]);
    for (head, body) in &seen[..refused.len()] {
        assert!(!head.contains("s3cret") && !body.contains("s3cret"));
        assert!(body.starts_with("{\"error\":{\"code\":\"broker_"), "{body}");
    }
    assert!(seen[0].1.contains("brokered for api.example.test"));
    assert!(seen[5].0.to_ascii_lowercase().contains("allow: "));
    // The first request the server ever saw on this connection is the last one sent.
    assert_eq!(
        seen[refused.len()].1,
        format!("injected auth=1 host=api.example.test:{HTTPS_PORT} n=1")
    );
}

/// The DER of the one certificate in `pem`.
fn rustls_pemfile_der(pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
}

#[test]
fn a_brokered_server_with_an_untrusted_certificate_gets_nothing() {
    // The daemon verifies the real server: no secret goes to one it cannot authenticate.
    assert!(brokered_exchange(false, vec![get("/", "Host: api.example.test\r\n")]).is_err());
}
