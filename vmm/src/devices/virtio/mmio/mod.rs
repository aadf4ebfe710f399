//! The virtio-mmio transport (virtio 1.x, "version 2" register layout): the register file
//! the guest driver programs, in front of any `VirtioDevice`.

mod device;
mod persist;

pub use device::MmioTransport;
pub use persist::{Error as PersistError, QueueSaved, TransportSaved};

/// "virt" in little endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// Modern virtio-mmio.
pub const MMIO_VERSION: u32 = 2;
/// Vendor id reported to the guest ("BJ").
pub const VENDOR_ID: u32 = 0x4a42;

/// Device status bits (virtio spec 2.1).
pub use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE as STATUS_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER as STATUS_DRIVER,
    VIRTIO_CONFIG_S_DRIVER_OK as STATUS_DRIVER_OK, VIRTIO_CONFIG_S_FAILED as STATUS_FAILED,
    VIRTIO_CONFIG_S_FEATURES_OK as STATUS_FEATURES_OK,
    VIRTIO_CONFIG_S_NEEDS_RESET as STATUS_DEVICE_NEEDS_RESET,
};

/// Register offsets, as the bus hands them to the transport (u64).
pub mod regs {
    use virtio_bindings::virtio_mmio as m;

    pub const MAGIC: u64 = m::VIRTIO_MMIO_MAGIC_VALUE as u64;
    pub const VERSION: u64 = m::VIRTIO_MMIO_VERSION as u64;
    pub const DEVICE_ID: u64 = m::VIRTIO_MMIO_DEVICE_ID as u64;
    pub const VENDOR_ID: u64 = m::VIRTIO_MMIO_VENDOR_ID as u64;
    pub const DEVICE_FEATURES: u64 = m::VIRTIO_MMIO_DEVICE_FEATURES as u64;
    pub const DEVICE_FEATURES_SEL: u64 = m::VIRTIO_MMIO_DEVICE_FEATURES_SEL as u64;
    pub const DRIVER_FEATURES: u64 = m::VIRTIO_MMIO_DRIVER_FEATURES as u64;
    pub const DRIVER_FEATURES_SEL: u64 = m::VIRTIO_MMIO_DRIVER_FEATURES_SEL as u64;
    pub const QUEUE_SEL: u64 = m::VIRTIO_MMIO_QUEUE_SEL as u64;
    pub const QUEUE_NUM_MAX: u64 = m::VIRTIO_MMIO_QUEUE_NUM_MAX as u64;
    pub const QUEUE_NUM: u64 = m::VIRTIO_MMIO_QUEUE_NUM as u64;
    pub const QUEUE_READY: u64 = m::VIRTIO_MMIO_QUEUE_READY as u64;
    pub const QUEUE_NOTIFY: u64 = m::VIRTIO_MMIO_QUEUE_NOTIFY as u64;
    pub const INTERRUPT_STATUS: u64 = m::VIRTIO_MMIO_INTERRUPT_STATUS as u64;
    pub const INTERRUPT_ACK: u64 = m::VIRTIO_MMIO_INTERRUPT_ACK as u64;
    pub const STATUS: u64 = m::VIRTIO_MMIO_STATUS as u64;
    pub const QUEUE_DESC_LOW: u64 = m::VIRTIO_MMIO_QUEUE_DESC_LOW as u64;
    pub const QUEUE_DESC_HIGH: u64 = m::VIRTIO_MMIO_QUEUE_DESC_HIGH as u64;
    pub const QUEUE_AVAIL_LOW: u64 = m::VIRTIO_MMIO_QUEUE_AVAIL_LOW as u64;
    pub const QUEUE_AVAIL_HIGH: u64 = m::VIRTIO_MMIO_QUEUE_AVAIL_HIGH as u64;
    pub const QUEUE_USED_LOW: u64 = m::VIRTIO_MMIO_QUEUE_USED_LOW as u64;
    pub const QUEUE_USED_HIGH: u64 = m::VIRTIO_MMIO_QUEUE_USED_HIGH as u64;
    pub const CONFIG_GENERATION: u64 = m::VIRTIO_MMIO_CONFIG_GENERATION as u64;
    pub const CONFIG: u64 = m::VIRTIO_MMIO_CONFIG as u64;
}
