//! Test fixtures: network namespaces the test creates (a private "internet" joined by a veth
//! pair to the namespace where the stack under test runs, addressed from 203.0.113.0/24),
//! real servers inside them (TCP echo, UDP echo, a DNS server for test names), the VMM's end of
//! the frame socket, and a guest: a second smoltcp interface speaking Ethernet over that
//! socket. No traffic leaves the namespaces the test created.

#![allow(dead_code)]

pub mod guest;
pub mod pki;
pub mod stack_setup;
pub mod tapnet;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{RData, Record, rdata::A};
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};

/// The stack's namespace address on the test internet.
pub const DAEMON_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The servers' address on the test internet.
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// A second server address, for subnet rules that tell two servers apart.
pub const SERVER2_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 3);
/// The servers' IPv6 address on the test internet (documentation range).
pub const SERVER_IP6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
pub const ECHO_PORT: u16 = 7;
pub const TLS_PORT: u16 = 443;

/// Fails the test when it cannot run here (not root, no `ip`) rather than passing silently.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests create network namespaces and need root"
    );
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace this test created; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(role: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "bjn-{role}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Self { name }
    }

    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all);
    }

    /// Moves the calling thread into this namespace (threads it starts inherit it).
    pub fn enter(&self) {
        let f = std::fs::File::open(format!("/run/netns/{}", self.name)).expect("open netns");
        setns(f, CloneFlags::CLONE_NEWNET).expect("setns");
    }

    /// Runs `f` on a new thread inside this namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(path).expect("open netns");
            setns(ns, CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The stack's namespace and a private internet behind it, with servers running.
pub struct Internet {
    pub daemon: Netns,
    pub net: Netns,
    /// Names the DNS server answers, all with an address on the internet.
    pub names: HashMap<String, Ipv4Addr>,
}

impl Internet {
    pub fn new(names: &[(&str, Ipv4Addr)]) -> Self {
        require_root();
        let daemon = Netns::new("d");
        let net = Netns::new("i");
        ip(&[
            "link",
            "add",
            "d0",
            "netns",
            &daemon.name,
            "type",
            "veth",
            "peer",
            "name",
            "i0",
            "netns",
            &net.name,
        ]);
        daemon.ip(&["addr", "add", "203.0.113.1/24", "dev", "d0"]);
        daemon.ip(&["link", "set", "d0", "up"]);
        net.ip(&["addr", "add", "203.0.113.2/24", "dev", "i0"]);
        net.ip(&["addr", "add", "203.0.113.3/24", "dev", "i0"]);
        net.ip(&["link", "set", "i0", "up"]);
        daemon.ip(&["-6", "addr", "add", "2001:db8::1/64", "dev", "d0", "nodad"]);
        net.ip(&["-6", "addr", "add", "2001:db8::2/64", "dev", "i0", "nodad"]);
        let names: HashMap<String, Ipv4Addr> =
            names.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        for server in [SERVER_IP, SERVER2_IP] {
            let tcp = bind_in(&net, move || TcpListener::bind((server, TLS_PORT)));
            std::thread::spawn(move || tcp_echo(tcp));
            let tcp = bind_in(&net, move || TcpListener::bind((server, ECHO_PORT)));
            std::thread::spawn(move || tcp_echo(tcp));
            let udp = bind_in(&net, move || UdpSocket::bind((server, ECHO_PORT)));
            std::thread::spawn(move || udp_echo(udp));
        }
        let tcp6 = bind_in(&net, || TcpListener::bind((SERVER_IP6, ECHO_PORT)));
        std::thread::spawn(move || tcp_echo(tcp6));
        let dns = bind_in(&net, || UdpSocket::bind((SERVER_IP, 53)));
        let zone = names.clone();
        std::thread::spawn(move || dns_server(dns, zone));
        Self { daemon, net, names }
    }
}

/// Binds a socket inside `ns` and returns it (it stays in that namespace).
fn bind_in<S: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> std::io::Result<S> + Send + 'static,
) -> S {
    ns.spawn(f).join().expect("bind thread").expect("bind")
}

/// Echoes every connection; a connection is held open until the client closes.
pub fn tcp_echo(listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { return };
        std::thread::spawn(move || {
            let mut buf = [0; 65536];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

fn udp_echo(socket: UdpSocket) {
    let mut buf = [0; 65536];
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        let _ = socket.send_to(&buf[..n], from);
    }
}

fn dns_server(socket: UdpSocket, zone: HashMap<String, Ipv4Addr>) {
    let mut buf = [0; 4096];
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        let Ok(q) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut r = Message::new();
        r.set_id(q.id())
            .set_message_type(MessageType::Response)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(q.recursion_desired())
            .set_recursion_available(true);
        r.add_queries(q.queries().to_vec());
        if let Some(edns) = q.extensions() {
            // Say we take the client's size, or it will not accept more than 512 bytes.
            r.set_edns(edns.clone());
        }
        let query = &q.queries()[0];
        let name = query.name().to_ascii().trim_end_matches('.').to_string();
        if name.starts_with("big.") {
            // More answers than fit 512 bytes: clients must get them over TCP.
            for i in 10..50 {
                r.add_answer(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(203, 0, 113, i))),
                ));
            }
            let _ = socket.send_to(&r.to_vec().expect("encode"), from);
            continue;
        }
        match zone.get(&name) {
            Some(addr) if query.query_type() == hickory_proto::rr::RecordType::A => {
                r.add_answer(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::A(A(*addr)),
                ));
            }
            Some(_) => {}
            None => {
                r.set_response_code(ResponseCode::NXDomain);
            }
        }
        let _ = socket.send_to(&r.to_vec().expect("encode"), from);
    }
}

/// A DNS query for `name` (type A).
pub fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id).set_recursion_desired(true);
    m.add_query(hickory_proto::op::Query::query(
        hickory_proto::rr::Name::from_ascii(name).expect("name"),
        hickory_proto::rr::RecordType::A,
    ));
    m.to_vec().expect("encode")
}

/// The response code and the IPv4 answers of a DNS response.
pub fn dns_answer(bytes: &[u8]) -> (ResponseCode, Vec<Ipv4Addr>) {
    let m = Message::from_vec(bytes).expect("a DNS response");
    let addrs = m
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    (m.response_code(), addrs)
}

/// The VMM's end of a frame socket: listens at a path and accepts one peer at a time.
pub struct VmmSide {
    pub path: PathBuf,
    listener: OwnedFd,
    _dir: tempfile::TempDir,
}

impl VmmSide {
    pub fn listen() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("net.sock");
        let listener = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        socket::bind(listener.as_raw_fd(), &UnixAddr::new(&path).expect("addr")).expect("bind");
        socket::listen(&listener, Backlog::new(1).expect("backlog")).expect("listen");
        Self {
            path,
            listener,
            _dir: dir,
        }
    }

    /// Waits for the daemon to connect.
    pub fn accept(&self) -> OwnedFd {
        let fd =
            socket::accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC).expect("accept");
        // SAFETY-free: accept4 returned a new descriptor that nothing else owns.
        unsafe_owned(fd)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[allow(unsafe_code)]
fn unsafe_owned(fd: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by accept4, is open, and has no other owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

pub fn v4(a: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(a), port)
}

/// Sockets in `ns` connected to `port` that a descriptor still holds (the kernel lists a
/// socket it finishes alone, after its descriptor closed, with inode 0).
pub fn held_sockets(ns: &Netns, port: u16) -> usize {
    ns.spawn(move || {
        let mut n = 0;
        for path in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
            let text = std::fs::read_to_string(path).expect("the namespace's sockets");
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                let remote = f[2].rsplit(':').next().expect("a port");
                let inode = f[9];
                if u16::from_str_radix(remote, 16) == Ok(port) && inode != "0" {
                    n += 1;
                }
            }
        }
        n
    })
    .join()
    .unwrap()
}
