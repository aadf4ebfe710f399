//! The guest: a second smoltcp interface configured the way the agent configures `eth0`, on
//! the VMM's end of the frame socket. It is a real TCP/IP peer, driven step by step by the
//! test thread.

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use belljar_network::config::{GATEWAY_V4, GATEWAY_V6, GUEST_V4, GUEST_V6, PREFIX_V4, PREFIX_V6};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{MsgFlags, recv, send};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::{tcp, udp};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

/// How long any one step of a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

struct FdDevice {
    fd: OwnedFd,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a OwnedFd);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0; len];
        let r = f(&mut frame);
        let _ = send(self.0.as_raw_fd(), &frame, MsgFlags::MSG_DONTWAIT);
        r
    }
}

impl phy::Device for FdDevice {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;
    fn receive(&mut self, _: SmolInstant) -> Option<(Rx, Tx<'_>)> {
        let mut buf = vec![0; 65536];
        let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT).ok()?;
        if n == 0 {
            return None;
        }
        buf.truncate(n);
        Some((Rx(buf), Tx(&self.fd)))
    }
    fn transmit(&mut self, _: SmolInstant) -> Option<Tx<'_>> {
        Some(Tx(&self.fd))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = belljar_network::config::MAX_FRAME;
        caps
    }
}

pub struct Guest {
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    dev: FdDevice,
    next_port: u16,
}

fn now() -> SmolInstant {
    SmolInstant::now()
}

impl Guest {
    pub fn new(fd: OwnedFd) -> Self {
        let mut dev = FdDevice { fd };
        let config = Config::new(HardwareAddress::Ethernet(EthernetAddress([
            0x02, 0, 0, 0, 0, 0x15,
        ])));
        let mut iface = Interface::new(config, &mut dev, now());
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(GUEST_V4.into(), PREFIX_V4)).unwrap();
            a.push(IpCidr::new(GUEST_V6.into(), PREFIX_V6)).unwrap();
        });
        iface
            .routes_mut()
            .add_default_ipv4_route(GATEWAY_V4)
            .unwrap();
        iface
            .routes_mut()
            .add_default_ipv6_route(GATEWAY_V6)
            .unwrap();
        Self {
            iface,
            sockets: SocketSet::new(Vec::new()),
            dev,
            next_port: 40000,
        }
    }

    /// Hangs up the frame socket, as a VMM that exits does.
    pub fn disconnect(&mut self) {
        nix::sys::socket::shutdown(self.dev.fd.as_raw_fd(), nix::sys::socket::Shutdown::Both)
            .expect("shutdown");
    }

    /// Runs the interface once, then waits for a frame (or smoltcp's next timer).
    pub fn step(&mut self) {
        self.iface.poll(now(), &mut self.dev, &mut self.sockets);
        let wait = self
            .iface
            .poll_delay(now(), &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()))
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        let mut fds = [PollFd::new(self.dev.fd.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(wait.as_millis()).unwrap_or(50);
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }

    /// Steps until `f` returns something; fails the test after [`DEADLINE`].
    pub fn run_until<T>(&mut self, what: &str, mut f: impl FnMut(&mut Self) -> Option<T>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            self.step();
            if let Some(t) = f(self) {
                return t;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
        }
    }

    fn port(&mut self) -> u16 {
        self.next_port += 1;
        self.next_port
    }

    pub fn tcp(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    /// Connects to `dst`; true once established, false when refused or reset.
    pub fn connect(&mut self, dst: SocketAddr) -> (SocketHandle, bool) {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 256 * 1024]),
            tcp::SocketBuffer::new(vec![0; 256 * 1024]),
        );
        let port = self.port();
        s.connect(
            self.iface.context(),
            (IpAddress::from(dst.ip()), dst.port()),
            port,
        )
        .expect("connect");
        let h = self.sockets.add(s);
        let ok = self.run_until("the handshake", |g| match g.tcp(h).state() {
            tcp::State::Established => Some(true),
            tcp::State::Closed => Some(false),
            _ => None,
        });
        (h, ok)
    }

    /// Starts `n` connections to `dst` at once (with small buffers) and waits until each is
    /// established or refused; returns the established ones and how many were refused.
    pub fn connect_many(&mut self, dst: SocketAddr, n: usize) -> (Vec<SocketHandle>, usize) {
        let mut started = Vec::new();
        for _ in 0..n {
            let mut s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; 4096]),
                tcp::SocketBuffer::new(vec![0; 4096]),
            );
            let port = self.port();
            s.connect(
                self.iface.context(),
                (IpAddress::from(dst.ip()), dst.port()),
                port,
            )
            .expect("connect");
            started.push(self.sockets.add(s));
        }
        self.run_until("the handshakes", |g| {
            started
                .iter()
                .all(|&h| {
                    matches!(
                        g.tcp(h).state(),
                        tcp::State::Established | tcp::State::Closed
                    )
                })
                .then_some(())
        });
        let (open, refused): (Vec<_>, Vec<_>) = started
            .into_iter()
            .partition(|&h| self.tcp(h).state() == tcp::State::Established);
        for &h in &refused {
            self.sockets.remove(h);
        }
        (open, refused.len())
    }

    /// Sends all of `data`.
    pub fn send_all(&mut self, h: SocketHandle, data: &[u8]) {
        let mut off = 0;
        self.run_until("the send", |g| {
            let s = g.tcp(h);
            if s.can_send() {
                off += s.send_slice(&data[off..]).unwrap_or(0);
            }
            (off == data.len()).then_some(())
        });
    }

    /// Receives exactly `n` bytes, or fewer if the connection ends first.
    pub fn recv(&mut self, h: SocketHandle, n: usize) -> Vec<u8> {
        let mut got = Vec::new();
        self.run_until("data", |g| {
            let s = g.tcp(h);
            while s.can_recv() && got.len() < n {
                let mut buf = vec![0; n - got.len()];
                let k = s.recv_slice(&mut buf).unwrap_or(0);
                got.extend_from_slice(&buf[..k]);
            }
            (got.len() == n || !s.may_recv()).then_some(())
        });
        got
    }

    /// Waits until the connection is closed or reset by the other side.
    pub fn wait_closed(&mut self, h: SocketHandle) {
        self.run_until("the connection to end", |g| {
            let s = g.tcp(h);
            (!s.may_recv() || s.state() == tcp::State::Closed).then_some(())
        });
    }

    pub fn udp_socket(&mut self) -> SocketHandle {
        let meta = || vec![udp::PacketMetadata::EMPTY; 16];
        let mut s = udp::Socket::new(
            udp::PacketBuffer::new(meta(), vec![0; 65536]),
            udp::PacketBuffer::new(meta(), vec![0; 65536]),
        );
        let port = self.port();
        s.bind(port).expect("bind");
        self.sockets.add(s)
    }

    pub fn udp_send(&mut self, h: SocketHandle, dst: SocketAddr, data: &[u8]) {
        self.sockets
            .get_mut::<udp::Socket>(h)
            .send_slice(data, (IpAddress::from(dst.ip()), dst.port()))
            .expect("udp send");
    }

    /// Waits for one datagram and returns its source and payload.
    pub fn udp_recv(&mut self, h: SocketHandle) -> (SocketAddr, Vec<u8>) {
        self.run_until("a datagram", |g| {
            let s = g.sockets.get_mut::<udp::Socket>(h);
            let mut buf = vec![0; 65536];
            s.recv_slice(&mut buf).ok().map(|(n, meta)| {
                let from = SocketAddr::new(meta.endpoint.addr.into(), meta.endpoint.port);
                (from, buf[..n].to_vec())
            })
        })
    }

    /// Sends a datagram and waits for the answer.
    pub fn udp_exchange(&mut self, dst: SocketAddr, data: &[u8]) -> Vec<u8> {
        let h = self.udp_socket();
        self.udp_send(h, dst, data);
        let (from, reply) = self.udp_recv(h);
        assert_eq!(from, dst, "the answer comes from where the question went");
        self.sockets.remove(h);
        reply
    }
}
