//! The namespace backend's frame path: a tap device `eth0` in a guest network namespace the
//! test creates, configured as the agent configures it, with the Linux kernel as the guest.
//! The stack runs in its own namespace in front of a private test internet.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};

use belljar_network::config::{GATEWAY_V4, GUEST_V4, TAP_MTU};
use belljar_network::{FlowVerdict, NetworkPolicy, Rules, tap};
use common::tapnet::*;
use common::*;
use hickory_proto::op::ResponseCode;

/// A TCP echo from inside the guest: `Ok(true)` when the bytes come back.
fn kernel_echo(s: &Setup, dst: SocketAddr, len: usize) -> std::io::Result<bool> {
    s.guest
        .spawn(move || {
            let mut c = TcpStream::connect_timeout(&dst, IO_DEADLINE)?;
            c.set_read_timeout(Some(IO_DEADLINE))?;
            let data: Vec<u8> = (0..len).map(|i| u8::try_from(i % 253).unwrap()).collect();
            let mut w = c.try_clone()?;
            let writer = std::thread::spawn(move || w.write_all(&data).map(|()| data));
            let mut got = vec![0; len];
            c.read_exact(&mut got)?;
            let data = writer.join().expect("writer")?;
            Ok(got == data)
        })
        .join()
        .expect("guest thread")
}

fn kernel_dns(s: &Setup, name: &'static str) -> (ResponseCode, Vec<Ipv4Addr>) {
    s.guest
        .spawn(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").expect("bind");
            sock.set_read_timeout(Some(IO_DEADLINE)).expect("timeout");
            sock.send_to(&dns_query(7, name), (GATEWAY_V4, 53))
                .expect("send");
            let mut buf = [0; 1500];
            let (n, from) = sock.recv_from(&mut buf).expect("a DNS answer");
            assert_eq!(from, SocketAddr::new(IpAddr::V4(GATEWAY_V4), 53));
            dns_answer(&buf[..n])
        })
        .join()
        .expect("guest thread")
}

#[test]
fn the_kernel_behind_a_tap_gets_dns_tcp_udp_and_ipv6() {
    let s = setup(NetworkPolicy::AllowAll);
    assert_eq!(
        kernel_dns(&s, "pypi.example.test"),
        (ResponseCode::NoError, vec![SERVER_IP])
    );
    assert!(kernel_echo(&s, v4(SERVER_IP, ECHO_PORT), 1 << 20).expect("echo"));
    let v6 = SocketAddr::new(IpAddr::V6(SERVER_IP6), ECHO_PORT);
    assert!(kernel_echo(&s, v6, 4096).expect("echo over IPv6"));
    let reply = s
        .guest
        .spawn(|| {
            let sock = UdpSocket::bind("0.0.0.0:0")?;
            sock.set_read_timeout(Some(IO_DEADLINE))?;
            sock.send_to(b"datagram", v4(SERVER_IP, ECHO_PORT))?;
            let mut buf = [0; 64];
            let n = sock.recv(&mut buf)?;
            Ok::<_, std::io::Error>(buf[..n].to_vec())
        })
        .join()
        .unwrap()
        .expect("UDP echo");
    assert_eq!(reply, b"datagram");
}

/// The MSS the guest's kernel saw on a connection that brought it 1 MiB from the internet.
fn download_mss(s: &Setup) -> std::io::Result<u32> {
    let source = s
        .internet
        .net
        .spawn(|| TcpListener::bind((SERVER_IP, 10)))
        .join()
        .unwrap()?;
    std::thread::spawn(move || {
        if let Ok((mut c, _)) = source.accept() {
            let _ = c.write_all(&vec![0x5a; 1 << 20]);
        }
    });
    s.guest
        .spawn(|| {
            let mut c = TcpStream::connect_timeout(&v4(SERVER_IP, 10), IO_DEADLINE)?;
            c.set_read_timeout(Some(IO_DEADLINE))?;
            let mut got = vec![0; 1 << 20];
            c.read_exact(&mut got)?;
            tcp_rcv_mss(&c)
        })
        .join()
        .unwrap()
}

/// `tcpi_rcv_mss` from `TCP_INFO`: the largest segment the kernel has received.
fn tcp_rcv_mss(c: &TcpStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: `info` is a plain C struct that `getsockopt` fills up to `len` bytes, and `len`
    // is its size; `c` is an open socket for the call.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).unwrap();
    // SAFETY: as above: the pointers are to `info` and `len`, which outlive the call.
    let rc = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.tcpi_rcv_mss)
}

#[test]
fn a_download_reaches_the_kernel_in_segments_as_large_as_the_tap_allows() {
    // At Ethernet's 1500 the stack sent 1460-byte segments, one system call each, and a
    // download ran at a sixth of pasta's speed.
    let s = setup(NetworkPolicy::AllowAll);
    let mss = download_mss(&s).expect("a download");
    assert!(
        mss > 16_000,
        "segments of {mss} bytes on a tap with an MTU of {TAP_MTU}"
    );
}

#[test]
fn the_kernel_behind_a_tap_is_refused_what_the_policy_denies() {
    let s = setup(NetworkPolicy::AllowAll);
    // The daemon's own namespace: a listener on its address and on its loopback.
    let listener = s
        .internet
        .daemon
        .spawn(|| TcpListener::bind("0.0.0.0:0"))
        .join()
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || tcp_echo(listener));
    let err = kernel_echo(&s, v4(DAEMON_IP, port), 1).expect_err("the host itself");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);

    s.net.set_policy(NetworkPolicy::Rules(Rules {
        subnets_deny: vec!["203.0.113.2/32".parse().unwrap()],
        ..Rules::default()
    }));
    let err = kernel_echo(&s, v4(SERVER_IP, ECHO_PORT), 1).expect_err("denied");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(kernel_echo(&s, v4(SERVER2_IP, ECHO_PORT), 10).expect("still allowed"));

    s.net.set_policy(NetworkPolicy::DenyAll);
    assert_eq!(
        kernel_dns(&s, "pypi.example.test"),
        (ResponseCode::Refused, vec![])
    );
    let denied = s.net.flows().records();
    assert!(
        denied
            .iter()
            .any(|r| r.dst == v4(SERVER_IP, ECHO_PORT) && r.verdict == FlowVerdict::Denied)
    );
}

#[test]
fn an_exposed_port_reaches_the_guest_from_the_host() {
    let s = setup(NetworkPolicy::DenyAll);
    let server = s
        .guest
        .spawn(|| TcpListener::bind("0.0.0.0:8080"))
        .join()
        .unwrap()
        .expect("listen in the guest");
    std::thread::spawn(move || tcp_echo(server));
    let forward = {
        let _in = s.rt.enter();
        s.net
            .forward(TcpListener::bind("127.0.0.1:0").unwrap(), 8080)
            .expect("forward")
    };
    assert_eq!(forward.guest_port(), 8080);
    let mut c = TcpStream::connect(forward.local_addr()).expect("connect to the exposed port");
    c.set_read_timeout(Some(IO_DEADLINE)).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 249) as u8).collect();
    let mut w = c.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent));
    let mut got = vec![0; data.len()];
    c.read_exact(&mut got).expect("the echo");
    writer.join().unwrap().unwrap();
    assert!(got == data, "deny-all does not apply to exposed ports");
    drop(c);
    let flows = s.net.flows().clone();
    let deadline = std::time::Instant::now() + IO_DEADLINE;
    let r = loop {
        let mut sub = flows.subscribe();
        let done = flows
            .records()
            .into_iter()
            .find(|r| r.rule == "exposed port" && r.ended_ms.is_some());
        if let Some(r) = done {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the forwarded flow ends"
        );
        let _ =
            s.rt.block_on(async { tokio::time::timeout(IO_DEADLINE, sub.recv()).await });
    };
    assert_eq!(r.dst, v4(GUEST_V4, 8080));
    assert_eq!((r.bytes_in, r.bytes_out), (300_000, 300_000));

    // Nothing listens on 8081: the host's connection is closed.
    let closed = {
        let _in = s.rt.enter();
        s.net
            .forward(TcpListener::bind("127.0.0.1:0").unwrap(), 8081)
            .unwrap()
    };
    let mut c = TcpStream::connect(closed.local_addr()).unwrap();
    c.set_read_timeout(Some(IO_DEADLINE)).unwrap();
    let mut buf = [0; 1];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn a_persistent_tap_is_reattached_after_the_daemon_goes_away() {
    let mut s = setup_with(NetworkPolicy::AllowAll, true, None);
    assert!(kernel_echo(&s, v4(SERVER_IP, ECHO_PORT), 100).expect("echo"));
    // The daemon dies: its stack and the tap descriptor are gone.
    let old = std::mem::replace(&mut s.net, {
        let fd = s
            .guest
            .spawn(|| tap::create("bj-spare"))
            .join()
            .unwrap()
            .unwrap();
        start(&s.internet, &s.rt, fd, NetworkPolicy::DenyAll, None)
    });
    s.rt.block_on(old.shutdown()).expect("a clean stop");
    // The restarted daemon attaches to the same device; the guest kept its configuration.
    let fd = s
        .guest
        .spawn(|| tap::attach("eth0", IO_DEADLINE))
        .join()
        .unwrap()
        .expect("reattach");
    s.net = start(&s.internet, &s.rt, fd, NetworkPolicy::AllowAll, None);
    assert!(kernel_echo(&s, v4(SERVER_IP, ECHO_PORT), 100).expect("echo after the restart"));
}

#[test]
fn a_large_dns_answer_is_truncated_over_udp_and_served_over_tcp() {
    let s = setup(NetworkPolicy::AllowAll);
    let (udp, tcp) = s
        .guest
        .spawn(|| {
            let query = dns_query(9, "big.example.test");
            let sock = UdpSocket::bind("0.0.0.0:0")?;
            sock.set_read_timeout(Some(IO_DEADLINE))?;
            sock.send_to(&query, (GATEWAY_V4, 53))?;
            let mut buf = [0; 1500];
            let n = sock.recv(&mut buf)?;
            let udp = buf[..n].to_vec();
            let mut c =
                TcpStream::connect_timeout(&SocketAddr::from((GATEWAY_V4, 53)), IO_DEADLINE)?;
            c.set_read_timeout(Some(IO_DEADLINE))?;
            let mut framed = u16::try_from(query.len()).unwrap().to_be_bytes().to_vec();
            framed.extend_from_slice(&query);
            c.write_all(&framed)?;
            let mut len = [0; 2];
            c.read_exact(&mut len)?;
            let mut tcp = vec![0; usize::from(u16::from_be_bytes(len))];
            c.read_exact(&mut tcp)?;
            Ok::<_, std::io::Error>((udp, tcp))
        })
        .join()
        .unwrap()
        .expect("DNS over UDP then TCP");
    let udp = hickory_proto::op::Message::from_vec(&udp).unwrap();
    assert!(
        udp.truncated(),
        "512 bytes without EDNS: the answer is truncated: {udp:?}"
    );
    assert!(udp.answers().is_empty());
    let (code, addrs) = dns_answer(&tcp);
    assert_eq!((code, addrs.len()), (ResponseCode::NoError, 40));
    let logged = s.net.flows().records();
    assert_eq!(
        logged
            .iter()
            .filter(|r| r.name.as_deref() == Some("big.example.test"))
            .count(),
        2,
        "both questions are logged"
    );
}

/// Not a timed test: prints the guest → internet TCP throughput through the stack, for the
/// README's comparison (run in release: `cargo test --release -p belljar-network --test tap
/// -- --ignored --nocapture throughput`).
#[test]
#[ignore = "a measurement, not a check"]
fn throughput() {
    let s = setup(NetworkPolicy::AllowAll);
    let sink = s
        .internet
        .net
        .spawn(|| TcpListener::bind((SERVER_IP, 9)))
        .join()
        .unwrap()
        .unwrap();
    std::thread::spawn(move || {
        for conn in sink.incoming() {
            let mut conn = conn.unwrap();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut conn, &mut std::io::sink());
            });
        }
    });
    let total: usize = 512 << 20;
    let elapsed = s
        .guest
        .spawn(move || {
            let mut c = TcpStream::connect(v4(SERVER_IP, 9)).unwrap();
            let buf = vec![0x5a; 1 << 20];
            let start = std::time::Instant::now();
            for _ in 0..total >> 20 {
                c.write_all(&buf).unwrap();
            }
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let _ = c.read(&mut [0; 1]);
            start.elapsed()
        })
        .join()
        .unwrap();
    let mbps = (total as f64 * 8.0) / elapsed.as_secs_f64() / 1e6;
    println!(
        "guest -> internet: {} MiB in {elapsed:?}: {mbps:.0} Mbit/s",
        total >> 20
    );
}

#[test]
fn connections_a_guest_process_leaves_behind_are_freed() {
    // A process opens more connections than the sandbox may hold to a server that never
    // closes one, then exits: its kernel sends a FIN on each, keeps the orphans a while, then
    // forgets them. Before, the daemon held every flow and host socket until smoltcp's
    // two-minute timeout at the earliest, refusing the sandbox's new connections meanwhile.
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let limits = belljar_network::config::Limits {
        max_tcp_flows: 24,
        tcp_keepalive: std::time::Duration::from_secs(1),
        tcp_unanswered: std::time::Duration::from_secs(3),
        tcp_half_closed_idle: std::time::Duration::from_secs(2),
        ..Default::default()
    };
    let s = setup_limits(NetworkPolicy::AllowAll, limits);
    let listener = s
        .internet
        .net
        .spawn(|| TcpListener::bind((SERVER_IP, 0)))
        .join()
        .unwrap()
        .unwrap();
    let server = listener.local_addr().unwrap();
    // Reports each connection the daemon resets, which it does as it closes the descriptor.
    let (reset_tx, reset_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let tx = reset_tx.clone();
            std::thread::spawn(move || {
                // No events asked for: only a hang-up or an error (a reset) ends the wait,
                // not the FIN of a half-close.
                let mut fds = [PollFd::new(conn.as_fd(), PollFlags::empty())];
                let _ = poll(&mut fds, PollTimeout::NONE);
                let _ = tx.send(());
                std::thread::park();
            });
        }
    });
    let opened = s
        .guest
        .spawn(move || {
            let conns: Vec<_> = (0..32)
                .filter_map(|_| TcpStream::connect_timeout(&server, IO_DEADLINE).ok())
                .collect();
            conns.len() // dropped here, as the process exits
        })
        .join()
        .unwrap();
    assert_eq!(opened, 24, "the flow limit holds");
    for i in 0..24 {
        reset_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("connection {i} of 24 still held by the daemon"));
    }
    assert_eq!(held_sockets(&s.internet.daemon, server.port()), 0);
    assert!(
        kernel_echo(&s, SocketAddr::new(IpAddr::V4(SERVER_IP), 7), 100).unwrap(),
        "a new connection is not refused"
    );
}
