//! virtio-blk descriptor chains against real guest memory and a real (small, sparse) disk
//! image: the input decides descriptors, addresses, lengths, flags, ring indices and the
//! request header's bytes. The device must never panic, must stay inside guest memory, and
//! must never report more bytes written than the chain's writable buffers can hold.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use belljar_vmm::devices::CountingInterrupt;
use belljar_vmm::devices::virtio::block::{
    Block, BlockConfig, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use belljar_vmm::devices::virtio::{VirtioDevice, VirtioInterrupt};
use vm_memory::{Bytes, GuestAddress};

use crate::input::Input;
use crate::virtqueue::{DATA_BASE, MEM_SIZE, TestQueue, address, length};

/// Disk size: 64 sectors, so that in-range and out-of-range sectors are both easy to hit.
const DISK_BYTES: u64 = 64 * 512;
const QUEUE_SIZE: u16 = 16;

fn disk() -> &'static PathBuf {
    static DISK: OnceLock<PathBuf> = OnceLock::new();
    DISK.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("belljar-fuzz-blk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("disk.img");
        let f = std::fs::File::create(&path).expect("disk image");
        f.set_len(DISK_BYTES).expect("disk size");
        path
    })
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let read_only = input.bool();
    let Ok(mem) = belljar_vmm::memory::create(MEM_SIZE) else {
        return;
    };
    let mut tq = TestQueue::new(&mem, 0x1000, QUEUE_SIZE);
    let mut blk = Block::new(BlockConfig {
        path: disk().clone(),
        read_only,
        id: "fuzz-disk-with-a-long-id".into(),
    })
    .expect("disk opens");
    let irq = Arc::new(VirtioInterrupt::new(Arc::new(CountingInterrupt::default())));
    blk.activate(mem.clone(), irq.clone(), vec![tq.queue()])
        .expect("activates");
    let mut next_desc: u16 = 0;
    let mut steps = 0;
    while !input.is_empty() && steps < 64 {
        steps += 1;
        match input.u8() % 4 {
            0 | 1 => {
                // A request: header, data buffers, status byte.
                let type_ = match input.u8() % 6 {
                    0 => VIRTIO_BLK_T_IN,
                    1 => VIRTIO_BLK_T_OUT,
                    2 => VIRTIO_BLK_T_FLUSH,
                    3 => VIRTIO_BLK_T_GET_ID,
                    _ => input.u32(),
                };
                let sector = match input.u8() % 4 {
                    0 => input.u64(),
                    _ => u64::from(input.u8()),
                };
                let hdr_at = DATA_BASE + u64::from(input.u16() % 0x1000) * 16;
                let mut header = [0u8; 16];
                header[..4].copy_from_slice(&type_.to_le_bytes());
                header[8..].copy_from_slice(&sector.to_le_bytes());
                let _ = mem.write_slice(&header, GuestAddress(hdr_at));
                let hdr_len = if input.one_in(8) {
                    u32::from(input.u8())
                } else {
                    16
                };
                let mut descs = vec![(hdr_at, hdr_len, false)];
                for _ in 0..input.u8() % 4 {
                    descs.push((address(&mut input), length(&mut input), input.bool()));
                }
                if !input.one_in(8) {
                    descs.push((address(&mut input), 1, true));
                }
                next_desc = tq.add_chain(&mem, next_desc, &descs);
            }
            2 => tq.raw_action(&mem, &mut input),
            _ => {
                let before = tq.used_idx(&mem);
                blk.queue_notify(input.u8().into());
                check_used(&mem, &tq, before);
            }
        }
    }
    let before = tq.used_idx(&mem);
    blk.queue_notify(0);
    check_used(&mem, &tq, before);
    blk.reset();
    assert!(!blk.is_activated());
}

/// Every used element names a descriptor inside the table and reports no more bytes than
/// one request can return: the whole disk plus the status byte.
fn check_used(mem: &belljar_vmm::memory::GuestMemory, tq: &TestQueue, before: u16) {
    let after = tq.used_idx(mem);
    let added = after.wrapping_sub(before);
    assert!(
        added <= tq.size,
        "device added {added} used elements to a queue of {}",
        tq.size
    );
    for i in 0..added {
        let slot = before.wrapping_add(i) % tq.size;
        let at = tq.used + 4 + 8 * u64::from(slot);
        let head: u32 = mem.read_obj(GuestAddress(at)).unwrap_or(0);
        assert!(
            head < u32::from(tq.size),
            "used head {head} outside the table"
        );
        let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap_or(0);
        assert!(
            u64::from(len) <= DISK_BYTES + 1,
            "device claims {len} bytes written"
        );
    }
}
