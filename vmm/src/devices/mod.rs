//! Device models: legacy x86 devices, the serial console and virtio devices.
//!
//! Devices raise interrupts through the `Interrupt` trait, never through a hypervisor
//! type, so they run unchanged on any backend (and in unit tests without a VM).

pub mod legacy;
pub mod serial;
pub mod virtio;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::hypervisor::Vm;

/// An interrupt a device can raise.
pub trait Interrupt: Send + Sync {
    /// Signals the interrupt to the guest.
    fn trigger(&self);
}

/// A platform interrupt line of a VM, pulsed as an edge.
pub struct IrqLine {
    vm: Arc<dyn Vm>,
    irq: u32,
    raised: AtomicU64,
}

impl IrqLine {
    pub fn new(vm: Arc<dyn Vm>, irq: u32) -> Self {
        IrqLine {
            vm,
            irq,
            raised: AtomicU64::new(0),
        }
    }

    /// How many times the line was raised.
    pub fn count(&self) -> u64 {
        self.raised.load(Ordering::Relaxed)
    }
}

impl Interrupt for IrqLine {
    fn trigger(&self) {
        self.raised.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self
            .vm
            .set_irq_line(self.irq, true)
            .and_then(|()| self.vm.set_irq_line(self.irq, false))
        {
            tracing::warn!(irq = self.irq, error = %e, "cannot raise interrupt");
        }
    }
}

/// An interrupt that only counts, for devices whose interrupt is not wired to a VM (unit
/// tests, devices on a bus without an interrupt controller).
#[derive(Debug, Default)]
pub struct CountingInterrupt(AtomicU64);

impl CountingInterrupt {
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Interrupt for CountingInterrupt {
    fn trigger(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Adapts our `Interrupt` to vm-superio's `Trigger`.
pub(crate) struct SuperioTrigger(pub Arc<dyn Interrupt>);

impl vm_superio::Trigger for SuperioTrigger {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.trigger();
        Ok(())
    }
}
