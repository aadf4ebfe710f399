//! The stack under test in a network namespace of its own, with a guest on the VMM's end of
//! its frame socket and a private test internet behind it: what `stack.rs` and `limits.rs`
//! start each test with.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use belljar_network::budget::{self, Budget};
use belljar_network::config::Limits;
use belljar_network::{
    DnsUpstream, DomainPattern, FlowRecord, Network, NetworkPolicy, Options, Rules, SeqpacketDevice,
};
use hickory_proto::op::ResponseCode;

use super::guest::Guest;
use super::*;
pub struct Setup {
    pub guest: Guest,
    pub net: Network,
    pub vmm: VmmSide,
    pub internet: Internet,
    pub rt: tokio::runtime::Runtime,
}

pub const GATEWAY_DNS: SocketAddr = SocketAddr::new(
    IpAddr::V4(belljar_network::config::GATEWAY_V4),
    belljar_network::config::DNS_PORT,
);

pub fn setup(policy: NetworkPolicy, names: &[(&str, Ipv4Addr)]) -> Setup {
    setup_with(policy, names, Limits::default())
}

pub fn setup_with(policy: NetworkPolicy, names: &[(&str, Ipv4Addr)], limits: Limits) -> Setup {
    setup_budget(
        policy,
        names,
        limits,
        Budget::new(100_000, budget::DEFAULT_BUFFER_BYTES),
    )
}

pub fn setup_budget(
    policy: NetworkPolicy,
    names: &[(&str, Ipv4Addr)],
    limits: Limits,
    budget: Arc<Budget>,
) -> Setup {
    let internet = Internet::new(names);
    let vmm = VmmSide::listen();
    let path = vmm.path().to_path_buf();
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
                Network::spawn(
                    SeqpacketDevice::new(path),
                    Options {
                        policy,
                        dns: DnsUpstream::Servers(vec![v4(SERVER_IP, 53)]),
                        limits,
                        budget,
                        ..Options::default()
                    },
                )
                .expect("network")
            };
            (rt, net)
        })
        .join()
        .expect("start thread");
    let guest = Guest::new(vmm.accept());
    Setup {
        guest,
        net,
        vmm,
        internet,
        rt,
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // The network's task must stop before its runtime.
        let _in = self.rt.enter();
    }
}

pub fn rules(
    allow: Option<&[&str]>,
    subnets_allow: &[&str],
    subnets_deny: &[&str],
) -> NetworkPolicy {
    NetworkPolicy::Rules(Rules {
        allow: allow.map(|a| a.iter().map(|d| DomainPattern::parse(d).unwrap()).collect()),
        subnets_allow: subnets_allow.iter().map(|s| s.parse().unwrap()).collect(),
        subnets_deny: subnets_deny.iter().map(|s| s.parse().unwrap()).collect(),
        transforms: Vec::new(),
    })
}

/// Runs the guest until the flow log holds a record matching `f`.
pub fn wait_flow(s: &mut Setup, what: &str, f: impl Fn(&FlowRecord) -> bool) -> FlowRecord {
    let flows = s.net.flows().clone();
    s.guest
        .run_until(what, |_| flows.records().into_iter().rev().find(|r| f(r)))
}

pub fn echo(s: &mut Setup, dst: SocketAddr, data: &[u8]) -> bool {
    let (h, ok) = s.guest.connect(dst);
    if !ok {
        return false;
    }
    s.guest.send_all(h, data);
    let got = s.guest.recv(h, data.len());
    s.guest.tcp(h).close();
    got == data
}

pub fn dns(s: &mut Setup, id: u16, name: &str) -> (ResponseCode, Vec<Ipv4Addr>) {
    let reply = s.guest.udp_exchange(GATEWAY_DNS, &dns_query(id, name));
    dns_answer(&reply)
}
