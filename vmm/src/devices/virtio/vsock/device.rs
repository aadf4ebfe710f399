//! The virtio-vsock device model: the three virtqueues and the packets on them. The host
//! side (listeners, handshakes, bridged connections) is the muxer's job (`muxer.rs`).

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{Le16, Le32, Le64};

use super::connection::Outgoing;
use super::muxer::{Key, Muxer};
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

struct Active {
    mem: GuestMemory,
    interrupt: Arc<VirtioInterrupt>,
    queues: Vec<Queue>,
}

/// Hybrid virtio-vsock.
pub struct Vsock {
    config: VsockConfig,
    pub(super) muxer: Muxer,
    active: Option<Active>,
    metrics: Arc<DeviceMetrics>,
}

impl Vsock {
    /// Binds `<uds_path>` (a stale socket file there is replaced).
    pub fn new(config: VsockConfig) -> Result<Self, Error> {
        if config.guest_cid < 3 || config.guest_cid > u64::from(u32::MAX) {
            return Err(Error::BadCid(config.guest_cid));
        }
        let metrics = Arc::new(DeviceMetrics::default());
        let muxer = Muxer::new(&config, metrics.clone())?;
        Ok(Vsock {
            config,
            muxer,
            active: None,
            metrics,
        })
    }

    /// The listener host clients dial (the seccomp filter allows `accept` on it).
    pub fn listener_fd(&self) -> std::os::fd::RawFd {
        self.muxer.listener_fd()
    }

    /// Number of open connections.
    pub fn connection_count(&self) -> usize {
        self.muxer.connection_count()
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
            self.muxer.dispatch(&hdr, &data);
        }
        self.process_rx();
    }

    /// Fills rx buffers with packets for the guest (control packets first, then data, one
    /// packet per connection per round so no stream starves the others).
    fn process_rx(&mut self) {
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
            while let Some(((local, peer), dst_cid)) = self.muxer.next_rst() {
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
                self.muxer.rst_sent();
                progressed = true;
            }
            let keys: Vec<Key> = self.muxer.keys_with_outgoing();
            for key in keys {
                let Some(chain) = pop_chain(rx, &active.mem, &self.metrics) else {
                    break 'outer;
                };
                let Some(conn) = self.muxer.connection_mut(key) else {
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
                        self.muxer.queue_rst(key, 0);
                        self.muxer.remove_connection(key, false);
                    }
                }
                progressed = true;
                if out.op == OP_RST {
                    self.muxer.remove_connection(key, false);
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

    /// Drains the host-socket poller (non-blocking) and moves data to the guest.
    pub fn handle_host_events(&mut self) {
        self.muxer.handle_events();
        self.process_rx();
    }
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
    // `data` is at most MAX_PKT_DATA (64 KiB) bytes, the caller's buffer.
    Ok(u32::try_from(HEADER_SIZE + data.len()).expect("packet under 4 GiB"))
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
        let start = crate::conv::to_usize(offset);
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
        self.muxer.reset();
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn metrics(&self) -> Arc<DeviceMetrics> {
        self.metrics.clone()
    }

    /// Tells the guest that every connection it had is gone (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET,
    /// as Firecracker does after a restore): the host ends of its streams were in the VMM
    /// that made the snapshot. The guest drops them; new connections work at once.
    fn after_restore(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let queue = &mut active.queues[usize::from(EVENT_QUEUE)];
        let Some(chain) = pop_chain(queue, &active.mem, &self.metrics) else {
            tracing::warn!("vsock: no event buffer for the transport reset");
            return;
        };
        let head = chain.head_index();
        let written = chain.writer(&active.mem).ok().and_then(|mut w| {
            w.write_obj(Le32::from(VIRTIO_VSOCK_EVENT_TRANSPORT_RESET))
                .ok()
        });
        let len = if written.is_some() { 4 } else { 0 };
        if add_used(queue, &active.mem, head, len, &self.metrics) {
            active.interrupt.signal_used_queue();
        }
    }

    fn queue_states(&self) -> Vec<virtio_queue::QueueState> {
        self.active
            .as_ref()
            .map(|a| a.queues.iter().map(|q| q.state()).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::vsock::test_utils::*;
    use std::io::Write;
    use std::os::unix::net::{UnixListener, UnixStream};
    use vm_memory::{Bytes, GuestAddress};

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
    fn host_data_is_split_to_fit_linux_sized_rx_buffers() {
        let mut f = Fixture::new();
        // Like Linux: a 44-byte header descriptor chained to a 4 KiB payload descriptor.
        for i in 0..4u16 {
            let at = RX_BUFS + u64::from(i) * 0x2000;
            f.rx.add_chain(
                &f.mem,
                2 * i,
                &[
                    (at, u32::try_from(HEADER_SIZE).unwrap(), true),
                    (at + 0x100, 4096, true),
                ],
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
    fn rst_flood_without_rx_buffers_is_bounded() {
        let mut f = Fixture::new();
        for i in 0..(u32::try_from(MAX_PENDING_RST).unwrap() + 50) {
            // Data for connections that do not exist, and no rx buffers to answer in.
            f.send(OP_RW, i, 7, 0, b"z");
        }
        assert_eq!(f.dev.muxer.pending_rst_count(), MAX_PENDING_RST);
        assert!(f.dev.metrics().snapshot("v").errors >= 50);
        f.post_rx(8);
        assert_eq!(f.received().len(), 8);
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
