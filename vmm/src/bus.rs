//! The I/O bus: routes port I/O and MMIO exits to the device that owns the address.
//!
//! Both address spaces use the same `BusDevice` interface, and `IoBus` implements the
//! hypervisor's single `IoHandler` callback, so vCPU code never knows which device it hit.
//! Accesses to unclaimed addresses are counted and refused: reads see all-ones, writes are
//! dropped.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::hypervisor::IoHandler;
use crate::metrics::BusMetrics;

/// A device reachable through port I/O or MMIO.
pub trait BusDevice: Send {
    /// Guest read of `data.len()` bytes at `offset` from the device's base.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Guest write at `offset` from the device's base.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors building a bus.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Device range {0:#x}+{1:#x} overlaps another device or is empty
    Overlap(u64, u64),
}

/// A shared device on the bus.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// One address space (ports or memory).
#[derive(Default, Clone)]
pub struct Bus {
    devices: BTreeMap<u64, (u64, SharedDevice)>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims `[base, base + len)` for `device`.
    pub fn insert(&mut self, base: u64, len: u64, device: SharedDevice) -> Result<(), Error> {
        let end = base.checked_add(len).filter(|_| len > 0);
        let Some(end) = end else {
            return Err(Error::Overlap(base, len));
        };
        if let Some((&b, &(l, _))) = self.devices.range(..end).next_back()
            && b + l > base
        {
            return Err(Error::Overlap(base, len));
        }
        self.devices.insert(base, (len, device));
        Ok(())
    }

    /// The device owning `addr` and the offset of `addr` inside it. The whole access
    /// `[addr, addr + size)` must fit in the device.
    pub fn resolve(&self, addr: u64, size: usize) -> Option<(u64, &SharedDevice)> {
        let (&base, (len, dev)) = self.devices.range(..=addr).next_back()?;
        let offset = addr - base;
        if offset.checked_add(size as u64)? <= *len {
            Some((offset, dev))
        } else {
            None
        }
    }

    /// Reads from the device at `addr`; false if no device claims it.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((offset, dev)) => {
                lock(dev).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Writes to the device at `addr`; false if no device claims it.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((offset, dev)) => {
                lock(dev).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device; a device whose lock was poisoned by a panic keeps serving, since its
/// state is still the best we have and the guest must not be able to wedge the VMM.
fn lock(dev: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    dev.lock().unwrap_or_else(|e| e.into_inner())
}

/// The port-I/O and MMIO buses of one VM.
#[derive(Clone)]
pub struct IoBus {
    pub pio: Bus,
    pub mmio: Bus,
    metrics: Arc<BusMetrics>,
}

impl IoBus {
    pub fn new(metrics: Arc<BusMetrics>) -> Self {
        IoBus {
            pio: Bus::new(),
            mmio: Bus::new(),
            metrics,
        }
    }
}

impl IoHandler for IoBus {
    fn pio_read(&self, port: u16, data: &mut [u8]) {
        if !self.pio.read(u64::from(port), data) {
            self.metrics.unknown_pio.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(port, len = data.len(), "read from unclaimed port");
            data.fill(0xff);
        }
    }

    fn pio_write(&self, port: u16, data: &[u8]) {
        if !self.pio.write(u64::from(port), data) {
            self.metrics.unknown_pio.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(port, len = data.len(), "write to unclaimed port");
        }
    }

    fn mmio_read(&self, addr: u64, data: &mut [u8]) {
        if !self.mmio.read(addr, data) {
            self.metrics.unknown_mmio.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(addr, len = data.len(), "read from unclaimed MMIO address");
            data.fill(0xff);
        }
    }

    fn mmio_write(&self, addr: u64, data: &[u8]) {
        if !self.mmio.write(addr, data) {
            self.metrics.unknown_mmio.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(addr, len = data.len(), "write to unclaimed MMIO address");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch register file: a real (if trivial) device.
    struct Scratch(Vec<u8>);

    impl BusDevice for Scratch {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            let o = crate::conv::to_usize(offset);
            data.copy_from_slice(&self.0[o..o + data.len()]);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            let o = crate::conv::to_usize(offset);
            self.0[o..o + data.len()].copy_from_slice(data);
        }
    }

    fn scratch(len: usize) -> SharedDevice {
        Arc::new(Mutex::new(Scratch(vec![0; len])))
    }

    #[test]
    fn routes_to_the_owning_device_with_offsets() {
        let mut bus = Bus::new();
        bus.insert(0x1000, 0x10, scratch(0x10)).unwrap();
        bus.insert(0x2000, 0x10, scratch(0x10)).unwrap();
        assert!(bus.write(0x2004, &[1, 2, 3, 4]));
        let mut buf = [0u8; 4];
        assert!(bus.read(0x2004, &mut buf));
        assert_eq!(buf, [1, 2, 3, 4]);
        assert!(bus.read(0x1004, &mut buf));
        assert_eq!(buf, [0; 4]);
    }

    #[test]
    fn refuses_overlaps_and_empty_ranges() {
        let mut bus = Bus::new();
        bus.insert(0x1000, 0x10, scratch(0x10)).unwrap();
        assert!(bus.insert(0x100f, 0x10, scratch(0x10)).is_err());
        assert!(bus.insert(0xff8, 0x10, scratch(0x10)).is_err());
        assert!(bus.insert(0x3000, 0, scratch(0x10)).is_err());
        assert!(bus.insert(u64::MAX, 2, scratch(0x10)).is_err());
        bus.insert(0x1010, 0x10, scratch(0x10)).unwrap();
    }

    #[test]
    fn unknown_and_straddling_accesses_are_counted_and_refused() {
        let metrics = Arc::new(BusMetrics::default());
        let mut io = IoBus::new(metrics.clone());
        io.mmio.insert(0x1000, 0x10, scratch(0x10)).unwrap();
        let mut buf = [0u8; 4];
        io.mmio_read(0x100e, &mut buf); // straddles the end
        assert_eq!(buf, [0xff; 4]);
        io.mmio_write(0x5000, &[1]);
        io.pio_read(0x80, &mut buf[..1]);
        assert_eq!(metrics.unknown_mmio.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.unknown_pio.load(Ordering::Relaxed), 1);
    }
}
