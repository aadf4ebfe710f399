//! Hand-built split virtqueues in real guest memory, for device unit tests.
//!
//! Tests write descriptors and avail entries exactly as a guest driver would (including
//! malformed ones), then read the used ring back.

use virtio_bindings::virtio_ring;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::conv::{hi32, lo32, u16_const};
use crate::memory::GuestMemory;

pub const VIRTQ_DESC_F_NEXT: u16 = u16_const(virtio_ring::VRING_DESC_F_NEXT);
pub const VIRTQ_DESC_F_WRITE: u16 = u16_const(virtio_ring::VRING_DESC_F_WRITE);

/// A split queue laid out at `base` in guest memory.
pub struct TestQueue {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub size: u16,
    avail_idx: u16,
}

impl TestQueue {
    pub fn new(mem: &GuestMemory, base: u64, size: u16) -> Self {
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
        let q = TestQueue {
            desc,
            avail,
            used,
            size,
            avail_idx: 0,
        };
        mem.write_obj(0u16, GuestAddress(avail)).unwrap();
        mem.write_obj(0u16, GuestAddress(avail + 2)).unwrap();
        mem.write_obj(0u16, GuestAddress(used + 2)).unwrap();
        q
    }

    /// Writes descriptor `idx`.
    pub fn set_desc(
        &self,
        mem: &GuestMemory,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let at = self.desc + 16 * u64::from(idx);
        mem.write_obj(addr, GuestAddress(at)).unwrap();
        mem.write_obj(len, GuestAddress(at + 8)).unwrap();
        mem.write_obj(flags, GuestAddress(at + 12)).unwrap();
        mem.write_obj(next, GuestAddress(at + 14)).unwrap();
    }

    /// Writes a chain of descriptors starting at `first` (`(addr, len, device_writable)`)
    /// and makes it available.
    pub fn add_chain(&mut self, mem: &GuestMemory, first: u16, descs: &[(u64, u32, bool)]) {
        for (i, &(addr, len, write)) in descs.iter().enumerate() {
            let idx = first + u16::try_from(i).unwrap();
            let mut flags = if write { VIRTQ_DESC_F_WRITE } else { 0 };
            if i + 1 < descs.len() {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            self.set_desc(mem, idx, addr, len, flags, idx + 1);
        }
        self.make_available(mem, first);
    }

    /// Puts `head` in the avail ring and bumps its index.
    pub fn make_available(&mut self, mem: &GuestMemory, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail + 2))
            .unwrap();
    }

    /// The used ring's index.
    pub fn used_idx(&self, mem: &GuestMemory) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2)).unwrap()
    }

    /// Used element `i`: (descriptor head, bytes written).
    pub fn used(&self, mem: &GuestMemory, i: u16) -> (u32, u32) {
        let at = self.used + 4 + 8 * u64::from(i % self.size);
        (
            mem.read_obj(GuestAddress(at)).unwrap(),
            mem.read_obj(GuestAddress(at + 4)).unwrap(),
        )
    }

    /// A ready `Queue` pointing at this layout, as the transport would hand it over.
    pub fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        q.set_size(self.size);
        q.set_desc_table_address(Some(lo32(self.desc)), Some(hi32(self.desc)));
        q.set_avail_ring_address(Some(lo32(self.avail)), Some(hi32(self.avail)));
        q.set_used_ring_address(Some(lo32(self.used)), Some(hi32(self.used)));
        q.set_ready(true);
        q
    }
}
