//! A net device on real guest memory with hand-built queues, driven like a guest would,
//! and a real frame socket peer standing in for the daemon.

use super::Net;
use super::*;
use crate::devices::CountingInterrupt;
use crate::devices::virtio::test_utils::TestQueue;
use crate::devices::virtio::{VirtioDevice, VirtioInterrupt};
use crate::memory::GuestMemory;
use belljar_vmm_api::net::MacAddr;
use belljar_vmm_api::net::NetConfig;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

pub(super) const MTU: u16 = 1500;
pub(super) const TX_BUFS: u64 = 0x10000;
pub(super) const RX_BUFS: u64 = 0x40000;
/// Each rx buffer's slot; a full frame plus header fits.
pub(super) const RX_SLOT: u64 = 0x800;

pub(super) struct Fixture {
    pub(super) mem: GuestMemory,
    pub(super) rx: TestQueue,
    pub(super) tx: TestQueue,
    pub(super) dev: Net,
    pub(super) dir: tempfile::TempDir,
    pub(super) next_tx: u16,
    pub(super) next_rx: u16,
}

impl Fixture {
    pub(super) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mem = crate::memory::create(1 << 20).unwrap();
        let rx = TestQueue::new(&mem, 0x1000, 64);
        let tx = TestQueue::new(&mem, 0x3000, 64);
        let mut dev = Net::new(&NetConfig {
            socket: dir.path().join("net.sock"),
            mac: MacAddr([2, 0x62, 0x6a, 0, 0, 2]),
            mtu: MTU,
        })
        .unwrap();
        let irq = Arc::new(VirtioInterrupt::new(Arc::new(CountingInterrupt::default())));
        dev.activate(mem.clone(), irq, vec![rx.queue(), tx.queue()])
            .unwrap();
        Fixture {
            mem,
            rx,
            tx,
            dev,
            dir,
            next_tx: 0,
            next_rx: 0,
        }
    }

    /// The daemon connects; the device thread accepts.
    pub(super) fn connect(&mut self) -> OwnedFd {
        let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        let addr = SocketAddrUnix::new(self.dir.path().join("net.sock")).unwrap();
        rustix::net::connect(&fd, &addr).unwrap();
        self.dev.handle_host_events();
        fd
    }

    /// The guest transmits `frame` behind a zeroed virtio-net header, header and frame in
    /// separate descriptors as Linux does.
    pub(super) fn transmit(&mut self, frame: &[u8]) {
        let at = TX_BUFS + u64::from(self.next_tx % 32) * 0x1000;
        self.mem
            .write_slice(frame, GuestAddress(at + 0x100))
            .unwrap();
        let head = self.next_tx * 2 % 64;
        self.tx.add_chain(
            &self.mem,
            head,
            &[
                (at, 12, false),
                (at + 0x100, u32::try_from(frame.len()).unwrap(), false),
            ],
        );
        self.next_tx += 1;
        self.dev.queue_notify(TX_QUEUE);
    }

    /// The guest posts `n` receive buffers of one descriptor each.
    pub(super) fn post_rx(&mut self, n: u16) {
        for _ in 0..n {
            let i = self.next_rx % 64;
            let at = RX_BUFS + u64::from(i) * RX_SLOT;
            self.rx.add_chain(&self.mem, i, &[(at, 1526, true)]);
            self.next_rx += 1;
        }
        self.dev.queue_notify(RX_QUEUE);
    }

    /// What the guest received in used element `i`: (header, frame).
    pub(super) fn received(&self, i: u16) -> (Vec<u8>, Vec<u8>) {
        let (head, len) = self.rx.used(&self.mem, i);
        let at = RX_BUFS + u64::from(head) * RX_SLOT;
        let mut buf = vec![0u8; len as usize];
        self.mem.read_slice(&mut buf, GuestAddress(at)).unwrap();
        let frame = buf.split_off(NET_HDR_LEN.min(buf.len()));
        (buf, frame)
    }

    pub(super) fn errors(&self) -> u64 {
        self.dev.metrics().snapshot("net").errors
    }
}

pub(super) fn frame(len: usize, tag: u8) -> Vec<u8> {
    let mut f = vec![tag; len];
    f[..6].copy_from_slice(&[2, 0x62, 0x6a, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0x62, 0x6a, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f
}

/// One packet from the VMM, if one is waiting.
pub(super) fn try_recv(fd: &OwnedFd) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 70000];
    match rustix::net::recv(fd, &mut buf[..], RecvFlags::DONTWAIT) {
        Ok((_, n)) => {
            buf.truncate(n);
            Some(buf)
        }
        Err(rustix::io::Errno::AGAIN) => None,
        Err(e) => panic!("recv: {e}"),
    }
}

pub(super) fn send(fd: &OwnedFd, frame: &[u8]) {
    assert_eq!(
        rustix::net::send(fd, frame, SendFlags::empty()).unwrap(),
        frame.len()
    );
}
