//! Credential brokering end to end: the kernel guest speaks TLS to a domain whose policy entry
//! sets a header; the daemon terminates it with the sandbox's CA, sets the header and talks TLS
//! to the real server (certificate from a test CA, verified). The server sees the secret; the
//! guest never does.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;

use belljar_network::config::GATEWAY_V4;
use belljar_network::{Broker, DomainPattern, NetworkPolicy, Rules, Transform};
use common::tapnet::*;
use common::*;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

const SECRET: &str = "Bearer s3cret-token";
const HTTPS_PORT: u16 = 8443;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA and a server configuration for `name` signed by it.
fn test_pki(name: &str) -> (CertificateDer<'static>, rustls::ServerConfig) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test internet CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (ca.der().clone(), config)
}

/// An HTTPS server answering each request with whether it carried the secret.
fn https_server(listener: TcpListener, config: Arc<rustls::ServerConfig>) {
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { return };
        let config = config.clone();
        std::thread::spawn(move || {
            let tls = rustls::ServerConnection::new(config).unwrap();
            let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tcp));
            loop {
                let mut auth = None;
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
                    }
                }
                let body = if auth.as_deref() == Some(SECRET) {
                    "injected"
                } else {
                    "missing"
                };
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

/// Two requests from the guest to a brokered domain, the daemon trusting the test internet's
/// CA or not.
fn brokered_exchange(trust_server: bool) -> std::io::Result<Vec<(String, String)>> {
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
            let mut roots = rustls::RootCertStore::empty();
            roots.add(sandbox_ca).unwrap();
            let config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let tls = rustls::ClientConnection::new(
                Arc::new(config),
                ServerName::try_from(name).unwrap(),
            )
            .unwrap();
            let tcp = TcpStream::connect((addrs[0], HTTPS_PORT))?;
            tcp.set_read_timeout(Some(IO_DEADLINE))?;
            let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tcp));
            let mut seen = Vec::new();
            // Two requests on one connection: each gets the header, over the guest's own.
            for path in ["/a", "/b"] {
                let req = format!(
                    "GET {path} HTTP/1.1\r\nHost: {name}\r\nAuthorization: guest-guess\r\n\r\n"
                );
                stream.get_mut().write_all(req.as_bytes())?;
                seen.push(read_response(&mut stream)?);
            }
            Ok(seen)
        })
        .join()
        .expect("guest client")
}

#[test]
fn brokered_requests_carry_the_secret_the_guest_never_sees() {
    let seen = brokered_exchange(true).expect("two answers");
    assert_eq!(seen.len(), 2);
    for (head, body) in &seen {
        assert_eq!(body, "injected");
        assert!(!head.contains("s3cret"));
    }
}

/// The DER of the one certificate in `pem`.
fn rustls_pemfile_der(pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
}

#[test]
fn a_brokered_server_with_an_untrusted_certificate_gets_nothing() {
    // The daemon verifies the real server: no secret goes to one it cannot authenticate.
    assert!(brokered_exchange(false).is_err());
}
