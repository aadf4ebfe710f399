//! A TLS client that splits its ClientHello over several records (as some do, and as a large
//! post-quantum hello must) reaches a domain the allow-list names: the stack joins the records
//! to read the SNI, then hands the server every byte it held back, unchanged.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex, mpsc};

use belljar_network::config::GATEWAY_V4;
use belljar_network::sniff::refragment;
use belljar_network::{DomainPattern, NetworkPolicy, Rules};
use common::pki::*;
use common::tapnet::*;
use common::*;
use rustls::pki_types::ServerName;

const NAME: &str = "api.example.test";
const HTTPS_PORT: u16 = 8443;

/// A TCP stream that keeps a copy of every byte read from it.
struct Tee {
    tcp: TcpStream,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.tcp.read(buf)?;
        self.seen.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// A TLS server answering one line per connection, then reporting the raw bytes it read.
fn tls_server(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    report: mpsc::Sender<Vec<u8>>,
) {
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { return };
        tcp.set_read_timeout(Some(IO_DEADLINE)).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tls = rustls::ServerConnection::new(config.clone()).unwrap();
        let tee = Tee {
            tcp,
            seen: seen.clone(),
        };
        let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tee));
        let mut line = String::new();
        if stream.read_line(&mut line).is_ok() {
            let _ = stream
                .get_mut()
                .write_all(format!("hello {line}").as_bytes());
            let _ = stream.get_mut().flush();
        }
        let _ = report.send(seen.lock().unwrap().clone());
    }
}

/// A guest's TLS exchange with the allowed domain, its ClientHello cut into records of at most
/// `fragment` bytes: what it sent first, the server's answer, and the raw bytes the server got.
fn split_hello_exchange(
    fragment: impl Fn(usize) -> usize + Send + 'static,
) -> (Vec<u8>, String, Vec<u8>) {
    let policy = NetworkPolicy::Rules(Rules {
        allow: Some(vec![DomainPattern::parse(NAME).unwrap()]),
        ..Rules::default()
    });
    let s = setup(policy);
    let (test_ca, server_config) = test_pki(NAME);
    let listener = s
        .internet
        .net
        .spawn(|| TcpListener::bind((SERVER_IP, HTTPS_PORT)))
        .join()
        .unwrap()
        .unwrap();
    let (report, reports) = mpsc::channel();
    let server_config = Arc::new(server_config);
    std::thread::spawn(move || tls_server(listener, server_config, report));

    let (sent, reply) = s
        .guest
        .spawn(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.set_read_timeout(Some(IO_DEADLINE)).unwrap();
            sock.send_to(&dns_query(5, NAME), (GATEWAY_V4, 53)).unwrap();
            let mut buf = [0; 1500];
            let n = sock.recv(&mut buf).expect("DNS answer");
            let (_, addrs) = dns_answer(&buf[..n]);
            let mut tls = rustls::ClientConnection::new(
                client_config(test_ca),
                ServerName::try_from(NAME).unwrap(),
            )
            .unwrap();
            let mut hello = Vec::new();
            while tls.wants_write() {
                tls.write_tls(&mut hello).unwrap();
            }
            let split = refragment(&hello, fragment(hello.len() - 5));
            let mut tcp = TcpStream::connect((addrs[0], HTTPS_PORT)).expect("connect");
            tcp.set_read_timeout(Some(IO_DEADLINE)).unwrap();
            tcp.set_nodelay(true).unwrap();
            tcp.write_all(&split).unwrap();
            let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tcp));
            stream
                .get_mut()
                .write_all(b"ping\n")
                .expect("the handshake completes");
            let mut reply = String::new();
            stream.read_line(&mut reply).expect("an answer");
            (split, reply)
        })
        .join()
        .expect("guest client");
    let seen = reports
        .recv_timeout(IO_DEADLINE)
        .expect("the server's report");
    (sent, reply, seen)
}

fn records(flight: &[u8]) -> usize {
    let mut n = 0;
    let mut rest = flight;
    while let Some(h) = rest.get(..5) {
        rest = &rest[5 + usize::from(u16::from_be_bytes([h[3], h[4]]))..];
        n += 1;
    }
    n
}

#[test]
fn a_client_hello_in_two_records_reaches_the_server_unchanged() {
    let (sent, reply, seen) = split_hello_exchange(|len| len / 2 + 1);
    assert_eq!(records(&sent), 2);
    assert_eq!(reply, "hello ping\n");
    assert!(
        seen.starts_with(&sent),
        "the server got the records as the guest sent them"
    );
}

#[test]
fn a_client_hello_in_one_byte_records_reaches_the_server_unchanged() {
    let (sent, reply, seen) = split_hello_exchange(|_| 1);
    assert!(records(&sent) > 100);
    assert_eq!(reply, "hello ping\n");
    assert!(seen.starts_with(&sent));
}
