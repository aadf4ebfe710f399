//! The memory the stack's flows held is given back to the system when they close. Alone in
//! its test binary, so that the process's resident size is this test's.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use belljar_network::budget::{self, Budget};
use belljar_network::config::Limits;
use belljar_network::{Network, NetworkPolicy, Options, Rules, SeqpacketDevice};
use common::guest::Guest;
use common::*;

/// The process's resident set, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a size")
}

/// A server on the daemon's loopback that accepts, reads, and never closes.
fn holding_server(internet: &Internet) -> SocketAddr {
    let listener = internet
        .daemon
        .spawn(|| TcpListener::bind("127.0.0.1:0"))
        .join()
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                std::thread::park();
            });
        }
    });
    addr
}

#[test]
fn the_buffers_of_closed_flows_are_given_back_to_the_system() {
    // Before, glibc kept every page the flows' buffers had touched: 1000 flows opened and
    // closed three times left the process at 400 MB, and there it stayed once the network
    // was gone.
    const FLOWS: usize = 1000;
    let internet = Internet::new(&[]);
    let vmm = VmmSide::listen();
    let path = vmm.path().to_path_buf();
    let budget = Budget::new(100_000, budget::DEFAULT_BUFFER_BYTES);
    let limits = Limits {
        max_tcp_flows: 100_000,
        // A reset the guest sends that is lost is made up for within seconds.
        tcp_keepalive: Duration::from_secs(1),
        tcp_unanswered: Duration::from_secs(3),
        ..Limits::default()
    };
    let policy = NetworkPolicy::Rules(Rules {
        allow: None,
        subnets_allow: vec!["127.0.0.1/32".parse().unwrap()],
        subnets_deny: Vec::new(),
        transforms: Vec::new(),
    });
    let b = budget.clone();
    let (rt, net) = internet
        .daemon
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let net = {
                let _in = rt.enter();
                let options = Options {
                    policy,
                    limits,
                    budget: b,
                    ..Options::default()
                };
                Network::spawn(SeqpacketDevice::new(path), options).expect("network")
            };
            (rt, net)
        })
        .join()
        .expect("start thread");
    let mut guest = Guest::new(vmm.accept());
    let server = holding_server(&internet);

    let mut peak = 0;
    let mut closed = 0;
    // The first round's buffers are fresh pages, untouched; later rounds get memory the
    // allocator recycled, which it clears.
    for _ in 0..3 {
        let mut open = Vec::new();
        while open.len() < FLOWS {
            let (more, refused) = guest.connect_many(server, (FLOWS - open.len()).min(200));
            assert_eq!(refused, 0);
            for &h in &more {
                guest.send_all(h, &[7; 2000]);
            }
            open.extend(more);
        }
        peak = peak.max(rss_kib());
        for &h in &open {
            guest.tcp(h).abort();
        }
        guest.run_until("every flow closed", |_| {
            (budget.sockets_used() == 0 && budget.buffers_used() == 0).then_some(())
        });
        for &h in &open {
            guest.sockets.remove(h);
        }
        closed = rss_kib(); // as of the last round
    }
    drop(net);
    drop(rt);
    let gone = rss_kib();
    eprintln!("RSS KiB: peak {peak}, all flows closed {closed}, network gone {gone}");
    assert!(
        peak > 100 * 1024,
        "1000 flows' buffers were resident: {peak} KiB"
    );
    assert!(
        closed < peak / 2,
        "closed flows' memory is given back: {closed} KiB of {peak}"
    );
    assert!(
        gone < peak / 4,
        "a network's memory is given back: {gone} KiB of {peak}"
    );
}
