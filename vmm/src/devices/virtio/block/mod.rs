//! virtio-blk: the guest's disks, backed by raw image files on the host.
//!
//! The root filesystem image is shared by many sandboxes and attached read-only; each
//! sandbox's writable layer is a second, read-write disk. Images may be sparse: holes read
//! as zeros and are only allocated when the guest writes them.

mod device;

pub use device::{Block, BlockConfig};

/// Sector size of the virtio-blk protocol.
pub const SECTOR_SIZE: u64 = 512;
/// Queue size.
pub const QUEUE_SIZE: u16 = 256;
/// Bounce buffer size for one file read or write.
pub const CHUNK: usize = 128 * 1024;
/// Length of the GET_ID answer.
pub const ID_BYTES: usize = 20;

/// Request types (virtio spec 5.2.6).
pub const VIRTIO_BLK_T_IN: u32 = 0;
pub const VIRTIO_BLK_T_OUT: u32 = 1;
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;

/// Request status.
pub const VIRTIO_BLK_S_OK: u8 = 0;
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// Feature bits.
pub const VIRTIO_BLK_F_RO: u64 = 1 << 5;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;

/// Errors opening a disk.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot open disk image {0}
    Open(String, #[source] std::io::Error),
    /// Disk image {0} is smaller than one sector
    TooSmall(String),
}
