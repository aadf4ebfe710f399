//! The namespace backend's frame path as tests set it up: a guest network namespace with a
//! tap `eth0` configured as the agent configures it (the Linux kernel is the guest), and the
//! stack on the tap's descriptor in the daemon's namespace, in front of the test internet.

use std::sync::Arc;
use std::time::Duration;

use belljar_network::config::{
    GATEWAY_V4, GATEWAY_V6, GUEST_V4, GUEST_V6, Limits, NetConfig, PREFIX_V4, PREFIX_V6, TAP_MTU,
};
use belljar_network::{
    Broker, DnsUpstream, FrameDevice, Network, NetworkPolicy, Options, TapDevice, tap,
};

use super::*;

/// How long a kernel socket in the guest may wait for one answer.
pub const IO_DEADLINE: Duration = Duration::from_secs(10);

pub struct Setup {
    pub guest: Netns,
    pub net: Network,
    pub internet: Internet,
    pub rt: tokio::runtime::Runtime,
}

pub fn setup(policy: NetworkPolicy) -> Setup {
    setup_with(policy, false, None)
}

pub fn setup_with(policy: NetworkPolicy, persistent: bool, broker: Option<Arc<Broker>>) -> Setup {
    setup_full(policy, persistent, broker, Limits::default())
}

/// A setup whose flows live by `limits`.
pub fn setup_limits(policy: NetworkPolicy, limits: Limits) -> Setup {
    setup_full(policy, false, None, limits)
}

fn setup_full(
    policy: NetworkPolicy,
    persistent: bool,
    broker: Option<Arc<Broker>>,
    limits: Limits,
) -> Setup {
    let internet = Internet::new(&[
        ("pypi.example.test", SERVER_IP),
        ("api.example.test", SERVER_IP),
    ]);
    let guest = Netns::new("g");
    let fd = guest
        .spawn(move || {
            let fd = tap::create("eth0")?;
            tap::set_persistent(&fd, persistent)?;
            Ok::<_, std::io::Error>(fd)
        })
        .join()
        .expect("tap thread")
        .expect("create tap");
    let cidr4 = format!("{GUEST_V4}/{PREFIX_V4}");
    let cidr6 = format!("{GUEST_V6}/{PREFIX_V6}");
    guest.ip(&["addr", "add", &cidr4, "dev", "eth0"]);
    guest.ip(&["-6", "addr", "add", &cidr6, "dev", "eth0", "nodad"]);
    guest.ip(&["link", "set", "eth0", "mtu", &TAP_MTU.to_string()]);
    guest.ip(&["link", "set", "eth0", "up"]);
    guest.ip(&["route", "add", "default", "via", &GATEWAY_V4.to_string()]);
    guest.ip(&[
        "-6",
        "route",
        "add",
        "default",
        "via",
        &GATEWAY_V6.to_string(),
    ]);
    let rt = internet
        .daemon
        .spawn(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime")
        })
        .join()
        .expect("runtime thread");
    let net = start_with(&internet, &rt, fd, policy, broker, limits);
    Setup {
        guest,
        net,
        internet,
        rt,
    }
}

/// Starts a network on the tap `fd` from inside the daemon's namespace (it reads the host's
/// addresses there).
pub fn start(
    internet: &Internet,
    rt: &tokio::runtime::Runtime,
    fd: std::os::fd::OwnedFd,
    policy: NetworkPolicy,
    broker: Option<Arc<Broker>>,
) -> Network {
    start_with(internet, rt, fd, policy, broker, Limits::default())
}

fn start_with(
    internet: &Internet,
    rt: &tokio::runtime::Runtime,
    fd: std::os::fd::OwnedFd,
    policy: NetworkPolicy,
    broker: Option<Arc<Broker>>,
    limits: Limits,
) -> Network {
    let handle = rt.handle().clone();
    internet
        .daemon
        .spawn(move || {
            let _in = handle.enter();
            let device = TapDevice::new(fd).expect("tap device");
            // A virtio-net header with checksum offload: neither the stack nor the guest's
            // kernel spends a pass over each segment on a checksum.
            assert!(device.offloads_checksums(), "the tap has no vnet header");
            Network::spawn(
                device,
                Options {
                    config: NetConfig {
                        mtu: TAP_MTU,
                        ..NetConfig::default()
                    },
                    policy,
                    dns: DnsUpstream::Servers(vec![v4(SERVER_IP, 53)]),
                    broker,
                    limits,
                    ..Options::default()
                },
            )
            .expect("network")
        })
        .join()
        .expect("start thread")
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _in = self.rt.enter();
    }
}
