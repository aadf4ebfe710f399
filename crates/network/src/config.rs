//! The sandbox side of the network, fixed for every sandbox: the agent configures `eth0` with
//! these values and points `/etc/resolv.conf` at the gateway, so they live here as constants
//! that both the daemon and the guest image can name.
//!
//! Every sandbox gets the same addresses because each has its own stack: nothing is shared,
//! so nothing collides, and a snapshot restored anywhere keeps working.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The gateway's Ethernet address (locally administered, unicast).
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0x62, 0x6a, 0x00, 0x00, 0x01];
/// The MAC address the daemon gives the sandbox's `eth0` (the VMM's virtio-net `mac`, the
/// tap's address inside the namespace). The stack learns the guest's MAC from its frames, so
/// another one works too.
pub const GUEST_MAC: [u8; 6] = [0x02, 0x62, 0x6a, 0x00, 0x00, 0x02];
/// The gateway's IPv4 address: the default route and the DNS server.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// The sandbox's IPv4 address.
pub const GUEST_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The IPv4 prefix length of the sandbox network.
pub const PREFIX_V4: u8 = 24;
/// The gateway's IPv6 address (a ULA; the default route and a DNS server).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd62, 0x656c, 0x6c6a, 0, 0, 0, 0, 1);
/// The sandbox's IPv6 address.
pub const GUEST_V6: Ipv6Addr = Ipv6Addr::new(0xfd62, 0x656c, 0x6c6a, 0, 0, 0, 0, 2);
/// The IPv6 prefix length of the sandbox network.
pub const PREFIX_V6: u8 = 64;
/// The IP MTU of a microVM's `eth0` (an Ethernet frame is at most this plus 14 bytes of
/// header): the virtio-net device offers no offloads, so the guest's buffers are sized for it.
pub const MTU: usize = 1500;
/// The IP MTU of a namespace sandbox's `eth0`, a tap whose frames never leave the host: the
/// largest the kernel allows, as pasta and slirp4netns use. Every frame costs the stack a
/// system call and a pass through smoltcp, so at 1500 a download was bound by frames per
/// second (about 55 000) long before bytes; at this size one frame carries 44 times as much.
pub const TAP_MTU: usize = 65520;
/// The DNS port on the gateway.
pub const DNS_PORT: u16 = 53;

/// The longest Ethernet frame a microVM's stack sends or accepts (no VLAN tag, no FCS).
pub const MAX_FRAME: usize = MTU + 14;

/// The addresses of one sandbox network. [`NetConfig::default`] is the fixed layout above;
/// tests and a future multi-NIC setup may pick others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub gateway_mac: [u8; 6],
    pub gateway_v4: Ipv4Addr,
    pub guest_v4: Ipv4Addr,
    pub prefix_v4: u8,
    pub gateway_v6: Ipv6Addr,
    pub guest_v6: Ipv6Addr,
    pub prefix_v6: u8,
    pub mtu: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            gateway_mac: GATEWAY_MAC,
            gateway_v4: GATEWAY_V4,
            guest_v4: GUEST_V4,
            prefix_v4: PREFIX_V4,
            gateway_v6: GATEWAY_V6,
            guest_v6: GUEST_V6,
            prefix_v6: PREFIX_V6,
            mtu: MTU,
        }
    }
}

impl NetConfig {
    /// The sandbox networks, which a flow may never leave the stack for.
    pub fn sandbox_nets(&self) -> [ipnet::IpNet; 2] {
        [
            ipnet::Ipv4Net::new(self.gateway_v4, self.prefix_v4)
                .expect("a valid IPv4 prefix")
                .trunc()
                .into(),
            ipnet::Ipv6Net::new(self.gateway_v6, self.prefix_v6)
                .expect("a valid IPv6 prefix")
                .trunc()
                .into(),
        ]
    }

    /// Whether `ip` is one of the gateway's addresses.
    pub fn is_gateway(&self, ip: IpAddr) -> bool {
        ip == IpAddr::V4(self.gateway_v4) || ip == IpAddr::V6(self.gateway_v6)
    }
}

/// What a sandbox's flows may hold and for how long: the bounds a NAT keeps on what its
/// clients leave behind. A guest that exits, crashes or just forgets its connections must
/// not keep the daemon's descriptors (nor its flow slots, which would refuse its next
/// connections); one that keeps a connection alive keeps it. [`Limits::default`] is for
/// sandboxes; tests shorten the times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open TCP connections one sandbox may have; more are refused (the daemon's memory and
    /// descriptors are not the guest's to spend).
    pub max_tcp_flows: usize,
    /// An established connection that carries no byte either way for this long is cut (a
    /// reset to both ends). Cloud NATs cut at 4 to 20 minutes; protocols that idle longer
    /// send heartbeats of their own.
    pub tcp_established_idle: Duration,
    /// A connection one side has closed while the other keeps it open (the guest exited and
    /// its kernel sent a FIN, or a server closed and the guest never did) that carries no
    /// byte for this long is cut.
    pub tcp_half_closed_idle: Duration,
    /// A connection whose handshake with the guest has not completed in this long is dropped.
    pub tcp_handshake: Duration,
    /// After this long without a segment from the guest, the gateway probes it (a TCP
    /// keep-alive): a guest that is gone answers with a reset, or not at all.
    pub tcp_keepalive: Duration,
    /// A guest that sends nothing for this long, not even an answer to the probes, is gone:
    /// its connection is cut.
    pub tcp_unanswered: Duration,
    /// A UDP binding that carries nothing for this long is closed.
    pub udp_idle: Duration,
    /// DNS questions a second the gateway takes from the sandbox, over UDP and TCP together;
    /// past them (and `dns_burst` saved up) it answers REFUSED without looking further, so
    /// that one sandbox's flood does not slow the daemon's answers to the others.
    pub dns_qps: u32,
    /// Questions the sandbox may ask at once, above `dns_qps`, after a quiet while.
    pub dns_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tcp_flows: 1024,
            tcp_established_idle: Duration::from_secs(30 * 60),
            tcp_half_closed_idle: Duration::from_secs(120),
            tcp_handshake: Duration::from_secs(30),
            tcp_keepalive: Duration::from_secs(60),
            tcp_unanswered: Duration::from_secs(130),
            udp_idle: Duration::from_secs(60),
            // A build resolving its dependencies asks a few hundred names at once.
            dns_qps: 200,
            dns_burst: 400,
        }
    }
}
