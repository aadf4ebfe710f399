//! What a sandbox's network may hold, and for how long: flows a guest abandons are freed,
//! idle ones cut by their state's timeout, a flood of denied flows still logged, DNS
//! rate-limited, the host's new addresses refused at once, and the daemon's flow budget
//! shared between sandboxes. The same set-up as `stack.rs`.

mod common;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use belljar_network::budget::{self, Budget};
use belljar_network::config::Limits;
use belljar_network::{FlowVerdict, NetworkPolicy, Protocol};
use common::stack_setup::*;
use common::*;
use hickory_proto::op::ResponseCode;
use smoltcp::socket::tcp::State;

/// A server on the daemon's loopback that accepts every connection and never closes one: it
/// reads until the client's end is gone and reports each end (EOF or reset) on the channel.
fn holding_server(s: &Setup) -> (SocketAddr, mpsc::Receiver<()>) {
    let listener = s
        .internet
        .daemon
        .spawn(|| TcpListener::bind("127.0.0.1:0"))
        .join()
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut buf = [0; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                let _ = tx.send(());
                // Held, never closed, as the server of the report does.
                std::thread::park();
                drop(conn);
            });
        }
    });
    (addr, rx)
}

fn loopback_allowed() -> NetworkPolicy {
    rules(None, &["127.0.0.1/32"], &[])
}

#[test]
fn flows_a_guest_abandons_are_freed_with_their_host_sockets() {
    // Before, the daemon kept them until smoltcp's two-minute timeout at the earliest (the
    // ones the guest's kernel had closed with a FIN, and the ones whose reset was lost), and
    // every connection the sandbox tried meanwhile was refused: "too many open flows".
    let limits = Limits {
        max_tcp_flows: 32,
        tcp_keepalive: Duration::from_secs(1),
        tcp_unanswered: Duration::from_secs(3),
        ..Limits::default()
    };
    let mut s = setup_with(loopback_allowed(), &[], limits);
    let (server, ended) = holding_server(&s);
    let (open, refused) = s.guest.connect_many(server, 40);
    assert_eq!((open.len(), refused), (32, 8), "the flow limit holds");
    let r = wait_flow(&mut s, "a refused flow", |r| {
        r.rule == "too many open flows"
    });
    assert_eq!(r.verdict, FlowVerdict::Denied);
    let daemon = &s.internet.daemon;
    s.guest.run_until("the daemon's 32 host connections", |_| {
        (held_sockets(daemon, server.port()) == 32).then_some(())
    });

    // The process exits: its kernel resets the connections with unread data and closes the
    // others with a FIN, then forgets them all (later segments get a reset).
    let (reset, closed) = open.split_at(16);
    for &h in reset {
        s.guest.tcp(h).abort();
    }
    for &h in closed {
        s.guest.tcp(h).close();
    }
    s.guest.run_until("the FINs acknowledged", |g| {
        closed
            .iter()
            .all(|&h| g.tcp(h).state() == State::FinWait2)
            .then_some(())
    });
    for &h in &open {
        s.guest.sockets.remove(h);
    }

    let mut gone = 0;
    s.guest
        .run_until("the server to see every connection end", |_| {
            gone += ended.try_iter().count();
            (gone == 32).then_some(())
        });
    s.guest.run_until("the daemon's host sockets closed", |_| {
        (held_sockets(daemon, server.port()) == 0).then_some(())
    });
    let (h, ok) = s.guest.connect(server);
    assert!(ok, "a new connection is not refused");
    s.guest.tcp(h).abort();
}

#[test]
fn idle_flows_are_cut_by_their_state_timeouts_while_live_ones_stay() {
    // Before, smoltcp's timeout cut any connection the guest was quiet on for two minutes,
    // busy or not, and nothing else bounded a half-closed one.
    let limits = Limits {
        tcp_keepalive: Duration::from_millis(500),
        tcp_unanswered: Duration::from_secs(2),
        tcp_half_closed_idle: Duration::from_secs(3),
        tcp_established_idle: Duration::from_secs(6),
        ..Limits::default()
    };
    let mut s = setup_with(
        rules(None, &["127.0.0.1/32", "203.0.113.0/24"], &[]),
        &[],
        limits,
    );
    let (server, _ended) = holding_server(&s);
    let start = Instant::now();
    let (idle, ok) = s.guest.connect(server);
    assert!(ok);
    let (half, ok) = s.guest.connect(server);
    assert!(ok);
    let (busy, ok) = s.guest.connect(v4(SERVER_IP, ECHO_PORT));
    assert!(ok);
    // The guest closes its side of one; the server never closes its own.
    s.guest.tcp(half).close();

    let mut last_echo = Instant::now();
    let mut ended = [None, None];
    s.guest.run_until("both idle connections cut", |g| {
        if last_echo.elapsed() > Duration::from_millis(200) {
            last_echo = Instant::now();
            let sock = g.tcp(busy);
            assert_eq!(sock.state(), State::Established, "a busy connection stays");
            let mut buf = [0; 16];
            while sock.can_recv() {
                sock.recv_slice(&mut buf).unwrap();
            }
            sock.send_slice(b"ping").unwrap();
        }
        for (i, h) in [idle, half].into_iter().enumerate() {
            if ended[i].is_none() && g.tcp(h).state() == State::Closed {
                ended[i] = Some(start.elapsed());
            }
        }
        ended[0].zip(ended[1])
    });
    let (idle_at, half_at) = ended.map(Option::unwrap).into();
    assert!(
        half_at >= Duration::from_secs(3),
        "the half-closed one lives its timeout: {half_at:?}"
    );
    assert!(
        idle_at >= Duration::from_secs(6),
        "the idle one outlives the probes' timeout, as the guest answers them: {idle_at:?}"
    );
    assert!(
        half_at < idle_at,
        "a half-closed connection's timeout is the shorter"
    );
    s.guest.send_all(busy, b"still");
    let mut got = Vec::new();
    s.guest.run_until("the busy one's echo", |g| {
        let sock = g.tcp(busy);
        let mut buf = [0; 4096];
        while sock.can_recv() {
            let n = sock.recv_slice(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(sock.state(), State::Established, "the busy one stays");
        got.ends_with(b"still").then_some(())
    });
    eprintln!(
        "cut at {idle_at:?} and {half_at:?}, echo at {:?}",
        start.elapsed()
    );
    let daemon = &s.internet.daemon;
    s.guest
        .run_until("the cut connections' host sockets closed", |_| {
            (held_sockets(daemon, server.port()) == 0).then_some(())
        });
}

#[test]
fn a_flood_of_denied_connections_keeps_every_one_in_the_feed() {
    // The daemon keeps what the feed gives. Before, it read the broadcast, which lost what it
    // fell behind on: a flooding guest could keep its denied flows out of the log.
    let mut s = setup(NetworkPolicy::DenyAll, &[]);
    let mut lossy = s.net.flows().subscribe();
    let targets = [v4(SERVER_IP, 443), v4(SERVER2_IP, 22)];
    let mut sent = std::collections::HashMap::new();
    for round in 0..26 {
        let dst = targets[round % 2];
        let (open, refused) = s.guest.connect_many(dst, 100);
        assert!(open.is_empty());
        *sent.entry(dst).or_insert(0u64) += refused as u64;
    }
    let flows = s.net.flows().clone();
    let wanted: u64 = sent.values().sum();
    // Every refusal is logged by the time the guest sees it; wait for the last end too.
    s.guest.run_until("the last denied flow's end", |_| {
        flows
            .records()
            .last()
            .is_some_and(|r| r.ended_ms.is_some())
            .then_some(())
    });
    let stats = flows.feed_stats();
    assert!(
        stats.coalesced > 0,
        "the flood overflowed the feed: {stats:?}"
    );
    assert_eq!(stats.dropped, 0, "no allowed flow to drop");
    let mut ids = std::collections::HashSet::new();
    let mut got = std::collections::HashMap::new();
    while let Some(r) = flows.try_next_record() {
        assert_eq!(r.verdict, FlowVerdict::Denied);
        if ids.insert(r.id) {
            *got.entry(r.dst).or_insert(0u64) += 1 + r.coalesced;
        }
    }
    assert_eq!(
        got, sent,
        "each of the {wanted} denied connections is accounted for"
    );
    let mut lagged = 0;
    loop {
        match lossy.try_recv() {
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => lagged += n,
            Err(_) => break,
        }
    }
    assert!(lagged > 0, "the broadcast, the old path, lost some");
}

#[test]
fn a_dns_flood_is_refused_past_the_rate_while_another_sandbox_is_answered() {
    // Before, every question was parsed, logged and resolved: one sandbox's flood took the
    // daemon's CPU and slowed every other sandbox's DNS.
    let names = [("api.example.test", SERVER_IP)];
    let limits = Limits {
        dns_qps: 1,
        dns_burst: 20,
        ..Limits::default()
    };
    let mut flooding = setup_with(NetworkPolicy::AllowAll, &names, limits);
    let mut other = setup(NetworkPolicy::AllowAll, &names);
    let start = Instant::now();
    let (mut answered, mut refused) = (0u64, 0u64);
    for id in 0..100 {
        match dns(&mut flooding, id, "api.example.test") {
            (ResponseCode::NoError, addrs) => {
                assert_eq!(addrs, [SERVER_IP]);
                answered += 1;
            }
            (ResponseCode::Refused, addrs) => {
                assert!(addrs.is_empty());
                refused += 1;
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let secs = start.elapsed().as_secs();
    assert!(
        (20..=21 + secs).contains(&answered),
        "the burst, then one a second: {answered} answered in {secs} s"
    );
    assert_eq!(flooding.net.dns_refused_for_rate(), refused);
    // One more: refused, unless a second has refilled a token since the last answer (on a
    // loaded machine the flood itself takes seconds); either way, within the rate.
    match dns(&mut flooding, 100, "api.example.test").0 {
        ResponseCode::NoError => answered += 1,
        ResponseCode::Refused => refused += 1,
        other => panic!("unexpected answer {other:?}"),
    }
    let secs = start.elapsed().as_secs();
    assert!(
        answered <= 21 + secs,
        "still held to the rate: {answered} answered in {secs} s"
    );
    assert_eq!(flooding.net.dns_refused_for_rate(), refused);
    for id in 0..30 {
        assert_eq!(
            dns(&mut other, id, "api.example.test"),
            (ResponseCode::NoError, vec![SERVER_IP]),
            "another sandbox's questions are answered"
        );
    }
    assert_eq!(other.net.dns_refused_for_rate(), 0);
    // The refusals are in the log: a record a second, each counting its share.
    let flows = flooding.net.flows().clone();
    flooding
        .guest
        .run_until("every refusal in an ended record", |_| {
            let records: Vec<_> = flows
                .records()
                .into_iter()
                .filter(|r| r.rule == "dns rate limit")
                .collect();
            let counted: u64 = records.iter().map(|r| 1 + r.coalesced).sum();
            (records.iter().all(|r| r.ended_ms.is_some()) && counted == refused).then_some(())
        });
}

#[test]
fn an_address_added_to_the_host_is_refused_as_the_host_at_once() {
    // Before, the host's addresses were read again every 2 s: until then a guest reached a
    // service on 0.0.0.0 through an address just added to the host.
    let mut s = setup(NetworkPolicy::AllowAll, &[]);
    let listener = s
        .internet
        .daemon
        .spawn(|| TcpListener::bind("0.0.0.0:0"))
        .join()
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || tcp_echo(listener));
    let added = v4(Ipv4Addr::new(198, 51, 100, 77), port);
    let (_, ok) = s.guest.connect(added);
    assert!(!ok, "not the host's yet, and nothing behind it");
    let r = wait_flow(&mut s, "the first try", |r| r.dst == added);
    assert_eq!(r.rule, "allow-all");

    s.internet
        .daemon
        .ip(&["addr", "add", "198.51.100.77/32", "dev", "lo"]);
    let (_, ok) = s.guest.connect(added);
    assert!(!ok, "the host's service is not reached");
    let refusal = wait_flow(&mut s, "the refusal", |r| {
        r.dst == added && r.verdict == FlowVerdict::Denied
    });
    assert_eq!(refusal.rule, "reserved: the host itself");

    s.internet
        .daemon
        .ip(&["addr", "del", "198.51.100.77/32", "dev", "lo"]);
    let (_, ok) = s.guest.connect(added);
    assert!(!ok);
    let r = wait_flow(&mut s, "the address gone", |r| {
        r.dst == added && r.id > refusal.id
    });
    assert_eq!(
        r.rule, "allow-all",
        "an address removed is not the host's any more"
    );
}

#[test]
fn sandboxes_share_the_daemons_flow_budget_and_get_it_back() {
    // Before, each sandbox was held only to its own limit: eighteen of them took every
    // descriptor of the daemon, whose API then failed with "Too many open files".
    let budget = Budget::new(16, budget::DEFAULT_BUFFER_BYTES);
    let policy = rules(None, &["127.0.0.1/32", "203.0.113.0/24"], &[]);
    let mut a = setup_budget(policy.clone(), &[], Limits::default(), budget.clone());
    let mut b = setup_budget(policy, &[], Limits::default(), budget.clone());
    let (server_a, _) = holding_server(&a);
    let (server_b, _) = holding_server(&b);

    // Past half the budget, a sandbox holds only its share: 16 / 2.
    let (open_a, refused) = a.guest.connect_many(server_a, 12);
    assert_eq!((open_a.len(), refused), (8, 4), "a's share holds");
    let r = wait_flow(&mut a, "a flow refused by the budget", |r| {
        r.rule == "daemon flow budget"
    });
    assert_eq!(r.verdict, FlowVerdict::Denied);
    assert_eq!(held_sockets(&a.internet.daemon, server_a.port()), 8);
    let (open_b, refused) = b.guest.connect_many(server_b, 12);
    assert_eq!((open_b.len(), refused), (8, 4), "b still gets its share");
    assert_eq!(held_sockets(&b.internet.daemon, server_b.port()), 8);
    assert_eq!(budget.sockets_used(), 16);

    // UDP bindings are host sockets too: none is left for them.
    let udp = a.guest.udp_socket();
    a.guest.udp_send(udp, v4(SERVER_IP, ECHO_PORT), b"ping");
    let r = wait_flow(&mut a, "a UDP flow refused by the budget", |r| {
        r.protocol == Protocol::Udp
    });
    assert_eq!(r.rule, "daemon flow budget");

    // What a's flows held comes back when they close.
    for &h in &open_a {
        a.guest.tcp(h).abort();
    }
    a.guest.run_until("a's flows given back", |_| {
        (budget.sockets_used() == 8).then_some(())
    });
    let (again, refused) = a.guest.connect_many(server_a, 4);
    assert_eq!((again.len(), refused), (4, 0));
    let full = budget::BufferSizes::FULL.total();
    assert_eq!(
        budget.buffers_used(),
        12 * full,
        "buffers are given back too"
    );

    // A sandbox that is gone no longer counts: a alone may use the whole budget.
    drop(b);
    a.guest.run_until("b's flows given back", |_| {
        (budget.sockets_used() == 4 && budget.networks() == 1).then_some(())
    });
    let (more, refused) = a.guest.connect_many(server_a, 14);
    assert_eq!((more.len(), refused), (12, 2), "the whole budget, no more");
    assert_eq!(held_sockets(&a.internet.daemon, server_a.port()), 16);
}
