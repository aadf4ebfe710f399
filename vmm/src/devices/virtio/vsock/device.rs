//! The virtio-vsock device model: virtqueues on one side, bridged Unix sockets on the other.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{Le16, Le32, Le64};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::connection::{Connection, Outgoing, Verdict};
use super::packet::{HEADER_SIZE, PacketHeader};
use super::*;
use crate::devices::virtio::{
    ActivateError, TYPE_VSOCK, VIRTIO_F_VERSION_1, VirtioDevice, VirtioInterrupt, add_used,
    expect_queues, pop_chain,
};
use crate::memory::GuestMemory;
use crate::metrics::DeviceMetrics;

/// How the vsock device is set up.
#[derive(Debug, Clone)]
pub struct VsockConfig {
    pub guest_cid: u64,
    /// Host clients connect here; guest connections to port P go to `<uds_path>_P`.
    pub uds_path: PathBuf,
}

/// (host-side port, guest-side port)
type Key = (u32, u32);

struct Active {
    mem: GuestMemory,
    interrupt: Arc<VirtioInterrupt>,
    queues: Vec<Queue>,
}

/// A host client that has connected but not yet sent its `CONNECT <port>` line.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

/// Hybrid virtio-vsock.
pub struct Vsock {
    config: VsockConfig,
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
    active: Option<Active>,
    metrics: Arc<DeviceMetrics>,
}

impl Vsock {
    /// Binds `<uds_path>` (a stale socket file there is replaced).
    pub fn new(config: VsockConfig) -> Result<Self, Error> {
        if config.guest_cid < 3 || config.guest_cid > u64::from(u32::MAX) {
            return Err(Error::BadCid(config.guest_cid));
        }
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
        Ok(Vsock {
            config,
            listener,
            epoll,
            conns: HashMap::new(),
            fd_to_conn: HashMap::new(),
            handshakes: HashMap::new(),
            pending_rst: VecDeque::new(),
            next_local_port: FIRST_LOCAL_PORT,
            active: None,
            metrics: Arc::new(DeviceMetrics::default()),
        })
    }

    /// Number of open connections.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
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
    fn queue_rst(&mut self, key: Key, dst_cid: u64) {
        if self.pending_rst.len() >= MAX_PENDING_RST {
            self.metrics.error();
            return;
        }
        self.pending_rst.push_back((key, dst_cid));
    }

    fn remove_connection(&mut self, key: Key, rst: bool) {
        if let Some(conn) = self.conns.remove(&key) {
            let fd = conn.stream().as_raw_fd();
            self.unwatch(fd);
            self.fd_to_conn.remove(&fd);
        }
        if rst {
            self.queue_rst(key, 0);
        }
    }

    /// Handles everything the guest put on the tx queue.
    fn process_tx(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let mut packets = Vec::new();
        let mut used_any = false;
        let tx = &mut active.queues[TX_QUEUE as usize];
        while let Some(chain) = pop_chain(tx, &active.mem, &self.metrics) {
            let head = chain.head_index();
            match read_packet(&active.mem, chain) {
                Ok(p) => packets.push(p),
                Err(msg) => {
                    tracing::debug!(msg, "vsock: malformed tx packet");
                    self.metrics.error();
                }
            }
            used_any |= add_used(tx, &active.mem, head, 0, &self.metrics);
        }
        if used_any {
            active.interrupt.signal_used_queue();
        }
        for (hdr, data) in packets {
            self.metrics.add_in(data.len() as u64);
            self.metrics.request();
            self.dispatch(&hdr, &data);
        }
        self.process_rx();
    }

    /// Routes one guest packet.
    fn dispatch(&mut self, hdr: &PacketHeader, data: &[u8]) {
        let key = (hdr.dst_port(), hdr.src_port());
        if hdr.type_() != TYPE_STREAM
            || hdr.dst_cid() != HOST_CID
            || hdr.src_cid() != self.config.guest_cid
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
        let path = format!("{}_{}", self.config.uds_path.display(), key.0);
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

    /// A host client asked for guest port `port`.
    pub(super) fn connect_to_guest(&mut self, stream: UnixStream, port: u32) {
        if self.conns.len() >= MAX_CONNECTIONS {
            return;
        }
        let local = self.next_local_port;
        self.next_local_port = self.next_local_port.wrapping_add(1).max(FIRST_LOCAL_PORT);
        let conn = Connection::host_initiated(local, port, stream);
        self.add_connection(conn);
        self.process_rx();
    }

    /// Fills rx buffers with packets for the guest (control packets first, then data, one
    /// packet per connection per round so no stream starves the others).
    pub(super) fn process_rx(&mut self) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        self.fill_rx(&mut active);
        self.active = Some(active);
    }

    fn fill_rx(&mut self, active: &mut Active) {
        let cid = self.config.guest_cid;
        let mut buf = vec![0u8; MAX_PKT_DATA as usize];
        let mut used_any = false;
        let rx = &mut active.queues[RX_QUEUE as usize];
        'outer: loop {
            let mut progressed = false;
            while let Some(&((local, peer), dst_cid)) = self.pending_rst.front() {
                let Some(chain) = pop_chain(rx, &active.mem, &self.metrics) else {
                    break 'outer;
                };
                let head = chain.head_index();
                let hdr = make_header(
                    if dst_cid == 0 { cid } else { dst_cid },
                    local,
                    peer,
                    Outgoing {
                        op: OP_RST,
                        flags: 0,
                        len: 0,
                    },
                    0,
                );
                let len = write_packet(&active.mem, chain, &hdr, &[]).unwrap_or(0);
                used_any |= add_used(rx, &active.mem, head, len, &self.metrics);
                self.pending_rst.pop_front();
                progressed = true;
            }
            let keys: Vec<Key> = self
                .conns
                .iter()
                .filter(|(_, c)| c.has_outgoing())
                .map(|(k, _)| *k)
                .collect();
            for key in keys {
                let Some(chain) = pop_chain(rx, &active.mem, &self.metrics) else {
                    break 'outer;
                };
                let Some(conn) = self.conns.get_mut(&key) else {
                    rx.go_to_previous_position();
                    continue;
                };
                // The payload must fit the driver's buffer (Linux posts 4 KiB + header).
                let room = match chain.clone().writer(&active.mem) {
                    Ok(w) if w.available_bytes() >= HEADER_SIZE => {
                        w.available_bytes() - HEADER_SIZE
                    }
                    _ => {
                        tracing::debug!("vsock: rx buffer unusable or smaller than a header");
                        self.metrics.error();
                        let head = chain.head_index();
                        used_any |= add_used(rx, &active.mem, head, 0, &self.metrics);
                        progressed = true;
                        continue;
                    }
                };
                let room = room.min(buf.len());
                let Some(out) = conn.next_outgoing(&mut buf[..room]) else {
                    // Nothing after all (the socket had no data): give the buffer back.
                    rx.go_to_previous_position();
                    continue;
                };
                let head = chain.head_index();
                let hdr = make_header(cid, conn.local_port, conn.peer_port, out, conn.fwd_cnt());
                let data = &buf[..out.len as usize];
                match write_packet(&active.mem, chain, &hdr, data) {
                    Ok(len) => {
                        self.metrics.add_out(data.len() as u64);
                        used_any |= add_used(rx, &active.mem, head, len, &self.metrics);
                    }
                    Err(msg) => {
                        tracing::debug!(msg, "vsock: unusable rx buffer");
                        self.metrics.error();
                        used_any |= add_used(rx, &active.mem, head, 0, &self.metrics);
                        // The bytes read from the host are lost; the stream cannot continue.
                        self.queue_rst(key, 0);
                        self.remove_connection(key, false);
                    }
                }
                progressed = true;
                if out.op == OP_RST {
                    self.remove_connection(key, false);
                }
            }
            if !progressed {
                break;
            }
        }
        if used_any {
            active.interrupt.signal_used_queue();
        }
    }

    /// Accepts new host clients.
    pub(super) fn accept_host_clients(&mut self) {
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
    pub(super) fn read_handshake(&mut self, fd: RawFd) {
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
    pub(super) fn host_socket_ready(&mut self, fd: RawFd, readable: bool, writable: bool) {
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

    /// Drains the host-socket poller (non-blocking) and moves data to the guest.
    pub fn handle_host_events(&mut self) {
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
        self.process_rx();
    }
}

/// Connects to a Unix socket without ever blocking: this runs on a vCPU thread, and a host
/// listener with a full backlog must cost the guest an RST, not a stalled vCPU.
fn connect_nonblocking(path: &Path) -> std::io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket that nothing else owns; the stream closes it on drop.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: `addr` is a valid sockaddr_un that outlives the call, and the length passed is
    // its size.
    let r = unsafe {
        libc::connect(
            fd,
            (&raw const addr).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stream)
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

fn make_header(dst_cid: u64, local: u32, peer: u32, out: Outgoing, fwd_cnt: u32) -> PacketHeader {
    PacketHeader {
        src_cid: Le64::from(HOST_CID),
        dst_cid: Le64::from(dst_cid),
        src_port: Le32::from(local),
        dst_port: Le32::from(peer),
        len: Le32::from(out.len),
        type_: Le16::from(TYPE_STREAM),
        op: Le16::from(out.op),
        flags: Le32::from(out.flags),
        buf_alloc: Le32::from(CONN_BUF_ALLOC),
        fwd_cnt: Le32::from(fwd_cnt),
    }
}

fn read_packet(
    mem: &GuestMemory,
    chain: virtio_queue::DescriptorChain<&GuestMemory>,
) -> Result<(PacketHeader, Vec<u8>), &'static str> {
    let mut reader = chain.reader(mem).map_err(|_| "bad descriptors")?;
    let hdr: PacketHeader = reader.read_obj().map_err(|_| "short header")?;
    let len = hdr.payload_len();
    if len > MAX_PKT_DATA {
        return Err("payload too large");
    }
    if len as usize > reader.available_bytes() {
        return Err("payload longer than its buffers");
    }
    let mut data = vec![0u8; len as usize];
    reader
        .read_exact(&mut data)
        .map_err(|_| "cannot read payload")?;
    Ok((hdr, data))
}

fn write_packet(
    mem: &GuestMemory,
    chain: virtio_queue::DescriptorChain<&GuestMemory>,
    hdr: &PacketHeader,
    data: &[u8],
) -> Result<u32, &'static str> {
    let mut writer = chain.writer(mem).map_err(|_| "bad descriptors")?;
    if writer.available_bytes() < HEADER_SIZE + data.len() {
        return Err("rx buffer too small");
    }
    writer.write_obj(*hdr).map_err(|_| "cannot write header")?;
    std::io::Write::write_all(&mut writer, data).map_err(|_| "cannot write payload")?;
    Ok((HEADER_SIZE + data.len()) as u32)
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        TYPE_VSOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, _features: u64) {}

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_vsock_config { le64 guest_cid; }
        let config = self.config.guest_cid.to_le_bytes();
        data.fill(0);
        let start = offset as usize;
        if start < config.len() {
            let n = data.len().min(config.len() - start);
            data[..n].copy_from_slice(&config[start..start + n]);
        }
    }

    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let queues = Vec::from(expect_queues::<3>(queues)?);
        self.active = Some(Active {
            mem,
            interrupt,
            queues,
        });
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        match index {
            RX_QUEUE => self.process_rx(),
            TX_QUEUE => self.process_tx(),
            EVENT_QUEUE => {}
            _ => self.metrics.error(),
        }
    }

    fn reset(&mut self) {
        self.active = None;
        let keys: Vec<Key> = self.conns.keys().copied().collect();
        for key in keys {
            self.remove_connection(key, false);
        }
        self.pending_rst.clear();
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn metrics(&self) -> Arc<DeviceMetrics> {
        self.metrics.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::CountingInterrupt;
    use crate::devices::virtio::test_utils::TestQueue;
    use std::io::Write;
    use std::time::Duration;
    use vm_memory::{Bytes, GuestAddress};

    const GUEST_CID: u64 = 3;
    const TX_PKT: u64 = 0x20000;
    const RX_BUFS: u64 = 0x40000;

    struct Fixture {
        mem: GuestMemory,
        rx: TestQueue,
        tx: TestQueue,
        dev: Vsock,
        dir: tempfile::TempDir,
        next_tx_desc: u16,
        next_rx_desc: u16,
        rx_seen: u16,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let mem = crate::memory::create(1 << 20).unwrap();
            let rx = TestQueue::new(&mem, 0x1000, 64);
            let tx = TestQueue::new(&mem, 0x3000, 64);
            let ev = TestQueue::new(&mem, 0x5000, 64);
            let mut dev = Vsock::new(VsockConfig {
                guest_cid: GUEST_CID,
                uds_path: dir.path().join("v.sock"),
            })
            .unwrap();
            let irq = Arc::new(VirtioInterrupt::new(Arc::new(CountingInterrupt::default())));
            dev.activate(mem.clone(), irq, vec![rx.queue(), tx.queue(), ev.queue()])
                .unwrap();
            Fixture {
                mem,
                rx,
                tx,
                dev,
                dir,
                next_tx_desc: 0,
                next_rx_desc: 0,
                rx_seen: 0,
            }
        }

        fn uds(&self) -> PathBuf {
            self.dir.path().join("v.sock")
        }

        /// The guest sends a packet.
        fn send(&mut self, op: u16, src_port: u32, dst_port: u32, flags: u32, data: &[u8]) {
            let hdr = PacketHeader {
                src_cid: Le64::from(GUEST_CID),
                dst_cid: Le64::from(HOST_CID),
                src_port: Le32::from(src_port),
                dst_port: Le32::from(dst_port),
                len: Le32::from(data.len() as u32),
                type_: Le16::from(TYPE_STREAM),
                op: Le16::from(op),
                flags: Le32::from(flags),
                buf_alloc: Le32::from(65536),
                fwd_cnt: Le32::from(0),
            };
            let slot = u64::from(self.next_tx_desc % 64) * 0x200;
            let at = TX_PKT + slot;
            self.mem.write_obj(hdr, GuestAddress(at)).unwrap();
            self.mem
                .write_slice(data, GuestAddress(at + HEADER_SIZE as u64))
                .unwrap();
            let d = self.next_tx_desc % 64;
            self.tx.add_chain(
                &self.mem,
                d,
                &[(at, (HEADER_SIZE + data.len()) as u32, false)],
            );
            self.next_tx_desc += 1;
            self.dev.queue_notify(TX_QUEUE);
        }

        /// The guest posts `n` rx buffers of 4 KiB.
        fn post_rx(&mut self, n: u16) {
            for _ in 0..n {
                let d = self.next_rx_desc % 64;
                let at = RX_BUFS + u64::from(d) * 0x1000;
                self.rx.add_chain(&self.mem, d, &[(at, 0x1000, true)]);
                self.next_rx_desc += 1;
            }
            self.dev.queue_notify(RX_QUEUE);
        }

        /// Packets the device delivered since the last call.
        fn received(&mut self) -> Vec<(PacketHeader, Vec<u8>)> {
            let mut out = Vec::new();
            while self.rx_seen != self.rx.used_idx(&self.mem) {
                let (head, len) = self.rx.used(&self.mem, self.rx_seen);
                self.rx_seen += 1;
                let at = RX_BUFS + u64::from(head) * 0x1000;
                if len == 0 {
                    continue;
                }
                let hdr: PacketHeader = self.mem.read_obj(GuestAddress(at)).unwrap();
                let mut data = vec![0u8; hdr.payload_len() as usize];
                self.mem
                    .read_slice(&mut data, GuestAddress(at + HEADER_SIZE as u64))
                    .unwrap();
                out.push((hdr, data));
            }
            out
        }

        fn pump(&mut self) {
            // Give the kernel a moment to deliver socket readiness.
            std::thread::sleep(Duration::from_millis(5));
            self.dev.handle_host_events();
        }
    }

    #[test]
    fn guest_connects_to_host_port() {
        let mut f = Fixture::new();
        let listener = UnixListener::bind(format!("{}_52", f.uds().display())).unwrap();
        f.post_rx(8);
        f.send(OP_REQUEST, 1000, 52, 0, &[]);
        let (mut host, _) = listener.accept().unwrap();
        let got = f.received();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.op(), OP_RESPONSE);
        assert_eq!((got[0].0.src_port(), got[0].0.dst_port()), (52, 1000));
        assert_eq!(got[0].0.dst_cid(), GUEST_CID);

        f.send(OP_RW, 1000, 52, 0, b"ping");
        let mut buf = [0u8; 4];
        host.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");

        host.write_all(b"pong").unwrap();
        f.pump();
        let got = f.received();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.op(), OP_RW);
        assert_eq!(got[0].1, b"pong");

        f.send(OP_RST, 1000, 52, 0, &[]);
        assert_eq!(f.dev.connection_count(), 0);
        let m = f.dev.metrics().snapshot("vsock");
        assert_eq!((m.bytes_in, m.bytes_out), (4, 4));
    }

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
    fn host_data_is_split_to_fit_linux_sized_rx_buffers() {
        let mut f = Fixture::new();
        // Like Linux: a 44-byte header descriptor chained to a 4 KiB payload descriptor.
        for i in 0..4u16 {
            let at = RX_BUFS + u64::from(i) * 0x2000;
            f.rx.add_chain(
                &f.mem,
                2 * i,
                &[(at, HEADER_SIZE as u32, true), (at + 0x100, 4096, true)],
            );
        }
        f.dev.queue_notify(RX_QUEUE);
        let mut host = UnixStream::connect(f.uds()).unwrap();
        host.write_all(b"CONNECT 9\n").unwrap();
        f.pump();
        assert_eq!(f.rx.used_idx(&f.mem), 1); // REQUEST
        let local = {
            let hdr: PacketHeader = f.mem.read_obj(GuestAddress(RX_BUFS)).unwrap();
            hdr.src_port()
        };
        f.send(OP_RESPONSE, 9, local, 0, &[]);
        let mut ok = vec![0u8; format!("OK {local}\n").len()];
        host.read_exact(&mut ok).unwrap();
        host.write_all(&vec![7u8; 10000]).unwrap();
        f.pump();
        let mut sizes = Vec::new();
        for i in 1..f.rx.used_idx(&f.mem) {
            let (head, len) = f.rx.used(&f.mem, i);
            let at = RX_BUFS + u64::from(head / 2) * 0x2000;
            let hdr: PacketHeader = f.mem.read_obj(GuestAddress(at)).unwrap();
            assert_eq!(hdr.op(), OP_RW);
            assert_eq!(len as usize, HEADER_SIZE + hdr.payload_len() as usize);
            sizes.push(hdr.payload_len());
        }
        assert_eq!(sizes, vec![4096, 4096, 1808]);
        assert_eq!(f.dev.connection_count(), 1);
    }

    #[test]
    fn host_data_waits_for_rx_buffers() {
        let mut f = Fixture::new();
        let mut host = UnixStream::connect(f.uds()).unwrap();
        host.write_all(b"CONNECT 7\n").unwrap();
        f.pump();
        assert!(f.received().is_empty(), "no rx buffers yet");
        f.post_rx(1);
        let got = f.received();
        assert_eq!(got[0].0.op(), OP_REQUEST);
    }

    #[test]
    fn refused_and_stray_packets_get_rst() {
        let mut f = Fixture::new();
        f.post_rx(8);
        // Nobody listens on <uds>_99.
        f.send(OP_REQUEST, 1, 99, 0, &[]);
        // Data for a connection that does not exist.
        f.send(OP_RW, 2, 98, 0, b"x");
        let got = f.received();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|(h, _)| h.op() == OP_RST));
        assert_eq!(f.dev.connection_count(), 0);
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
    fn malformed_tx_packets_never_panic() {
        let mut f = Fixture::new();
        f.post_rx(8);
        // Header shorter than 44 bytes.
        f.tx.add_chain(&f.mem, 10, &[(TX_PKT, 10, false)]);
        // Length larger than the buffer.
        let hdr = PacketHeader {
            len: Le32::from(60000),
            src_cid: Le64::from(GUEST_CID),
            dst_cid: Le64::from(HOST_CID),
            type_: Le16::from(TYPE_STREAM),
            op: Le16::from(OP_RW),
            ..Default::default()
        };
        f.mem.write_obj(hdr, GuestAddress(TX_PKT + 0x800)).unwrap();
        f.tx.add_chain(&f.mem, 11, &[(TX_PKT + 0x800, 44, false)]);
        // Buffer outside guest memory; head outside the table.
        f.tx.add_chain(&f.mem, 12, &[(0xdead_0000, 44, false)]);
        f.tx.make_available(&f.mem, 500);
        f.dev.queue_notify(TX_QUEUE);
        f.dev.queue_notify(9);
        // Wrong CIDs: refused with an RST.
        f.send(OP_REQUEST, 1, 2, 0, &[]);
        assert_eq!(f.tx.used_idx(&f.mem), 4);
        assert!(f.dev.metrics().snapshot("v").errors >= 4);
        assert_eq!(f.dev.connection_count(), 0);
    }

    #[test]
    fn nonblocking_connect_refuses_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        assert!(connect_nonblocking(&p).is_err(), "nobody listens");
        // A listener that never accepts: fill its backlog, then the next connect must fail
        // at once rather than block.
        let _l = UnixListener::bind(&p).unwrap();
        let mut held = Vec::new();
        let start = std::time::Instant::now();
        let err = loop {
            match connect_nonblocking(&p) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 100_000);
        };
        assert_eq!(err.raw_os_error(), Some(libc::EAGAIN));
        assert!(start.elapsed() < Duration::from_secs(5));
        let long = dir.path().join("x".repeat(200));
        assert!(connect_nonblocking(&long).is_err());
    }

    #[test]
    fn rst_flood_without_rx_buffers_is_bounded() {
        let mut f = Fixture::new();
        for i in 0..(MAX_PENDING_RST as u32 + 50) {
            // Data for connections that do not exist, and no rx buffers to answer in.
            f.send(OP_RW, i, 7, 0, b"z");
        }
        assert_eq!(f.dev.pending_rst.len(), MAX_PENDING_RST);
        assert!(f.dev.metrics().snapshot("v").errors >= 50);
        f.post_rx(8);
        assert_eq!(f.received().len(), 8);
    }

    #[test]
    fn parses_connect_lines() {
        assert_eq!(parse_connect(b"CONNECT 1024"), Some(1024));
        assert_eq!(parse_connect(b"CONNECT 5\r"), Some(5));
        assert_eq!(parse_connect(b"CONNECT"), None);
        assert_eq!(parse_connect(b"CONNECT -1"), None);
        assert_eq!(parse_connect(b"connect 1"), None);
    }

    #[test]
    fn reserved_cids_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = Vsock::new(VsockConfig {
            guest_cid: 2,
            uds_path: dir.path().join("s"),
        });
        assert!(matches!(r, Err(Error::BadCid(2))));
    }
}
