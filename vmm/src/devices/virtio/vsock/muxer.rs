//! The host side of hybrid vsock: the Unix listener host clients dial, their
//! `CONNECT <port>` handshakes, the bridged connections by port, and the RSTs owed to the
//! guest. It knows packets only as headers and payloads; the device (`device.rs`) moves them
//! between these and the virtqueues, as Firecracker splits its vsock device from its muxer.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vm_memory::Le16;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::connection::{Connection, Verdict};
use super::device::VsockConfig;
use super::packet::PacketHeader;
use super::*;
use crate::metrics::DeviceMetrics;

/// (host-side port, guest-side port)
pub(super) type Key = (u32, u32);

/// A host client that has connected but not yet sent its `CONNECT <port>` line.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

/// Host sockets and the connections bridged through them.
pub(super) struct Muxer {
    guest_cid: u64,
    /// Host clients connect here; guest connections to port P go to `<uds_path>_P`.
    uds_path: PathBuf,
    listener: UnixListener,
    /// Host sockets (listener, handshakes, connections), edge-triggered. Its own fd is what
    /// the device thread's event loop waits on.
    pub(super) epoll: Epoll,
    conns: HashMap<Key, Connection>,
    fd_to_conn: HashMap<RawFd, Key>,
    handshakes: HashMap<RawFd, Handshake>,
    /// RSTs owed to the guest for packets that matched no connection.
    pending_rst: VecDeque<(Key, u64)>,
    next_local_port: u32,
    metrics: Arc<DeviceMetrics>,
}

impl Muxer {
    /// Binds `<uds_path>` (a stale socket file there is replaced).
    pub(super) fn new(config: &VsockConfig, metrics: Arc<DeviceMetrics>) -> Result<Self, Error> {
        let name = config.uds_path.display().to_string();
        remove_stale_socket(&config.uds_path);
        let listener =
            UnixListener::bind(&config.uds_path).map_err(|e| Error::Listen(name.clone(), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Listen(name, e))?;
        let epoll = Epoll::new().map_err(Error::Epoll)?;
        let ev = EpollEvent::new(EventSet::IN, listener.as_raw_fd() as u64);
        epoll
            .ctl(ControlOperation::Add, listener.as_raw_fd(), ev)
            .map_err(Error::Epoll)?;
        Ok(Muxer {
            guest_cid: config.guest_cid,
            uds_path: config.uds_path.clone(),
            listener,
            epoll,
            conns: HashMap::new(),
            fd_to_conn: HashMap::new(),
            handshakes: HashMap::new(),
            pending_rst: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            metrics,
        })
    }

    /// The listener host clients dial.
    pub(super) fn listener_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Number of open connections.
    pub(super) fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Number of RSTs waiting for rx buffers.
    #[cfg(test)]
    pub(super) fn pending_rst_count(&self) -> usize {
        self.pending_rst.len()
    }

    /// The oldest RST owed to the guest: (key, destination CID, 0 meaning the guest's own).
    pub(super) fn next_rst(&self) -> Option<(Key, u64)> {
        self.pending_rst.front().copied()
    }

    /// The RST returned by `next_rst` was delivered.
    pub(super) fn rst_sent(&mut self) {
        self.pending_rst.pop_front();
    }

    /// Connections with something for the guest.
    pub(super) fn keys_with_outgoing(&self) -> Vec<Key> {
        self.conns
            .iter()
            .filter(|(_, c)| c.has_outgoing())
            .map(|(k, _)| *k)
            .collect()
    }

    pub(super) fn connection_mut(&mut self, key: Key) -> Option<&mut Connection> {
        self.conns.get_mut(&key)
    }

    fn watch(&self, fd: RawFd) {
        let ev = EpollEvent::new(
            EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED,
            fd as u64,
        );
        if let Err(e) = self.epoll.ctl(ControlOperation::Add, fd, ev) {
            tracing::warn!(error = %e, "vsock: cannot watch socket");
        }
    }

    fn unwatch(&self, fd: RawFd) {
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }

    fn add_connection(&mut self, conn: Connection) {
        let key = (conn.local_port, conn.peer_port);
        let fd = conn.stream().as_raw_fd();
        self.fd_to_conn.insert(fd, key);
        self.conns.insert(key, conn);
    }

    /// Owes the guest an RST; a guest that floods us without posting rx buffers loses the
    /// excess (counted) instead of growing the queue without bound.
    pub(super) fn queue_rst(&mut self, key: Key, dst_cid: u64) {
        if self.pending_rst.len() >= MAX_PENDING_RST {
            self.metrics.error();
            return;
        }
        self.pending_rst.push_back((key, dst_cid));
    }

    pub(super) fn remove_connection(&mut self, key: Key, rst: bool) {
        if let Some(conn) = self.conns.remove(&key) {
            let fd = conn.stream().as_raw_fd();
            self.unwatch(fd);
            self.fd_to_conn.remove(&fd);
        }
        if rst {
            self.queue_rst(key, 0);
        }
    }

    /// Drops every connection and owed RST (device reset).
    pub(super) fn reset(&mut self) {
        let keys: Vec<Key> = self.conns.keys().copied().collect();
        for key in keys {
            self.remove_connection(key, false);
        }
        self.pending_rst.clear();
    }

    /// Routes one guest packet.
    pub(super) fn dispatch(&mut self, hdr: &PacketHeader, data: &[u8]) {
        let key = (hdr.dst_port(), hdr.src_port());
        if hdr.type_() != TYPE_STREAM
            || hdr.dst_cid() != HOST_CID
            || hdr.src_cid() != self.guest_cid
        {
            self.metrics.error();
            if hdr.op() != OP_RST {
                self.queue_rst(key, hdr.src_cid());
            }
            return;
        }
        if let Some(conn) = self.conns.get_mut(&key) {
            if let Verdict::Close { rst } = conn.on_guest_packet(hdr, data) {
                self.remove_connection(key, rst);
            }
            return;
        }
        match hdr.op() {
            OP_REQUEST => self.connect_to_host(key, hdr, data),
            OP_RST => {}
            _ => self.queue_rst(key, 0),
        }
    }

    /// The guest connects to host port `key.0`: bridge to `<uds_path>_<port>`.
    fn connect_to_host(&mut self, key: Key, hdr: &PacketHeader, data: &[u8]) {
        if self.conns.len() >= MAX_CONNECTIONS {
            self.queue_rst(key, 0);
            return;
        }
        let path = format!("{}_{}", self.uds_path.display(), key.0);
        let stream = match connect_nonblocking(Path::new(&path)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(path, error = %e, "vsock: no host listener");
                self.queue_rst(key, 0);
                return;
            }
        };
        let mut conn = Connection::guest_initiated(key.0, key.1, stream);
        conn.on_guest_packet(
            &PacketHeader {
                op: Le16::from(OP_CREDIT_UPDATE),
                ..*hdr
            },
            data,
        );
        self.watch(conn.stream().as_raw_fd());
        self.add_connection(conn);
    }

    /// A host client asked for guest port `port`; the REQUEST goes out with the next rx fill.
    fn connect_to_guest(&mut self, stream: UnixStream, port: u32) {
        if self.conns.len() >= MAX_CONNECTIONS {
            return;
        }
        let local = self.next_local_port;
        self.next_local_port = self.next_local_port.wrapping_add(1).max(FIRST_LOCAL_PORT);
        let conn = Connection::host_initiated(local, port, stream);
        self.add_connection(conn);
    }

    /// Accepts new host clients.
    fn accept_host_clients(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err()
                        || self.handshakes.len() >= MAX_CONNECTIONS
                    {
                        continue;
                    }
                    let fd = stream.as_raw_fd();
                    self.watch(fd);
                    self.handshakes.insert(
                        fd,
                        Handshake {
                            stream,
                            line: Vec::new(),
                        },
                    );
                    self.read_handshake(fd);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    }

    /// Reads (part of) a `CONNECT <port>\n` line.
    fn read_handshake(&mut self, fd: RawFd) {
        let Some(hs) = self.handshakes.get_mut(&fd) else {
            return;
        };
        let mut byte = [0u8; 1];
        // Byte by byte, so no stream data after the newline is consumed here.
        loop {
            match hs.stream.read(&mut byte) {
                Ok(0) => {
                    self.drop_handshake(fd);
                    return;
                }
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => {
                    hs.line.push(byte[0]);
                    if hs.line.len() > MAX_CONNECT_LINE {
                        self.metrics.error();
                        self.drop_handshake(fd);
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.drop_handshake(fd);
                    return;
                }
            }
        }
        let Some(hs) = self.handshakes.remove(&fd) else {
            return;
        };
        match parse_connect(&hs.line) {
            Some(port) => self.connect_to_guest(hs.stream, port),
            None => {
                tracing::debug!("vsock: bad CONNECT line from host client");
                self.metrics.error();
                self.unwatch(fd);
            }
        }
    }

    fn drop_handshake(&mut self, fd: RawFd) {
        self.unwatch(fd);
        self.handshakes.remove(&fd);
    }

    /// A connection's host socket became readable or writable.
    fn host_socket_ready(&mut self, fd: RawFd, readable: bool, writable: bool) {
        if self.handshakes.contains_key(&fd) {
            self.read_handshake(fd);
            return;
        }
        let Some(&key) = self.fd_to_conn.get(&fd) else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&key) else {
            return;
        };
        if readable {
            conn.host_readable = true;
        }
        if writable && let Verdict::Close { rst } = conn.flush_to_host() {
            self.remove_connection(key, rst);
        }
    }

    /// Drains the host-socket poller without blocking; the caller then fills rx buffers.
    pub(super) fn handle_events(&mut self) {
        let mut events = vec![EpollEvent::default(); 64];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "vsock: epoll_wait failed");
                    return;
                }
            };
            if n == 0 {
                break;
            }
            for ev in &events[..n] {
                let fd = ev.fd();
                let set = EventSet::from_bits_truncate(ev.events());
                if fd == self.listener.as_raw_fd() {
                    self.accept_host_clients();
                } else {
                    let readable = set.intersects(
                        EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR,
                    );
                    self.host_socket_ready(fd, readable, set.contains(EventSet::OUT));
                }
            }
        }
    }
}

/// Connects to a Unix socket without ever blocking: this runs on a vCPU thread, and a host
/// listener with a full backlog must cost the guest an RST (EAGAIN), not a stalled vCPU.
fn connect_nonblocking(path: &Path) -> std::io::Result<UnixStream> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let addr = SocketAddrUnix::new(path)?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&fd, &addr)?;
    Ok(UnixStream::from(fd))
}

fn remove_stale_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
    {
        let _ = std::fs::remove_file(path);
    }
}

/// Parses `CONNECT <port>` (optionally with a trailing `\r`).
pub(super) fn parse_connect(line: &[u8]) -> Option<u32> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let port = line.strip_prefix("CONNECT ")?;
    port.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::VirtioDevice;
    use crate::devices::virtio::vsock::test_utils::*;
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
    use std::io::Write;
    use std::time::Duration;

    #[test]
    fn host_connects_to_guest_port() {
        let mut f = Fixture::new();
        f.post_rx(8);
        let mut host = UnixStream::connect(f.uds()).unwrap();
        host.write_all(b"CONNECT 1024\n").unwrap();
        f.pump();
        let got = f.received();
        assert_eq!(got.len(), 1);
        let req = got[0].0;
        assert_eq!(req.op(), OP_REQUEST);
        assert_eq!(req.dst_port(), 1024);
        let local = req.src_port();
        assert!(local >= FIRST_LOCAL_PORT);

        f.send(OP_RESPONSE, 1024, local, 0, &[]);
        host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut line = vec![0u8; format!("OK {local}\n").len()];
        host.read_exact(&mut line).unwrap();
        assert_eq!(line, format!("OK {local}\n").as_bytes());

        host.write_all(b"exec ls").unwrap();
        f.pump();
        let got = f.received();
        assert_eq!(got[0].1, b"exec ls");
        assert_eq!(got[0].0.dst_port(), 1024);

        // Host hangs up: the guest is told with a SHUTDOWN.
        drop(host);
        f.pump();
        let got = f.received();
        assert_eq!(got.last().unwrap().0.op(), OP_SHUTDOWN);
    }

    #[test]
    fn bad_connect_lines_are_dropped() {
        let mut f = Fixture::new();
        f.post_rx(8);
        let mut a = UnixStream::connect(f.uds()).unwrap();
        a.write_all(b"HELLO 5\n").unwrap();
        let mut b = UnixStream::connect(f.uds()).unwrap();
        b.write_all(&[b'C'; 100]).unwrap();
        f.pump();
        assert!(f.received().is_empty());
        a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(a.read(&mut buf).unwrap(), 0, "closed by the VMM");
        assert!(f.dev.metrics().snapshot("v").errors >= 2);
    }

    #[test]
    fn nonblocking_connect_refuses_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        assert!(connect_nonblocking(&p).is_err(), "nobody listens");
        // A listener that never accepts: fill its backlog, then the next connect must fail
        // at once rather than block. The backlog is 1, so the held sockets stay far below
        // any open-file limit (std's listeners take the system's somaxconn, often 4096).
        let l = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
        rustix::net::bind(&l, &SocketAddrUnix::new(&p).unwrap()).unwrap();
        rustix::net::listen(&l, 1).unwrap();
        let mut held = Vec::new();
        let start = std::time::Instant::now();
        let err = loop {
            match connect_nonblocking(&p) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 100, "a backlog of 1 filled up long ago");
        };
        assert_eq!(err.raw_os_error(), Some(libc::EAGAIN));
        assert!(start.elapsed() < Duration::from_secs(5));
        let long = dir.path().join("x".repeat(200));
        assert!(connect_nonblocking(&long).is_err());
    }

    #[test]
    fn parses_connect_lines() {
        assert_eq!(parse_connect(b"CONNECT 1024"), Some(1024));
        assert_eq!(parse_connect(b"CONNECT 5\r"), Some(5));
        assert_eq!(parse_connect(b"CONNECT"), None);
        assert_eq!(parse_connect(b"CONNECT -1"), None);
        assert_eq!(parse_connect(b"connect 1"), None);
    }
}
