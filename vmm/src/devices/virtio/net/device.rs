//! The virtio-net device model: the receive and transmit queues, the virtio-net header in
//! front of each frame, and the guest's hostile descriptor chains. Frames come from and go
//! to the frame socket (`frames.rs`).
//!
//! No allocation depends on the guest: the two frame buffers are sized once from the
//! configured MTU, and a chain whose frame would not fit them is refused.

use std::io::{Read, Write};
use std::os::fd::RawFd;
use std::sync::Arc;

use belljar_vmm_api::net::{ETHERNET_HEADER_LEN, NetConfig};
use virtio_queue::Queue;

use super::frames::{FrameSocket, Received, SendOutcome};
use super::*;
use crate::devices::virtio::{
    ActivateError, TYPE_NET, VIRTIO_F_VERSION_1, VirtioDevice, VirtioInterrupt, add_used,
    expect_queues, pop_chain,
};
use crate::memory::GuestMemory;
use crate::metrics::DeviceMetrics;

struct Active {
    mem: GuestMemory,
    interrupt: Arc<VirtioInterrupt>,
    queues: [Queue; 2],
}

/// A frame held between the guest and the socket, in a buffer sized once from the MTU.
struct FrameBuf {
    data: Vec<u8>,
    /// Length of the frame held, if one is.
    held: Option<usize>,
}

impl FrameBuf {
    fn new(max_frame: usize) -> Self {
        Self {
            data: vec![0; max_frame],
            held: None,
        }
    }
}

/// virtio-net over the frame socket.
pub struct Net {
    mac: [u8; 6],
    mtu: u16,
    max_frame: usize,
    pub(super) frames: FrameSocket,
    active: Option<Active>,
    metrics: Arc<DeviceMetrics>,
    /// From the daemon, waiting for a guest receive buffer.
    rx: FrameBuf,
    /// From the guest, waiting for room in the socket.
    tx: FrameBuf,
}

impl Net {
    /// Checks the settings and binds the frame socket (before the seccomp filter).
    pub fn new(config: &NetConfig) -> Result<Self, Error> {
        config.validate()?;
        let max_frame = config.max_frame_len();
        Ok(Net {
            mac: config.mac.0,
            mtu: config.mtu,
            max_frame,
            frames: FrameSocket::bind(&config.socket)?,
            active: None,
            metrics: Arc::new(DeviceMetrics::default()),
            rx: FrameBuf::new(max_frame),
            tx: FrameBuf::new(max_frame),
        })
    }

    /// The frame socket's listener (the seccomp filter allows `accept` on it).
    pub fn listener_fd(&self) -> RawFd {
        self.frames.listener_fd()
    }

    /// Whether a daemon is connected.
    pub fn has_peer(&self) -> bool {
        self.frames.has_peer()
    }

    /// Moves the guest's transmitted frames to the socket until the queue is empty or the
    /// socket is full (then the rest waits in the queue: back-pressure, not loss).
    fn process_tx(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        if let Some(n) = self.tx.held {
            if self.frames.send(&self.tx.data[..n]) == SendOutcome::Full {
                return;
            }
            self.tx.held = None;
        }
        let tx = &mut active.queues[usize::from(TX_QUEUE)];
        let mut used_any = false;
        while let Some(chain) = pop_chain(tx, &active.mem, &self.metrics) {
            let head = chain.head_index();
            let frame = read_frame(&active.mem, chain, &mut self.tx.data);
            used_any |= add_used(tx, &active.mem, head, 0, &self.metrics);
            let n = match frame {
                Ok(n) => n,
                Err(msg) => {
                    tracing::debug!(msg, "net: malformed tx chain");
                    self.metrics.error();
                    continue;
                }
            };
            self.metrics.add_in(n as u64);
            self.metrics.request();
            if self.frames.send(&self.tx.data[..n]) == SendOutcome::Full {
                self.tx.held = Some(n);
                break;
            }
        }
        if used_any {
            active.interrupt.signal_used_queue();
        }
    }

    /// Moves frames from the socket into the guest's receive buffers until the socket is
    /// empty or the guest has no buffer left (then the frame read waits for one).
    fn process_rx(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let rx = &mut active.queues[usize::from(RX_QUEUE)];
        let mut used_any = false;
        loop {
            let n = match self.rx.held {
                Some(n) => n,
                None => match self.frames.recv(&mut self.rx.data) {
                    Received::Nothing => break,
                    Received::Frame(n) if !(ETHERNET_HEADER_LEN..=self.max_frame).contains(&n) => {
                        tracing::debug!(len = n, "net: frame from the daemon out of bounds");
                        self.metrics.error();
                        continue;
                    }
                    Received::Frame(n) => {
                        self.rx.held = Some(n);
                        n
                    }
                },
            };
            let Some(chain) = pop_chain(rx, &active.mem, &self.metrics) else {
                break;
            };
            let head = chain.head_index();
            let len = match write_frame(&active.mem, chain, &self.rx.data[..n]) {
                Ok(len) => {
                    self.metrics.add_out(n as u64);
                    len
                }
                Err(msg) => {
                    // The guest's buffers are all alike: a frame that does not fit this one
                    // would not fit the next. Drop it, as a NIC drops a giant.
                    tracing::debug!(msg, "net: unusable rx chain");
                    self.metrics.error();
                    0
                }
            };
            self.rx.held = None;
            used_any |= add_used(rx, &active.mem, head, len, &self.metrics);
        }
        if used_any {
            active.interrupt.signal_used_queue();
        }
    }

    /// The device thread's turn: new peers, hang-ups, and frames or room on the socket.
    pub fn handle_host_events(&mut self) {
        let ready = self.frames.poll();
        if ready.writable {
            self.process_tx();
        }
        if ready.readable {
            self.process_rx();
        }
    }
}

/// Copies one transmitted frame (after its virtio-net header) into `buf`.
fn read_frame(
    mem: &GuestMemory,
    chain: virtio_queue::DescriptorChain<&GuestMemory>,
    buf: &mut [u8],
) -> Result<usize, &'static str> {
    let mut reader = chain.reader(mem).map_err(|_| "bad descriptors")?;
    let total = reader.available_bytes();
    if total < NET_HDR_LEN + ETHERNET_HEADER_LEN {
        return Err("shorter than the headers");
    }
    let n = total - NET_HDR_LEN;
    if n > buf.len() {
        return Err("frame longer than the MTU allows");
    }
    let mut hdr = [0u8; NET_HDR_LEN];
    reader
        .read_exact(&mut hdr)
        .map_err(|_| "cannot read the header")?;
    reader
        .read_exact(&mut buf[..n])
        .map_err(|_| "cannot read the frame")?;
    Ok(n)
}

/// Writes a virtio-net header and `frame` into a receive chain; returns the bytes written.
fn write_frame(
    mem: &GuestMemory,
    chain: virtio_queue::DescriptorChain<&GuestMemory>,
    frame: &[u8],
) -> Result<u32, &'static str> {
    let mut writer = chain.writer(mem).map_err(|_| "bad descriptors")?;
    if writer.available_bytes() < NET_HDR_LEN + frame.len() {
        return Err("rx buffer too small");
    }
    // No offloads: flags 0, GSO none; num_buffers (bytes 10-11) is 1, the one chain.
    let mut hdr = [0u8; NET_HDR_LEN];
    hdr[10..12].copy_from_slice(&1u16.to_le_bytes());
    writer
        .write_all(&hdr)
        .map_err(|_| "cannot write the header")?;
    writer
        .write_all(frame)
        .map_err(|_| "cannot write the frame")?;
    // A frame is at most MAX_MTU + 14 bytes (under 64 KiB).
    u32::try_from(NET_HDR_LEN + frame.len()).map_err(|_| "frame too long")
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 2]
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MAC | VIRTIO_NET_F_MTU
    }

    fn set_acked_features(&mut self, _features: u64) {}

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_net_config { u8 mac[6]; le16 status; le16 max_virtqueue_pairs;
        // le16 mtu; }: status is only read with VIRTIO_NET_F_STATUS, which is not offered.
        let mut config = [0u8; 12];
        config[..6].copy_from_slice(&self.mac);
        config[8..10].copy_from_slice(&1u16.to_le_bytes());
        config[10..12].copy_from_slice(&self.mtu.to_le_bytes());
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
        let queues = expect_queues::<2>(queues)?;
        self.active = Some(Active {
            mem,
            interrupt,
            queues,
        });
        // Frames may have waited in the socket before the driver was ready.
        self.process_rx();
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        match index {
            RX_QUEUE => self.process_rx(),
            TX_QUEUE => self.process_tx(),
            _ => self.metrics.error(),
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.rx.held = None;
        self.tx.held = None;
    }

    fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    fn metrics(&self) -> Arc<DeviceMetrics> {
        self.metrics.clone()
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
    use crate::devices::virtio::net::test_utils::*;
    use belljar_vmm_api::net::MacAddr;
    use rustix::net::RecvFlags;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn guest_frames_reach_the_daemon_without_the_header() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        assert!(f.dev.has_peer());
        let sent = frame(60, 0xab);
        f.transmit(&sent);
        assert_eq!(try_recv(&daemon).unwrap(), sent);
        assert_eq!(try_recv(&daemon), None);
        assert_eq!(f.tx.used_idx(&f.mem), 1);
        assert_eq!(f.tx.used(&f.mem, 0), (0, 0));
        let m = f.dev.metrics().snapshot("net");
        assert_eq!((m.bytes_in, m.requests, m.errors), (60, 1, 0));
    }

    #[test]
    fn daemon_frames_reach_the_guest_behind_a_header() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        f.post_rx(2);
        let sent = frame(1514, 0x11);
        send(&daemon, &sent);
        f.dev.handle_host_events();
        assert_eq!(f.rx.used_idx(&f.mem), 1);
        let (hdr, got) = f.received(0);
        assert_eq!(hdr, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert_eq!(got, sent);
        assert_eq!(f.dev.metrics().snapshot("net").bytes_out, 1514);
    }

    #[test]
    fn a_frame_spans_a_chain_of_small_buffers() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        // Header alone, then 1000 + 600 bytes, as a guest with big-packet buffers chains them.
        f.rx.add_chain(
            &f.mem,
            0,
            &[
                (RX_BUFS, 12, true),
                (RX_BUFS + 0x1000, 1000, true),
                (RX_BUFS + 0x2000, 600, true),
            ],
        );
        f.dev.queue_notify(RX_QUEUE);
        let sent = frame(1500, 0x22);
        send(&daemon, &sent);
        f.dev.handle_host_events();
        assert_eq!(f.rx.used(&f.mem, 0), (0, 1512));
        let mut got = vec![0u8; 1500];
        f.mem
            .read_slice(&mut got[..1000], GuestAddress(RX_BUFS + 0x1000))
            .unwrap();
        f.mem
            .read_slice(&mut got[1000..], GuestAddress(RX_BUFS + 0x2000))
            .unwrap();
        assert_eq!(got, sent);
    }

    #[test]
    fn frames_wait_for_the_guest_to_post_buffers() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        send(&daemon, &frame(64, 1));
        send(&daemon, &frame(64, 2));
        f.dev.handle_host_events();
        assert_eq!(f.rx.used_idx(&f.mem), 0);
        f.post_rx(1);
        assert_eq!(f.rx.used_idx(&f.mem), 1);
        assert_eq!(f.received(0).1[20], 1);
        f.post_rx(1);
        assert_eq!(f.rx.used_idx(&f.mem), 2);
        assert_eq!(f.received(1).1[20], 2);
    }

    #[test]
    fn guest_frames_without_a_peer_are_dropped() {
        let mut f = Fixture::new();
        f.transmit(&frame(60, 1));
        // The chain is returned all the same: the guest does not stall on a missing daemon.
        assert_eq!(f.tx.used_idx(&f.mem), 1);
        let daemon = f.connect();
        f.transmit(&frame(60, 2));
        assert_eq!(try_recv(&daemon).unwrap()[20], 2);
        assert_eq!(try_recv(&daemon), None);
        assert_eq!(f.errors(), 0);
    }

    #[test]
    fn a_new_peer_replaces_the_old_one() {
        let mut f = Fixture::new();
        let old = f.connect();
        let new = f.connect();
        // The old connection is closed: its reader sees the end.
        let mut buf = [0u8; 16];
        assert_eq!(
            rustix::net::recv(&old, &mut buf[..], RecvFlags::DONTWAIT)
                .unwrap()
                .1,
            0
        );
        f.transmit(&frame(60, 7));
        assert_eq!(try_recv(&new).unwrap()[20], 7);
        // And a peer that hangs up is forgotten; the next one is accepted.
        drop(new);
        f.dev.handle_host_events();
        assert!(!f.dev.has_peer());
        let again = f.connect();
        f.transmit(&frame(60, 8));
        assert_eq!(try_recv(&again).unwrap()[20], 8);
    }

    #[test]
    fn malformed_tx_chains_are_refused() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        let max = u32::from(MTU) + 14;
        // Shorter than the virtio-net header plus an Ethernet header.
        f.tx.add_chain(&f.mem, 0, &[(TX_BUFS, 12 + 13, false)]);
        // Longer than the MTU allows.
        f.tx.add_chain(
            &f.mem,
            2,
            &[(TX_BUFS, 12, false), (TX_BUFS + 0x100, max + 1, false)],
        );
        // A buffer outside guest memory.
        f.tx.add_chain(&f.mem, 4, &[(0xdead_0000, 100, false)]);
        // Only device-writable buffers: nothing to send.
        f.tx.add_chain(&f.mem, 6, &[(TX_BUFS, 100, true)]);
        // A length that wraps: 0xffff_ffff bytes.
        f.tx.add_chain(&f.mem, 8, &[(TX_BUFS, u32::MAX, false)]);
        // A head outside the descriptor table.
        f.tx.make_available(&f.mem, 500);
        f.dev.queue_notify(TX_QUEUE);
        f.dev.queue_notify(7);
        assert_eq!(try_recv(&daemon), None);
        assert!(f.errors() >= 6, "{}", f.errors());
        // The queue still works afterwards.
        f.next_tx = 10;
        f.transmit(&frame(60, 9));
        assert_eq!(try_recv(&daemon).unwrap()[20], 9);
    }

    #[test]
    fn bad_rx_buffers_and_bad_frames_are_dropped() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        // Too small for header + frame, then read-only, then a good one.
        f.rx.add_chain(&f.mem, 0, &[(RX_BUFS, 40, true)]);
        f.rx.add_chain(&f.mem, 1, &[(RX_BUFS + RX_SLOT, 1526, false)]);
        f.rx.add_chain(&f.mem, 2, &[(RX_BUFS + 2 * RX_SLOT, 1526, true)]);
        f.dev.queue_notify(RX_QUEUE);
        send(&daemon, &frame(100, 1));
        send(&daemon, &frame(100, 2));
        // From the daemon: shorter than an Ethernet header, longer than the MTU allows.
        send(&daemon, &[1u8; 13]);
        send(&daemon, &frame(usize::from(MTU) + 15, 3));
        send(&daemon, &frame(100, 4));
        f.dev.handle_host_events();
        assert_eq!(f.rx.used_idx(&f.mem), 3);
        assert_eq!(f.rx.used(&f.mem, 0), (0, 0));
        assert_eq!(f.rx.used(&f.mem, 1), (1, 0));
        let (_, got) = f.received(2);
        assert_eq!((got.len(), got[20]), (100, 4));
        assert_eq!(f.errors(), 4);
    }

    #[test]
    fn a_full_socket_holds_guest_frames_back_without_loss() {
        let mut f = Fixture::new();
        let daemon = f.connect();
        f.dev.frames.shrink_send_buffer();
        for i in 0..20u8 {
            f.transmit(&frame(1514, i));
        }
        // The socket filled: some chains are still the guest's, waiting.
        let taken = f.tx.used_idx(&f.mem);
        assert!(taken < 20, "all {taken} taken: the socket never filled");
        let mut got = Vec::new();
        let mut rounds = 0;
        while got.len() < 20 {
            rounds += 1;
            assert!(rounds < 1000, "stalled after {} frames", got.len());
            match try_recv(&daemon) {
                Some(p) => got.push(p[20]),
                // Drained what was there: the device thread sees the socket writable again.
                None => f.dev.handle_host_events(),
            }
        }
        assert_eq!(got, (0..20).collect::<Vec<u8>>());
        assert_eq!(f.tx.used_idx(&f.mem), 20);
        assert_eq!(f.errors(), 0);
    }

    #[test]
    fn config_space_reports_mac_and_mtu() {
        let f = Fixture::new();
        let mut cfg = [0u8; 12];
        f.dev.read_config(0, &mut cfg);
        assert_eq!(&cfg[..6], &[2, 0x62, 0x6a, 0, 0, 2]);
        assert_eq!(u16::from_le_bytes([cfg[10], cfg[11]]), MTU);
        let mut past = [0xffu8; 4];
        f.dev.read_config(10, &mut past);
        assert_eq!(past, [0xdc, 0x05, 0, 0]);
        assert_eq!(
            f.dev.avail_features() & (VIRTIO_NET_F_MAC | VIRTIO_NET_F_MTU),
            VIRTIO_NET_F_MAC | VIRTIO_NET_F_MTU
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = Net::new(&NetConfig {
            socket: dir.path().join("n.sock"),
            mac: MacAddr([1, 0, 0, 0, 0, 1]),
            mtu: MTU,
        });
        assert!(matches!(r, Err(Error::Config(_))));
        let r = Net::new(&NetConfig {
            socket: dir.path().join("missing/n.sock"),
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            mtu: MTU,
        });
        assert!(matches!(r, Err(Error::Listen(..))));
    }
}
