//! A vsock device on real guest memory with test queues, driven like a guest would, and
//! real host Unix sockets on the other side; shared by the device's and the muxer's tests.

use std::path::PathBuf;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, Le16, Le32, Le64};

use super::packet::{HEADER_SIZE, PacketHeader};
use super::*;
use crate::devices::CountingInterrupt;
use crate::devices::virtio::test_utils::TestQueue;
use crate::devices::virtio::{VirtioDevice, VirtioInterrupt};
use crate::memory::GuestMemory;

pub const GUEST_CID: u64 = 3;
pub const TX_PKT: u64 = 0x20000;
pub const RX_BUFS: u64 = 0x40000;

pub struct Fixture {
    pub mem: GuestMemory,
    pub rx: TestQueue,
    pub tx: TestQueue,
    pub dev: Vsock,
    pub dir: tempfile::TempDir,
    pub next_tx_desc: u16,
    pub next_rx_desc: u16,
    pub rx_seen: u16,
}

impl Fixture {
    pub fn new() -> Self {
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

    pub fn uds(&self) -> PathBuf {
        self.dir.path().join("v.sock")
    }

    /// The guest sends a packet.
    pub fn send(&mut self, op: u16, src_port: u32, dst_port: u32, flags: u32, data: &[u8]) {
        let hdr = PacketHeader {
            src_cid: Le64::from(GUEST_CID),
            dst_cid: Le64::from(HOST_CID),
            src_port: Le32::from(src_port),
            dst_port: Le32::from(dst_port),
            len: Le32::from(u32::try_from(data.len()).unwrap()),
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
            &[(at, u32::try_from(HEADER_SIZE + data.len()).unwrap(), false)],
        );
        self.next_tx_desc += 1;
        self.dev.queue_notify(TX_QUEUE);
    }

    /// The guest posts `n` rx buffers of 4 KiB.
    pub fn post_rx(&mut self, n: u16) {
        for _ in 0..n {
            let d = self.next_rx_desc % 64;
            let at = RX_BUFS + u64::from(d) * 0x1000;
            self.rx.add_chain(&self.mem, d, &[(at, 0x1000, true)]);
            self.next_rx_desc += 1;
        }
        self.dev.queue_notify(RX_QUEUE);
    }

    /// Packets the device delivered since the last call.
    pub fn received(&mut self) -> Vec<(PacketHeader, Vec<u8>)> {
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

    /// The device thread's turn. No wait is needed first: a write, connect or close on a
    /// Unix socket has made the peer readable (and its epoll ready) by the time it returns.
    pub fn pump(&mut self) {
        self.dev.handle_host_events();
    }
}
