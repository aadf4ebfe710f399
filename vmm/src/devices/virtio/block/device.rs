//! The virtio-blk device model: synchronous file I/O on the notifying vCPU thread.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::{ByteValued, Le32, Le64};

use super::*;
use crate::devices::virtio::{
    ActivateError, TYPE_BLOCK, VIRTIO_F_VERSION_1, VirtioDevice, VirtioInterrupt, add_used,
    expect_queues, pop_chain,
};
use crate::memory::GuestMemory;
use crate::metrics::DeviceMetrics;

/// How a disk is attached.
#[derive(Debug, Clone)]
pub struct BlockConfig {
    pub path: PathBuf,
    pub read_only: bool,
    /// Reported to the guest by GET_ID (truncated to 20 bytes).
    pub id: String,
}

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct RequestHeader {
    type_: Le32,
    _reserved: Le32,
    sector: Le64,
}

// SAFETY: plain-old-data with no padding (4 + 4 + 8 bytes), valid for any bit pattern.
unsafe impl ByteValued for RequestHeader {}

struct Active {
    mem: GuestMemory,
    interrupt: Arc<VirtioInterrupt>,
    queue: Queue,
}

/// One virtio-blk disk.
pub struct Block {
    config: BlockConfig,
    file: File,
    /// Capacity in sectors.
    capacity: u64,
    avail_features: u64,
    active: Option<Active>,
    metrics: Arc<DeviceMetrics>,
}

impl Block {
    /// Opens the image; fails at once if it is missing or unreadable.
    pub fn new(config: BlockConfig) -> Result<Self, Error> {
        let name = config.path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(!config.read_only)
            .open(&config.path)
            .map_err(|e| Error::Open(name.clone(), e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::Open(name.clone(), e))?
            .len();
        // Probe a read so an unreadable file (e.g. a directory) fails now, not in the guest.
        let mut probe = [0u8; 1];
        file.read_at(&mut probe, 0)
            .map_err(|e| Error::Open(name.clone(), e))?;
        let capacity = len / SECTOR_SIZE;
        if capacity == 0 {
            return Err(Error::TooSmall(name));
        }
        let mut avail_features = VIRTIO_F_VERSION_1;
        avail_features |= if config.read_only {
            VIRTIO_BLK_F_RO
        } else {
            VIRTIO_BLK_F_FLUSH
        };
        Ok(Block {
            config,
            file,
            capacity,
            avail_features,
            active: None,
            metrics: Arc::new(DeviceMetrics::default()),
        })
    }

    /// Capacity in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn process(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let mut used_any = false;
        while let Some(chain) = pop_chain(&mut active.queue, &active.mem, &self.metrics) {
            let head = chain.head_index();
            let len = match handle_request(
                &self.file,
                self.capacity,
                &self.config,
                &active.mem,
                chain,
                &self.metrics,
            ) {
                Ok(len) => len,
                Err(msg) => {
                    tracing::debug!(msg, "virtio-blk: malformed request");
                    self.metrics.error();
                    0
                }
            };
            self.metrics.request();
            used_any |= add_used(&mut active.queue, &active.mem, head, len, &self.metrics);
        }
        if used_any {
            active.interrupt.signal_used_queue();
        }
    }
}

/// Serves one request; returns the bytes written to the guest, or why the chain is malformed
/// (then nothing, not even a status, is returned to the guest).
fn handle_request(
    file: &File,
    capacity: u64,
    config: &BlockConfig,
    mem: &GuestMemory,
    chain: virtio_queue::DescriptorChain<&GuestMemory>,
    metrics: &DeviceMetrics,
) -> Result<u32, &'static str> {
    let mut reader = chain
        .clone()
        .reader(mem)
        .map_err(|_| "bad readable descriptors")?;
    let mut writer = chain.writer(mem).map_err(|_| "bad writable descriptors")?;
    let header: RequestHeader = reader.read_obj().map_err(|_| "short request header")?;
    let writable = writer.available_bytes();
    if writable == 0 {
        return Err("no status byte");
    }
    let mut status_writer = writer
        .split_at(writable - 1)
        .map_err(|_| "cannot split status byte")?;
    let sector = header.sector.to_native();
    let (status, data_written) = match header.type_.to_native() {
        VIRTIO_BLK_T_IN => {
            let len = writer.available_bytes();
            // The used ring reports the bytes written as a u32. Descriptors may alias the
            // same guest memory, so a chain could claim more than that; virtio-queue already
            // ends a chain before 4 GiB, and should it stop doing so the request is refused
            // here rather than copied and reported with a truncated length.
            match u32::try_from(len) {
                Ok(len32) if in_range(sector, len as u64, capacity) => {
                    match copy_file_to_guest(file, sector * SECTOR_SIZE, len, &mut writer) {
                        Ok(()) => {
                            metrics.add_out(len as u64);
                            (VIRTIO_BLK_S_OK, len32)
                        }
                        // Never more than `len32` bytes were written.
                        Err(_) => (
                            VIRTIO_BLK_S_IOERR,
                            u32::try_from(writer.bytes_written()).unwrap_or(len32),
                        ),
                    }
                }
                _ => (VIRTIO_BLK_S_IOERR, 0),
            }
        }
        VIRTIO_BLK_T_OUT => {
            let len = reader.available_bytes();
            if config.read_only || !in_range(sector, len as u64, capacity) {
                (VIRTIO_BLK_S_IOERR, 0)
            } else {
                match copy_guest_to_file(file, sector * SECTOR_SIZE, len, &mut reader) {
                    Ok(()) => {
                        metrics.add_in(len as u64);
                        (VIRTIO_BLK_S_OK, 0)
                    }
                    Err(_) => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
        }
        VIRTIO_BLK_T_FLUSH if !config.read_only => match file.sync_data() {
            Ok(()) => (VIRTIO_BLK_S_OK, 0),
            Err(_) => (VIRTIO_BLK_S_IOERR, 0),
        },
        VIRTIO_BLK_T_GET_ID => {
            let mut id = [0u8; ID_BYTES];
            let src = config.id.as_bytes();
            let n = src.len().min(ID_BYTES);
            id[..n].copy_from_slice(&src[..n]);
            let n = writer.available_bytes().min(ID_BYTES);
            match writer.write_all(&id[..n]) {
                Ok(()) => (VIRTIO_BLK_S_OK, u32::try_from(n).expect("at most ID_BYTES")),
                Err(_) => (VIRTIO_BLK_S_IOERR, 0),
            }
        }
        _ => (VIRTIO_BLK_S_UNSUPP, 0),
    };
    status_writer
        .write_all(&[status])
        .map_err(|_| "cannot write status")?;
    Ok(data_written + 1)
}

/// Whether `len` bytes at `sector` are whole sectors inside the disk.
fn in_range(sector: u64, len: u64, capacity: u64) -> bool {
    len & (SECTOR_SIZE - 1) == 0
        && sector
            .checked_add(len / SECTOR_SIZE)
            .is_some_and(|end| end <= capacity)
}

fn copy_file_to_guest(
    file: &File,
    mut offset: u64,
    len: usize,
    writer: &mut impl Write,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min(len)];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        file.read_exact_at(&mut buf[..n], offset)?;
        writer.write_all(&buf[..n])?;
        offset += n as u64;
        left -= n;
    }
    Ok(())
}

fn copy_guest_to_file(
    file: &File,
    mut offset: u64,
    len: usize,
    reader: &mut impl Read,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min(len)];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        reader.read_exact(&mut buf[..n])?;
        file.write_all_at(&buf[..n], offset)?;
        offset += n as u64;
        left -= n;
    }
    Ok(())
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn set_acked_features(&mut self, _features: u64) {}

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_blk_config starts with `le64 capacity`; the rest is zero because we
        // offer no feature that gives it meaning.
        let mut config = [0u8; 8];
        config.copy_from_slice(&self.capacity.to_le_bytes());
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
        let [queue] = expect_queues(queues)?;
        self.active = Some(Active {
            mem,
            interrupt,
            queue,
        });
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        if index == 0 {
            self.process();
        } else {
            self.metrics.error();
        }
    }

    fn reset(&mut self) {
        self.active = None;
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
            .map(|a| vec![a.queue.state()])
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::CountingInterrupt;
    use crate::devices::virtio::test_utils::TestQueue;
    use std::os::unix::fs::MetadataExt;
    use vm_memory::{Bytes, GuestAddress};

    const HDR: u64 = 0x8000;
    const DATA: u64 = 0x9000;
    const STATUS: u64 = 0xa000;

    struct Fixture {
        mem: GuestMemory,
        tq: TestQueue,
        blk: Block,
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    fn fixture(read_only: bool, size: u64) -> Fixture {
        fixture_with(read_only, size, 1 << 20)
    }

    fn fixture_with(read_only: bool, size: u64, mem_size: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let f = File::create(&path).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(b"sector-one", 512).unwrap();
        let mem = crate::memory::create(mem_size).unwrap();
        let tq = TestQueue::new(&mem, 0x1000, 16);
        let mut blk = Block::new(BlockConfig {
            path: path.clone(),
            read_only,
            id: "root".into(),
        })
        .unwrap();
        let irq = Arc::new(VirtioInterrupt::new(Arc::new(CountingInterrupt::default())));
        blk.activate(mem.clone(), irq, vec![tq.queue()]).unwrap();
        Fixture {
            mem,
            tq,
            blk,
            _dir: dir,
            path,
        }
    }

    fn header(mem: &GuestMemory, type_: u32, sector: u64) {
        let h = RequestHeader {
            type_: type_.into(),
            _reserved: 0.into(),
            sector: sector.into(),
        };
        mem.write_obj(h, GuestAddress(HDR)).unwrap();
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    }

    fn status(mem: &GuestMemory) -> u8 {
        mem.read_obj(GuestAddress(STATUS)).unwrap()
    }

    #[test]
    fn reads_a_sector() {
        let mut f = fixture(true, 1 << 20);
        header(&f.mem, VIRTIO_BLK_T_IN, 1);
        f.tq.add_chain(
            &f.mem,
            0,
            &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
        );
        f.blk.queue_notify(0);
        assert_eq!(status(&f.mem), VIRTIO_BLK_S_OK);
        assert_eq!(f.tq.used(&f.mem, 0), (0, 513));
        let mut buf = [0u8; 10];
        f.mem.read_slice(&mut buf, GuestAddress(DATA)).unwrap();
        assert_eq!(&buf, b"sector-one");
        assert_eq!(f.blk.metrics().snapshot("b").bytes_out, 512);
    }

    #[test]
    fn a_read_longer_than_the_used_ring_can_report_copies_nothing() {
        // Five 1 GiB data descriptors that all alias the same guest memory: 5 GiB of writable
        // buffers, more than the used ring's u32 length can express. virtio-queue ends the
        // chain before 4 GiB (so the "status byte" is the last byte of the third buffer), and
        // nothing is copied: the request fails with only a status byte reported.
        const GIB: u32 = 1 << 30;
        let mut f = fixture_with(true, 8 << 30, 2 << 30);
        header(&f.mem, VIRTIO_BLK_T_IN, 0);
        let mut descs = vec![(HDR, 16, false)];
        descs.extend(std::iter::repeat_n((u64::from(GIB), GIB, true), 5));
        descs.push((STATUS, 1, true));
        f.tq.add_chain(&f.mem, 0, &descs);
        f.blk.queue_notify(0);
        let status_at = u64::from(GIB) + u64::from(GIB) - 1;
        let status: u8 = f.mem.read_obj(GuestAddress(status_at)).unwrap();
        assert_eq!(status, VIRTIO_BLK_S_IOERR);
        assert_eq!(f.tq.used(&f.mem, 0), (0, 1));
        assert_eq!(f.blk.metrics().snapshot("b").bytes_out, 0);
    }

    #[test]
    fn read_only_disk_refuses_writes_and_flush() {
        let mut f = fixture(true, 1 << 20);
        assert_ne!(f.blk.avail_features() & VIRTIO_BLK_F_RO, 0);
        header(&f.mem, VIRTIO_BLK_T_OUT, 0);
        f.tq.add_chain(
            &f.mem,
            0,
            &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)],
        );
        f.blk.queue_notify(0);
        assert_eq!(status(&f.mem), VIRTIO_BLK_S_IOERR);
        header(&f.mem, VIRTIO_BLK_T_FLUSH, 0);
        f.tq.add_chain(&f.mem, 3, &[(HDR, 16, false), (STATUS, 1, true)]);
        f.blk.queue_notify(0);
        assert_eq!(status(&f.mem), VIRTIO_BLK_S_UNSUPP);
    }

    #[test]
    fn writes_flushes_and_stays_sparse() {
        let mut f = fixture(false, 1 << 30);
        f.mem.write_slice(&[0xab; 512], GuestAddress(DATA)).unwrap();
        header(&f.mem, VIRTIO_BLK_T_OUT, (1 << 30) / 512 - 1);
        f.tq.add_chain(
            &f.mem,
            0,
            &[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)],
        );
        f.blk.queue_notify(0);
        assert_eq!(status(&f.mem), VIRTIO_BLK_S_OK);
        header(&f.mem, VIRTIO_BLK_T_FLUSH, 0);
        f.tq.add_chain(&f.mem, 3, &[(HDR, 16, false), (STATUS, 1, true)]);
        f.blk.queue_notify(0);
        assert_eq!(status(&f.mem), VIRTIO_BLK_S_OK);
        let file = File::open(&f.path).unwrap();
        let mut last = [0u8; 512];
        file.read_exact_at(&mut last, (1 << 30) - 512).unwrap();
        assert_eq!(last, [0xab; 512]);
        // A 1 GiB image with two written sectors occupies a few blocks, not 1 GiB.
        assert!(file.metadata().unwrap().blocks() * 512 < 1 << 20);
        // A hole in the middle reads as zeros.
        header(&f.mem, VIRTIO_BLK_T_IN, 1000);
        f.tq.add_chain(
            &f.mem,
            5,
            &[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
        );
        f.blk.queue_notify(0);
        let mut buf = [1u8; 512];
        f.mem.read_slice(&mut buf, GuestAddress(DATA)).unwrap();
        assert_eq!(buf, [0u8; 512]);
    }

    #[test]
    fn out_of_range_and_unaligned_requests_fail_cleanly() {
        let mut f = fixture(false, 1 << 20);
        for (i, sector) in [2048u64, u64::MAX, 2047].into_iter().enumerate() {
            header(&f.mem, VIRTIO_BLK_T_IN, sector);
            let len = if sector == 2047 { 1024 } else { 512 };
            f.tq.add_chain(
                &f.mem,
                u16::try_from(i * 3).unwrap(),
                &[(HDR, 16, false), (DATA, len, true), (STATUS, 1, true)],
            );
            f.blk.queue_notify(0);
            assert_eq!(status(&f.mem), VIRTIO_BLK_S_IOERR, "sector {sector}");
        }
        header(&f.mem, VIRTIO_BLK_T_IN, 0);
        f.tq.add_chain(
            &f.mem,
            9,
            &[(HDR, 16, false), (DATA, 100, true), (STATUS, 1, true)],
        );
        f.blk.queue_notify(0);
        assert_eq!(status(&f.mem), VIRTIO_BLK_S_IOERR);
    }

    #[test]
    fn malformed_chains_never_panic() {
        let mut f = fixture(false, 1 << 20);
        // Header too short.
        f.tq.add_chain(&f.mem, 0, &[(HDR, 8, false), (STATUS, 1, true)]);
        // No status byte.
        header(&f.mem, VIRTIO_BLK_T_IN, 0);
        f.tq.add_chain(&f.mem, 2, &[(HDR, 16, false)]);
        // Buffer outside guest memory.
        f.tq.add_chain(
            &f.mem,
            4,
            &[
                (HDR, 16, false),
                (0x7fff_0000, 512, true),
                (STATUS, 1, true),
            ],
        );
        // Huge length overflowing the address space.
        f.tq.add_chain(
            &f.mem,
            7,
            &[(HDR, 16, false), (DATA, u32::MAX, true), (STATUS, 1, true)],
        );
        // Head index outside the table.
        f.tq.make_available(&f.mem, 999);
        f.blk.queue_notify(0);
        f.blk.queue_notify(3);
        assert_eq!(f.tq.used_idx(&f.mem), 4);
        for i in 0..4 {
            assert_eq!(f.tq.used(&f.mem, i).1, 0, "used element {i}");
        }
        assert!(f.blk.metrics().snapshot("b").errors >= 5);
    }

    #[test]
    fn get_id_and_capacity() {
        let mut f = fixture(true, 1 << 20);
        let mut cap = [0u8; 8];
        f.blk.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), 2048);
        header(&f.mem, VIRTIO_BLK_T_GET_ID, 0);
        f.tq.add_chain(
            &f.mem,
            0,
            &[(HDR, 16, false), (DATA, 20, true), (STATUS, 1, true)],
        );
        f.blk.queue_notify(0);
        let mut id = [0u8; 4];
        f.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id, b"root");
    }

    #[test]
    fn missing_and_empty_images_fail_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |p: PathBuf| BlockConfig {
            path: p,
            read_only: true,
            id: String::new(),
        };
        assert!(matches!(
            Block::new(cfg(dir.path().join("nope"))),
            Err(Error::Open(..))
        ));
        assert!(Block::new(cfg(dir.path().to_path_buf())).is_err());
        let empty = dir.path().join("empty");
        File::create(&empty).unwrap();
        assert!(matches!(Block::new(cfg(empty)), Err(Error::TooSmall(_))));
    }
}
