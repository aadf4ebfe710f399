//! A split virtqueue laid out in real guest memory and driven by the fuzz input, the way a
//! hostile guest driver would: well-formed chains to get deep into a device, and raw
//! descriptors, ring indices and memory pokes to break it.

use belljar_vmm::conv::{hi32, lo32, to_usize};
use belljar_vmm::memory::GuestMemory;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::input::Input;

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;

/// Guest memory every virtio target uses.
pub const MEM_SIZE: u64 = 1 << 20;
/// Buffers live from here to the end of memory; the rings live below.
pub const DATA_BASE: u64 = 0x10000;

/// One split queue at a fixed place in guest memory.
#[derive(Debug)]
pub struct TestQueue {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub size: u16,
    avail_idx: u16,
}

impl TestQueue {
    /// Lays out a queue of `size` (a power of two) at `base`, with empty rings.
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
        for at in [avail, avail + 2, used, used + 2] {
            let _ = mem.write_obj(0u16, GuestAddress(at));
        }
        q
    }

    /// The `Queue` a transport would hand the device after the driver set it up.
    pub fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).expect("valid queue size");
        q.set_size(self.size);
        q.set_desc_table_address(Some(lo32(self.desc)), Some(hi32(self.desc)));
        q.set_avail_ring_address(Some(lo32(self.avail)), Some(hi32(self.avail)));
        q.set_used_ring_address(Some(lo32(self.used)), Some(hi32(self.used)));
        q.set_ready(true);
        q
    }

    /// Writes descriptor `idx` (modulo the table size).
    pub fn set_desc(
        &self,
        mem: &GuestMemory,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let at = self.desc + 16 * u64::from(idx % self.size);
        let _ = mem.write_obj(addr, GuestAddress(at));
        let _ = mem.write_obj(len, GuestAddress(at + 8));
        let _ = mem.write_obj(flags, GuestAddress(at + 12));
        let _ = mem.write_obj(next, GuestAddress(at + 14));
    }

    /// Puts `head` (any value, even outside the table) in the avail ring.
    pub fn make_available(&mut self, mem: &GuestMemory, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        let _ = mem.write_obj(head, GuestAddress(slot));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        let _ = mem.write_obj(self.avail_idx, GuestAddress(self.avail + 2));
    }

    /// Writes a chain of `(addr, len, device_writable)` starting at descriptor `first`, makes
    /// it available, and returns the descriptor index after the chain (where the next starts).
    pub fn add_chain(&mut self, mem: &GuestMemory, first: u16, descs: &[(u64, u32, bool)]) -> u16 {
        let mut next = first;
        for (i, &(addr, len, write)) in descs.iter().enumerate() {
            let idx = next % self.size;
            let mut flags = if write { DESC_F_WRITE } else { 0 };
            if i + 1 < descs.len() {
                flags |= DESC_F_NEXT;
            }
            self.set_desc(mem, idx, addr, len, flags, (idx + 1) % self.size);
            next = next.wrapping_add(1);
        }
        self.make_available(mem, first % self.size);
        next
    }

    /// The used ring's index.
    pub fn used_idx(&self, mem: &GuestMemory) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2)).unwrap_or(0)
    }

    /// One hostile-driver action taken from the input: a raw descriptor, a raw avail entry,
    /// a moved avail index, or bytes poked into the rings or the buffers.
    pub fn raw_action(&mut self, mem: &GuestMemory, input: &mut Input) {
        match input.u8() % 4 {
            0 => {
                let idx = input.u16();
                let addr = address(input);
                let len = length(input);
                let flags = input.u16();
                let next = input.u16();
                self.set_desc(mem, idx, addr, len, flags, next);
            }
            1 => {
                let head = input.u16();
                self.make_available(mem, head);
            }
            2 => {
                // Into this queue's descriptor table and avail ring, or the buffers; not the
                // used rings, which the checks read back.
                let (at, end) = if input.bool() {
                    (
                        self.desc + u64::from(input.u16()) % (self.used - self.desc),
                        self.used,
                    )
                } else {
                    let span = MEM_SIZE - DATA_BASE;
                    (DATA_BASE + u64::from(input.u32()) % span, MEM_SIZE)
                };
                let bytes = input.string(64);
                let n = bytes.len().min(to_usize(end - at));
                let _ = mem.write_slice(&bytes[..n], GuestAddress(at));
            }
            _ => {
                // The driver moves the avail index itself (backwards, far ahead).
                let idx = input.u16();
                self.avail_idx = idx;
                let _ = mem.write_obj(idx, GuestAddress(self.avail + 2));
            }
        }
    }
}

/// A guest address: mostly inside the data area, sometimes anything at all but the rings
/// (a device writing the used ring through a buffer the guest pointed there is the guest's
/// own corruption, and would make the used-ring checks report nonsense).
pub fn address(input: &mut Input) -> u64 {
    match input.u8() % 8 {
        0 => match input.u64() {
            a if a < DATA_BASE => a + DATA_BASE,
            a => a,
        },
        1 => MEM_SIZE - u64::from(input.u8()),
        _ => DATA_BASE + u64::from(input.u16()) * 8,
    }
}

/// A buffer length: mostly small, sometimes anything at all.
pub fn length(input: &mut Input) -> u32 {
    match input.u8() % 8 {
        0 => input.u32(),
        1 => 512 * u32::from(input.u8()),
        _ => u32::from(input.u16() % 4096),
    }
}
