//! virtio-blk: the guest's disks, backed by raw image files on the host.
//!
//! The root filesystem image is shared by many sandboxes and attached read-only; each
//! sandbox's writable layer is a second, read-write disk. Images may be sparse: holes read
//! as zeros and are only allocated when the guest writes them.

mod device;

use virtio_bindings::virtio_blk as blk;

use crate::conv::byte_const;

pub use device::{Block, BlockConfig};

/// Sector size of the virtio-blk protocol.
pub const SECTOR_SIZE: u64 = 512;
/// Queue size.
pub const QUEUE_SIZE: u16 = 256;
/// Bounce buffer size for one file read or write.
pub const CHUNK: usize = 128 * 1024;
/// Length of the GET_ID answer.
pub const ID_BYTES: usize = blk::VIRTIO_BLK_ID_BYTES as usize;

/// Request types (virtio spec 5.2.6).
pub use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};

/// Request status, as the one status byte the device writes.
pub const VIRTIO_BLK_S_OK: u8 = byte_const(blk::VIRTIO_BLK_S_OK);
pub const VIRTIO_BLK_S_IOERR: u8 = byte_const(blk::VIRTIO_BLK_S_IOERR);
pub const VIRTIO_BLK_S_UNSUPP: u8 = byte_const(blk::VIRTIO_BLK_S_UNSUPP);

/// Feature bits (virtio-bindings gives bit numbers).
pub const VIRTIO_BLK_F_RO: u64 = 1 << blk::VIRTIO_BLK_F_RO;
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << blk::VIRTIO_BLK_F_FLUSH;

/// Errors opening a disk.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot open disk image {0}
    Open(String, #[source] std::io::Error),
    /// Disk image {0} is smaller than one sector
    TooSmall(String),
}
