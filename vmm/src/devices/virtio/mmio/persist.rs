//! The transport's saved state: the register file, the queues the driver is still setting
//! up, and the queues the device runs. Restoring re-activates the device with its queues
//! where they were, without the guest driver seeing a reset.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState};

use super::STATUS_DRIVER_OK;
use super::device::MmioTransport;
use crate::devices::virtio::{ActivateError, VirtioDevice};

/// Errors restoring a transport.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Saved queue {0} is invalid: {1}
    Queue(usize, String),
    /// Saved state has {got} queues, the device has {expected}
    QueueCount { expected: usize, got: usize },
    /// Cannot re-activate the device
    Activate(#[source] ActivateError),
}

/// One virtqueue (virtio-queue's `QueueState` as serde data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSaved {
    pub max_size: u16,
    pub next_avail: u16,
    pub next_used: u16,
    pub event_idx_enabled: bool,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
}

impl From<QueueState> for QueueSaved {
    fn from(q: QueueState) -> Self {
        QueueSaved {
            max_size: q.max_size,
            next_avail: q.next_avail,
            next_used: q.next_used,
            event_idx_enabled: q.event_idx_enabled,
            size: q.size,
            ready: q.ready,
            desc_table: q.desc_table,
            avail_ring: q.avail_ring,
            used_ring: q.used_ring,
        }
    }
}

impl QueueSaved {
    fn to_queue(&self, index: usize) -> Result<Queue, Error> {
        Queue::try_from(QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx_enabled,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
        .map_err(|e| Error::Queue(index, e.to_string()))
    }
}

/// A virtio-mmio device window's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportSaved {
    pub queue_sel: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub driver_features: u64,
    pub status: u32,
    pub config_generation: u32,
    pub interrupt_status: u32,
    /// The queues as the transport holds them (before DRIVER_OK).
    pub queues: Vec<QueueSaved>,
    /// The queues the activated device runs (empty if it is not active).
    pub active_queues: Vec<QueueSaved>,
}

fn to_queues(saved: &[QueueSaved], expected: usize) -> Result<Vec<Queue>, Error> {
    if saved.len() != expected {
        return Err(Error::QueueCount {
            expected,
            got: saved.len(),
        });
    }
    saved
        .iter()
        .enumerate()
        .map(|(i, q)| q.to_queue(i))
        .collect()
}

impl MmioTransport {
    /// The transport's state; `dev` is this transport's device, locked by the caller so
    /// that it stays quiet until guest memory is saved too.
    pub fn state(&self, dev: &dyn VirtioDevice) -> TransportSaved {
        TransportSaved {
            queue_sel: self.queue_sel,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            status: self.status,
            config_generation: self.config_generation,
            interrupt_status: self.interrupt.status(),
            queues: self.queues.iter().map(|q| q.state().into()).collect(),
            active_queues: if dev.is_activated() {
                dev.queue_states().into_iter().map(Into::into).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// Puts a saved state into a fresh transport and re-activates its device if it was live.
    pub fn restore(&mut self, s: &TransportSaved) -> Result<(), Error> {
        let expected = self.device_locked().queue_max_sizes().len();
        self.queues = to_queues(&s.queues, expected)?;
        self.queue_sel = s.queue_sel;
        self.device_features_sel = s.device_features_sel;
        self.driver_features_sel = s.driver_features_sel;
        self.driver_features = s.driver_features;
        self.status = s.status;
        self.config_generation = s.config_generation;
        self.interrupt.set_status(s.interrupt_status);
        if s.status & STATUS_DRIVER_OK != 0 && !s.active_queues.is_empty() {
            let queues = to_queues(&s.active_queues, expected)?;
            let mem = self.mem.clone();
            let interrupt = self.interrupt.clone();
            let mut dev = self.device_locked();
            dev.set_acked_features(s.driver_features);
            dev.activate(mem, interrupt, queues)
                .map_err(Error::Activate)?;
            dev.after_restore();
        }
        Ok(())
    }
}
