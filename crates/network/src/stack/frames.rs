//! Frames between the device and smoltcp: the queues smoltcp reads and writes through its
//! `Device` trait, the look at each incoming frame that decides whether smoltcp sees it (ARP
//! and NDP only for the gateway, a TCP SYN only once the policy has spoken, UDP never: it is
//! relayed without smoltcp), and the building of UDP frames back to the guest.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use smoltcp::phy::{self, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use smoltcp::wire::{
    ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr,
    Icmpv6Message, Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet,
    Ipv6Repr, NdiscRepr, TcpPacket, UdpPacket, UdpRepr,
};

use crate::config::NetConfig;

/// Frames smoltcp may have queued for the device before it must wait.
const TX_QUEUE: usize = 256;
/// Sent frames' buffers kept for the next ones (at most this many, each of the largest
/// frame's size: 4 MiB at MTU 65520), so that a download does not allocate and zero a buffer
/// per frame.
const POOL: usize = 64;
/// Room for the largest headers smoltcp writes: Ethernet, IPv6, TCP with options.
const HEADERS: usize = 14 + 40 + 60;
/// How long unused buffers are kept: an idle sandbox's stack holds none.
const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// A frame to send: the first `len` bytes of a buffer that may be longer (a pooled one).
pub(crate) struct Frame {
    buf: Vec<u8>,
    len: usize,
}

impl Frame {
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl From<Vec<u8>> for Frame {
    fn from(buf: Vec<u8>) -> Self {
        Self {
            len: buf.len(),
            buf,
        }
    }
}

/// The frames in each direction between the device and smoltcp.
#[derive(Default)]
pub(crate) struct Queues {
    pub rx: VecDeque<Vec<u8>>,
    pub tx: VecDeque<Frame>,
    pub mtu: usize,
    /// The device checksums TCP for the stack (see `FrameDevice::offloads_checksums`).
    pub offload: bool,
    pool: Pool,
}

#[derive(Default)]
struct Pool {
    free: Vec<Vec<u8>>,
    last_used: Option<std::time::Instant>,
}

impl Queues {
    pub fn new(mtu: usize, offload: bool) -> Self {
        Self {
            mtu,
            offload,
            ..Self::default()
        }
    }

    /// Takes back the buffer of a frame the device has sent.
    pub fn sent(&mut self, frame: Frame) {
        if frame.buf.len() >= self.mtu + 14 && self.pool.free.len() < POOL {
            self.pool.free.push(frame.buf);
        }
    }

    /// Frees the pooled buffers once none has been used for a while.
    pub fn trim(&mut self) {
        if self.pool.last_used.is_some_and(|t| t.elapsed() > POOL_IDLE) {
            self.pool = Pool::default();
        }
    }
}

pub(crate) struct RxToken(Vec<u8>);
pub(crate) struct TxToken<'a> {
    tx: &'a mut VecDeque<Frame>,
    pool: &'a mut Pool,
    max: usize,
}

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.pool.last_used = Some(std::time::Instant::now());
        // A used buffer is not zeroed whole: smoltcp writes every header field and the
        // payload. The headers' room is zeroed (a few cache lines), so the only bytes it skips
        // (TCP option padding after the end-of-list option) are zeros as in a new buffer.
        let buf = match self.pool.free.pop() {
            Some(mut buf) if buf.len() >= len => {
                buf[..len.min(HEADERS)].fill(0);
                buf
            }
            _ => vec![0; len.max(self.max)],
        };
        let mut frame = Frame { buf, len };
        let r = f(frame.bytes_mut());
        self.tx.push_back(frame);
        r
    }
}

impl phy::Device for Queues {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: Instant) -> Option<(RxToken, TxToken<'_>)> {
        let frame = self.rx.pop_front()?;
        let max = self.mtu + 14;
        Some((
            RxToken(frame),
            TxToken {
                tx: &mut self.tx,
                pool: &mut self.pool,
                max,
            },
        ))
    }

    fn transmit(&mut self, _: Instant) -> Option<TxToken<'_>> {
        let max = self.mtu + 14;
        (self.tx.len() < TX_QUEUE).then_some(TxToken {
            tx: &mut self.tx,
            pool: &mut self.pool,
            max,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + 14;
        if self.offload {
            // The device marks each TCP segment for the sandbox's kernel to trust (or
            // complete if it forwards it), and that kernel's own segments may come partial.
            caps.checksum.tcp = phy::Checksum::None;
            caps.checksum.udp = phy::Checksum::None;
        }
        caps
    }
}

/// What to do with one frame from the guest.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// Give it to smoltcp.
    Stack,
    /// Not for us (ARP for another address, a protocol we do not route): drop it.
    Drop,
    /// A TCP SYN (without ACK): a new connection unless the tuple is known.
    Syn { src: SocketAddr, dst: SocketAddr },
    /// A UDP datagram; `payload` is its range in the frame.
    Udp {
        src: SocketAddr,
        dst: SocketAddr,
        payload: std::ops::Range<usize>,
    },
}

/// Looks at a frame from the guest. Malformed frames are dropped here or by smoltcp.
pub(crate) fn classify(frame: &[u8], cfg: &NetConfig) -> Incoming {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Incoming::Drop;
    };
    let l3 = eth.payload();
    let l3_offset = frame.len() - l3.len();
    match eth.ethertype() {
        EthernetProtocol::Arp => {
            let gateway_asked = ArpPacket::new_checked(l3)
                .and_then(|p| ArpRepr::parse(&p))
                .is_ok_and(|r| match r {
                    ArpRepr::EthernetIpv4 {
                        target_protocol_addr,
                        ..
                    } => target_protocol_addr == cfg.gateway_v4,
                    _ => false,
                });
            if gateway_asked {
                Incoming::Stack
            } else {
                Incoming::Drop
            }
        }
        EthernetProtocol::Ipv4 => {
            let Ok(ip) = Ipv4Packet::new_checked(l3) else {
                return Incoming::Drop;
            };
            if ip.more_frags() || ip.frag_offset() != 0 {
                return Incoming::Drop; // fragments are not reassembled: the MTU is known
            }
            let header = usize::from(ip.header_len());
            let (src, dst) = (IpAddr::V4(ip.src_addr()), IpAddr::V4(ip.dst_addr()));
            let end = usize::from(ip.total_len()).min(l3.len());
            let body = l3.get(header..end).unwrap_or_default();
            transport(ip.next_header(), src, dst, body, l3_offset + header, cfg)
        }
        EthernetProtocol::Ipv6 => {
            let Ok(ip) = Ipv6Packet::new_checked(l3) else {
                return Incoming::Drop;
            };
            let (src, dst) = (IpAddr::V6(ip.src_addr()), IpAddr::V6(ip.dst_addr()));
            let body = ip.payload();
            if ip.next_header() == IpProtocol::Icmpv6 {
                return icmpv6(src, dst, body, cfg);
            }
            transport(ip.next_header(), src, dst, body, l3_offset + 40, cfg)
        }
        _ => Incoming::Drop,
    }
}

fn transport(
    proto: IpProtocol,
    src: IpAddr,
    dst: IpAddr,
    body: &[u8],
    offset: usize,
    cfg: &NetConfig,
) -> Incoming {
    match proto {
        IpProtocol::Tcp => match TcpPacket::new_checked(body) {
            Ok(tcp) if tcp.syn() && !tcp.ack() => Incoming::Syn {
                src: SocketAddr::new(src, tcp.src_port()),
                dst: SocketAddr::new(dst, tcp.dst_port()),
            },
            Ok(_) => Incoming::Stack,
            Err(_) => Incoming::Drop,
        },
        IpProtocol::Udp => match UdpPacket::new_checked(body) {
            Ok(udp) => {
                let start = offset + 8;
                let len = usize::from(udp.len()).saturating_sub(8);
                Incoming::Udp {
                    src: SocketAddr::new(src, udp.src_port()),
                    dst: SocketAddr::new(dst, udp.dst_port()),
                    payload: start..start + len.min(udp.payload().len()),
                }
            }
            Err(_) => Incoming::Drop,
        },
        // Pings to the gateway are answered by smoltcp; ICMP elsewhere is not relayed.
        IpProtocol::Icmp if cfg.is_gateway(dst) => Incoming::Stack,
        _ => Incoming::Drop,
    }
}

/// Neighbour discovery only for the gateway; echo only to the gateway.
fn icmpv6(src: IpAddr, dst: IpAddr, body: &[u8], cfg: &NetConfig) -> Incoming {
    let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) else {
        return Incoming::Drop;
    };
    let Ok(packet) = Icmpv6Packet::new_checked(body) else {
        return Incoming::Drop;
    };
    match packet.msg_type() {
        Icmpv6Message::NeighborSolicit => {
            let caps = ChecksumCapabilities::default();
            match Icmpv6Repr::parse(&s, &d, &packet, &caps) {
                Ok(Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit { target_addr, .. }))
                    if target_addr == cfg.gateway_v6 =>
                {
                    Incoming::Stack
                }
                _ => Incoming::Drop,
            }
        }
        Icmpv6Message::NeighborAdvert => Incoming::Stack,
        Icmpv6Message::EchoRequest if cfg.is_gateway(dst) => Incoming::Stack,
        _ => Incoming::Drop,
    }
}

/// An Ethernet frame carrying a UDP datagram from `from` (a host or the gateway) to the guest.
/// `None` when it does not fit the MTU (it is dropped: fragments are not sent).
pub(crate) fn udp_frame(
    cfg: &NetConfig,
    guest_mac: EthernetAddress,
    from: SocketAddr,
    to: SocketAddr,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let udp = UdpRepr {
        src_port: from.port(),
        dst_port: to.port(),
    };
    let udp_len = 8 + payload.len();
    let caps = ChecksumCapabilities::default();
    let eth = EthernetRepr {
        src_addr: EthernetAddress(cfg.gateway_mac),
        dst_addr: guest_mac,
        ethertype: EthernetProtocol::Ipv4,
    };
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Udp,
                payload_len: udp_len,
                hop_limit: 64,
            };
            if ip.buffer_len() + udp_len > cfg.mtu {
                return None;
            }
            let mut frame = vec![0; 14 + ip.buffer_len() + udp_len];
            let mut f = EthernetFrame::new_unchecked(&mut frame[..]);
            eth.emit(&mut f);
            let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
            ip.emit(&mut p, &caps);
            let mut u = UdpPacket::new_unchecked(p.payload_mut());
            udp.emit(
                &mut u,
                &s.into(),
                &d.into(),
                payload.len(),
                |b| b.copy_from_slice(payload),
                &caps,
            );
            Some(frame)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Udp,
                payload_len: udp_len,
                hop_limit: 64,
            };
            if ip.buffer_len() + udp_len > cfg.mtu {
                return None;
            }
            let eth = EthernetRepr {
                ethertype: EthernetProtocol::Ipv6,
                ..eth
            };
            let mut frame = vec![0; 14 + ip.buffer_len() + udp_len];
            let mut f = EthernetFrame::new_unchecked(&mut frame[..]);
            eth.emit(&mut f);
            let mut p = Ipv6Packet::new_unchecked(f.payload_mut());
            ip.emit(&mut p);
            let mut u = UdpPacket::new_unchecked(p.payload_mut());
            udp.emit(
                &mut u,
                &s.into(),
                &d.into(),
                payload.len(),
                |b| b.copy_from_slice(payload),
                &caps,
            );
            Some(frame)
        }
        _ => None,
    }
}
