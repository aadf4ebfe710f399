//! Clients of the TCP port that open connections and never finish their headers: each is
//! closed after the header timeout, one over the bound of unauthenticated connections is
//! closed at once, and neither keeps an authenticated client or the Unix socket waiting. The
//! Modal layer's gRPC port holds the same bounds for connections that make no request.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Daemon;

/// The bound of unauthenticated connections the daemon is started with.
const PLACES: usize = 32;

fn half_request(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /v1/inf").unwrap();
    s
}

/// Reads until the daemon closes the connection; a bound on the wait, not a pacing sleep.
fn wait_closed(s: &mut TcpStream) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the daemon kept a stalled connection open: {e}"),
    }
}

/// Whether the daemon still holds the connection open (no EOF, no reset, nothing to read).
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let open = matches!((&*s).read(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

#[test]
fn stalled_tcp_clients_are_bounded_in_time_and_number() {
    let timeout = "5s";
    let places = PLACES.to_string();
    let d = Daemon::start_with(&[
        "--port",
        "0",
        "--header-read-timeout",
        timeout,
        "--max-unauthenticated-connections",
        &places,
    ]);
    // One place short of the bound, so that the authenticated client gets in.
    let mut stalled: Vec<TcpStream> = (0..PLACES - 1).map(|_| half_request(d.port)).collect();
    let info = d.tcp_authed("GET", "/v1/info", "");
    assert_eq!(info.status, 200, "{}", info.body);
    assert_eq!(d.unix("GET", "/v1/info", "").status, 200);
    // The authenticated client gave its place back: one more stalled client fills the bound,
    // and the next is closed at once, while the others are still waiting out their timeout.
    stalled.push(half_request(d.port));
    let mut refused = half_request(d.port);
    wait_closed(&mut refused);
    assert!(
        stalled.iter().all(still_open),
        "a stalled connection was closed before its header timeout"
    );
    // The Unix socket is not bounded by the TCP port's strangers.
    assert_eq!(d.unix("GET", "/v1/info", "").status, 200);
    for s in &mut stalled {
        wait_closed(s);
    }
    // Their places are free again.
    assert_eq!(d.tcp_authed("GET", "/v1/info", "").status, 200);
}

/// Whether the daemon still holds the connection open, after reading what it has sent (the
/// Modal port's HTTP/2 server sends its settings at once).
fn open_after_reading(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let open = loop {
        match (&*s).read(&mut buf) {
            Ok(0) => break false,
            Ok(_) => continue,
            Err(e) => break e.kind() == ErrorKind::WouldBlock,
        }
    };
    s.set_nonblocking(false).unwrap();
    open
}

#[test]
fn stalled_modal_clients_are_bounded_in_time_and_number() {
    const MODAL_PLACES: usize = 4;
    let places = MODAL_PLACES.to_string();
    let d = Daemon::start_with(&[
        "--port",
        "0",
        "--header-read-timeout",
        "5s",
        "--max-unauthenticated-connections",
        &places,
    ]);
    let port = belljar_client::Paths::under_home(d.home.path())
        .modal_port()
        .expect("no Modal port file");
    // HTTP/2's preface and nothing after it: a connection that never makes a request.
    let preface = |port: u16| {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        s
    };
    let mut stalled: Vec<TcpStream> = (0..MODAL_PLACES).map(|_| preface(port)).collect();
    // Connections are accepted in order: this one finds every place taken.
    let mut refused = preface(port);
    wait_closed(&mut refused);
    assert!(
        stalled.iter().all(open_after_reading),
        "a stalled Modal connection was closed before its timeout"
    );
    // The HTTP port's places are its own.
    assert_eq!(d.tcp_authed("GET", "/v1/info", "").status, 200);
    for s in &mut stalled {
        wait_closed(s);
    }
    // Their places are free again: a new connection is held, not refused.
    let again = preface(port);
    assert!(open_after_reading(&again), "a place was not given back");
}
