//! Virtio devices on the virtio-mmio transport.
//!
//! A device model implements `VirtioDevice`; the `mmio` transport owns the register file
//! and the queues until the driver sets DRIVER_OK, then hands the queues and guest memory to
//! the device. Queue notifications are processed synchronously on the vCPU thread that
//! wrote QueueNotify (no ioeventfd, so the same code runs on any hypervisor); host-side
//! events (vsock and net sockets) are handled by the device thread through
//! `event_handler.rs`.

pub mod block;
pub mod mmio;
pub mod net;
pub mod rng;
pub mod vsock;

#[cfg(test)]
pub(crate) mod test_utils;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use virtio_bindings::{virtio_config, virtio_ids, virtio_mmio};
use virtio_queue::Queue;

use crate::devices::Interrupt;
use crate::memory::GuestMemory;
use crate::metrics::DeviceMetrics;

/// Virtio device ids (virtio spec 5).
pub const TYPE_NET: u32 = virtio_ids::VIRTIO_ID_NET;
pub const TYPE_BLOCK: u32 = virtio_ids::VIRTIO_ID_BLOCK;
pub const TYPE_RNG: u32 = virtio_ids::VIRTIO_ID_RNG;
pub const TYPE_VSOCK: u32 = virtio_ids::VIRTIO_ID_VSOCK;

/// VIRTIO_F_VERSION_1: the modern (non-legacy) interface. Every Belljar device offers it.
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_config::VIRTIO_F_VERSION_1;

/// InterruptStatus bit: a used buffer was added to a queue.
pub const INTERRUPT_USED_RING: u32 = virtio_mmio::VIRTIO_MMIO_INT_VRING;
/// InterruptStatus bit: the configuration space changed.
pub const INTERRUPT_CONFIG: u32 = virtio_mmio::VIRTIO_MMIO_INT_CONFIG;

/// Errors activating a virtio device.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ActivateError {
    /// Expected {expected} queues, the driver set up {got}
    QueueCount { expected: usize, got: usize },
    /// Device backend failed: {0}
    Backend(String),
}

/// The driver's queues as exactly `N`, or the error `activate` answers any other count with.
pub fn expect_queues<const N: usize>(queues: Vec<Queue>) -> Result<[Queue; N], ActivateError> {
    let got = queues.len();
    queues
        .try_into()
        .map_err(|_| ActivateError::QueueCount { expected: N, got })
}

/// The device's side of the interrupt: the InterruptStatus register plus the line.
pub struct VirtioInterrupt {
    status: AtomicU32,
    line: Arc<dyn Interrupt>,
}

impl VirtioInterrupt {
    pub fn new(line: Arc<dyn Interrupt>) -> Self {
        VirtioInterrupt {
            status: AtomicU32::new(0),
            line,
        }
    }

    /// Tells the driver a queue has new used buffers.
    pub fn signal_used_queue(&self) {
        self.status.fetch_or(INTERRUPT_USED_RING, Ordering::SeqCst);
        self.line.trigger();
    }

    /// Tells the driver the configuration space changed.
    pub fn signal_config_change(&self) {
        self.status.fetch_or(INTERRUPT_CONFIG, Ordering::SeqCst);
        self.line.trigger();
    }

    /// InterruptStatus.
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// Puts back a saved InterruptStatus (a snapshot restore).
    pub fn set_status(&self, bits: u32) {
        self.status.store(bits, Ordering::SeqCst);
    }

    /// InterruptACK.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }
}

/// A virtio device model, independent of the transport.
pub trait VirtioDevice: Send {
    /// Virtio device id (`TYPE_*`).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits the device offers.
    fn avail_features(&self) -> u64;
    /// Feature bits the driver accepted (a subset of `avail_features`).
    fn set_acked_features(&mut self, features: u64);
    /// Reads the device-specific configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific configuration space (most devices ignore it).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts the device with the driver's queues.
    fn activate(
        &mut self,
        mem: GuestMemory,
        interrupt: Arc<VirtioInterrupt>,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError>;
    /// The driver notified queue `index` (QueueNotify).
    fn queue_notify(&mut self, index: u16);
    /// Device reset by the driver; returns the device to its pre-activation state.
    fn reset(&mut self);
    /// Whether `activate` succeeded and no reset happened since.
    fn is_activated(&self) -> bool;
    /// The device's counters.
    fn metrics(&self) -> Arc<DeviceMetrics>;
    /// The queues the device runs (after `activate`), for a snapshot; empty when inactive.
    fn queue_states(&self) -> Vec<virtio_queue::QueueState>;
    /// Called once the device was re-activated from a snapshot in a new VMM: host-side
    /// state the snapshot could not carry (connections, sockets) is gone.
    fn after_restore(&mut self) {}
}

/// Takes the next available descriptor chain; a broken avail ring ends the batch.
pub(crate) fn pop_chain<'a>(
    queue: &mut Queue,
    mem: &'a GuestMemory,
    metrics: &DeviceMetrics,
) -> Option<virtio_queue::DescriptorChain<&'a GuestMemory>> {
    use virtio_queue::QueueOwnedT;
    match queue.iter(mem) {
        Ok(mut it) => it.next(),
        Err(e) => {
            tracing::warn!(error = %e, "virtio: broken avail ring");
            metrics.error();
            None
        }
    }
}

/// Returns a chain to the driver; a head outside the queue is counted and dropped.
pub(crate) fn add_used(
    queue: &mut Queue,
    mem: &GuestMemory,
    head: u16,
    len: u32,
    metrics: &DeviceMetrics,
) -> bool {
    use virtio_queue::QueueT;
    match queue.add_used(mem, head, len) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, head, "virtio: cannot return descriptor");
            metrics.error();
            false
        }
    }
}
