//! The stack end to end: a smoltcp guest on the VMM's end of the frame socket, the stack in a
//! network namespace of its own, and servers on a private test internet behind it.

mod common;

use std::net::{IpAddr, Ipv4Addr, TcpListener};

use belljar_network::sniff::client_hello;
use belljar_network::{FlowVerdict, NetworkPolicy, Protocol};
use common::guest::Guest;
use common::stack_setup::*;
use common::*;
use hickory_proto::op::ResponseCode;

#[test]
fn host_loopback_and_the_host_itself_need_an_explicit_subnet() {
    let mut s = setup(NetworkPolicy::AllowAll, &[]);
    let listener = s
        .internet
        .daemon
        .spawn(|| TcpListener::bind("127.0.0.1:0"))
        .join()
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || tcp_echo(listener));
    let loopback = v4(Ipv4Addr::LOCALHOST, port);

    let (_, ok) = s.guest.connect(loopback);
    assert!(!ok, "allow-all does not open the host's loopback");
    let r = wait_flow(&mut s, "denied loopback", |r| r.dst == loopback);
    assert_eq!(r.verdict, FlowVerdict::Denied);
    assert_eq!(r.rule, "reserved: host loopback");
    let (_, ok) = s.guest.connect(v4(DAEMON_IP, port));
    assert!(!ok, "nor the host's own addresses");

    s.net.set_policy(rules(None, &["0.0.0.0/0"], &[]));
    let (_, ok) = s.guest.connect(loopback);
    assert!(!ok, "0.0.0.0/0 does not name loopback explicitly");

    s.net.set_policy(rules(None, &["127.0.0.1/32"], &[]));
    assert!(
        echo(&mut s, loopback, b"ping"),
        "an explicit entry opens it"
    );
    let r = wait_flow(&mut s, "allowed loopback", |r| {
        r.dst == loopback && r.verdict == FlowVerdict::Allowed
    });
    assert_eq!(r.rule, "subnets.allow 127.0.0.1/32");
}

#[test]
fn allow_all_relays_tcp_and_udp_and_counts_bytes() {
    let mut s = setup(NetworkPolicy::AllowAll, &[]);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let dst = v4(SERVER_IP, ECHO_PORT);
    let (h, ok) = s.guest.connect(dst);
    assert!(ok);
    s.guest.send_all(h, &data);
    assert!(s.guest.recv(h, data.len()) == data, "the echo matches");
    s.guest.tcp(h).close();
    s.guest.wait_closed(h);
    let r = wait_flow(&mut s, "finished TCP flow", |r| {
        r.dst == dst && r.protocol == Protocol::Tcp && r.ended_ms.is_some()
    });
    assert_eq!((r.bytes_out, r.bytes_in), (200_000, 200_000));
    assert_eq!(r.rule, "allow-all");

    let udp = v4(SERVER_IP, ECHO_PORT);
    assert_eq!(s.guest.udp_exchange(udp, b"hello udp"), b"hello udp");
    let r = wait_flow(&mut s, "UDP flow", |r| r.protocol == Protocol::Udp);
    assert_eq!(r.verdict, FlowVerdict::Allowed);
}

#[test]
fn deny_all_refuses_dns_tcp_and_udp() {
    let mut s = setup(NetworkPolicy::DenyAll, &[("api.example.test", SERVER_IP)]);
    assert_eq!(
        dns(&mut s, 1, "api.example.test"),
        (ResponseCode::Refused, vec![])
    );
    let (_, ok) = s.guest.connect(v4(SERVER_IP, ECHO_PORT));
    assert!(!ok);
    let h = s.guest.udp_socket();
    s.guest.udp_send(h, v4(SERVER_IP, ECHO_PORT), b"x");
    let r = wait_flow(&mut s, "denied UDP", |r| r.protocol == Protocol::Udp);
    assert_eq!(
        (r.verdict, r.rule.as_str()),
        (FlowVerdict::Denied, "deny-all")
    );
    let r = wait_flow(&mut s, "refused DNS", |r| r.protocol == Protocol::Dns);
    assert_eq!(r.name.as_deref(), Some("api.example.test"));
    assert_eq!(r.verdict, FlowVerdict::Denied);
}

#[test]
fn domain_allow_list_matches_dns_sni_and_host_with_wildcards() {
    let names = [
        ("api.example.test", SERVER_IP),
        ("example.test", SERVER_IP),
        ("www.foo.test", SERVER2_IP),
        ("evil.test", SERVER2_IP),
    ];
    let mut s = setup(
        rules(Some(&["*.example.test", "www.*.test"]), &[], &[]),
        &names,
    );
    assert_eq!(
        dns(&mut s, 1, "api.example.test"),
        (ResponseCode::NoError, vec![SERVER_IP])
    );
    assert_eq!(
        dns(&mut s, 2, "example.test"),
        (ResponseCode::Refused, vec![]),
        "not the parent"
    );
    assert_eq!(
        dns(&mut s, 3, "www.foo.test"),
        (ResponseCode::NoError, vec![SERVER2_IP])
    );
    assert_eq!(dns(&mut s, 4, "evil.test"), (ResponseCode::Refused, vec![]));

    let tls = v4(SERVER_IP, TLS_PORT);
    assert!(
        echo(&mut s, tls, &client_hello("api.example.test")),
        "SNI allowed"
    );
    let r = wait_flow(&mut s, "SNI flow", |r| {
        r.name.as_deref() == Some("api.example.test")
    });
    assert_eq!(
        (r.verdict, r.rule.as_str()),
        (FlowVerdict::Allowed, "allow *.example.test")
    );
    assert!(
        !echo(&mut s, tls, &client_hello("example.test")),
        "the parent is refused"
    );
    let http = b"GET / HTTP/1.1\r\nHost: www.foo.test\r\n\r\n";
    assert!(
        echo(&mut s, v4(SERVER2_IP, ECHO_PORT), http),
        "HTTP Host allowed"
    );
    // An allowed name at an address DNS never gave for it: domain fronting.
    assert!(!echo(
        &mut s,
        v4(SERVER2_IP, TLS_PORT),
        &client_hello("api.example.test")
    ));
    let r = wait_flow(&mut s, "fronting", |r| r.dst == v4(SERVER2_IP, TLS_PORT));
    assert_eq!(r.rule, "address not resolved for an allowed name");
    // Without a name (raw TCP) or over UDP, nothing is allowed.
    assert!(!echo(&mut s, v4(SERVER_IP, ECHO_PORT), b"\x00raw bytes"));
    let h = s.guest.udp_socket();
    s.guest.udp_send(h, v4(SERVER_IP, ECHO_PORT), b"x");
    let r = wait_flow(&mut s, "denied UDP", |r| r.protocol == Protocol::Udp);
    assert_eq!(r.verdict, FlowVerdict::Denied);
}

#[test]
fn subnet_deny_wins_and_subnet_allow_bypasses_domains() {
    let mut s = setup(
        rules(
            Some(&["*.example.test"]),
            &["203.0.113.0/24"],
            &["203.0.113.3/32"],
        ),
        &[],
    );
    assert!(echo(&mut s, v4(SERVER_IP, ECHO_PORT), b"no name needed"));
    assert!(!echo(&mut s, v4(SERVER2_IP, ECHO_PORT), b"denied"));
    let r = wait_flow(&mut s, "deny", |r| r.dst.ip() == IpAddr::V4(SERVER2_IP));
    assert_eq!(r.rule, "subnets.deny 203.0.113.3/32");
    assert_eq!(s.guest.udp_exchange(v4(SERVER_IP, ECHO_PORT), b"u"), b"u");
}

#[test]
fn a_replaced_policy_cuts_the_flows_it_denies_at_once() {
    let mut s = setup(NetworkPolicy::AllowAll, &[]);
    let (cut, ok) = s.guest.connect(v4(SERVER_IP, ECHO_PORT));
    assert!(ok);
    let (kept, ok) = s.guest.connect(v4(SERVER2_IP, ECHO_PORT));
    assert!(ok);
    s.guest.send_all(cut, b"before");
    assert_eq!(s.guest.recv(cut, 6), b"before");

    s.net.set_policy(rules(None, &[], &["203.0.113.2/32"]));
    s.guest.wait_closed(cut);
    assert_eq!(
        s.guest.tcp(cut).state(),
        smoltcp::socket::tcp::State::Closed,
        "reset"
    );
    s.guest.send_all(kept, b"still");
    assert_eq!(
        s.guest.recv(kept, 5),
        b"still",
        "flows the new policy allows stay"
    );
    let (_, ok) = s.guest.connect(v4(SERVER_IP, ECHO_PORT));
    assert!(!ok, "new flows see the new policy");
}

#[test]
fn the_daemon_side_reconnects_when_the_vmm_side_comes_back() {
    let mut s = setup(NetworkPolicy::AllowAll, &[]);
    assert!(echo(&mut s, v4(SERVER_IP, ECHO_PORT), b"one"));
    // The VMM drops the connection (a restart) and accepts the next one.
    s.guest.disconnect();
    s.guest = Guest::new(s.vmm.accept());
    assert!(echo(&mut s, v4(SERVER_IP, ECHO_PORT), b"two"));
    assert!(!s.net.is_finished());
}
