//! virtio-mmio register file and device activation.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};

use super::regs;
use super::*;
use crate::bus::BusDevice;
use crate::conv::{hi32, lo32};
use crate::devices::Interrupt;
use crate::devices::virtio::{VIRTIO_F_VERSION_1, VirtioDevice, VirtioInterrupt};
use crate::memory::GuestMemory;

/// One virtio-mmio device window.
pub struct MmioTransport {
    device: Arc<Mutex<dyn VirtioDevice>>,
    pub(super) mem: GuestMemory,
    pub(super) interrupt: Arc<VirtioInterrupt>,
    pub(super) queues: Vec<Queue>,
    pub(super) queue_sel: u32,
    pub(super) device_features_sel: u32,
    pub(super) driver_features_sel: u32,
    pub(super) driver_features: u64,
    pub(super) status: u32,
    pub(super) config_generation: u32,
}

impl MmioTransport {
    pub fn new(
        mem: GuestMemory,
        device: Arc<Mutex<dyn VirtioDevice>>,
        line: Arc<dyn Interrupt>,
    ) -> Self {
        let queues = Self::fresh_queues(&device);
        MmioTransport {
            device,
            mem,
            interrupt: Arc::new(VirtioInterrupt::new(line)),
            queues,
            queue_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            config_generation: 0,
        }
    }

    fn fresh_queues(device: &Arc<Mutex<dyn VirtioDevice>>) -> Vec<Queue> {
        lock(device)
            .queue_max_sizes()
            .iter()
            .filter_map(|&max| Queue::new(max).ok())
            .collect()
    }

    /// The device behind this transport.
    pub fn device(&self) -> &Arc<Mutex<dyn VirtioDevice>> {
        &self.device
    }

    /// The device, locked (a poisoned lock still gives the device: its state is plain data).
    pub(super) fn device_locked(&self) -> MutexGuard<'_, dyn VirtioDevice + 'static> {
        lock(&self.device)
    }

    /// Current device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn with_queue(&mut self, f: impl FnOnce(&mut Queue)) {
        // Queue registers may only change before the device is live.
        if self.status & STATUS_DRIVER_OK != 0 {
            tracing::debug!("virtio-mmio: queue register write after DRIVER_OK ignored");
            return;
        }
        if let Some(q) = self.selected_queue() {
            f(q);
        }
    }

    fn reset(&mut self) {
        lock(&self.device).reset();
        self.queues = Self::fresh_queues(&self.device);
        self.queue_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt.ack(u32::MAX);
    }

    fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let old = self.status;
        // The driver may only add bits (spec 3.1.1), except by writing 0.
        if value & old != old {
            tracing::debug!(old, value, "virtio-mmio: status bits cleared without reset");
            return;
        }
        if value & STATUS_FEATURES_OK != 0 && old & STATUS_FEATURES_OK == 0 {
            let avail = lock(&self.device).avail_features();
            if self.driver_features & !avail != 0 || self.driver_features & VIRTIO_F_VERSION_1 == 0
            {
                // Refuse FEATURES_OK: the driver will see the bit did not stick.
                self.status = value & !STATUS_FEATURES_OK;
                return;
            }
            lock(&self.device).set_acked_features(self.driver_features);
        }
        self.status = value;
        if value & STATUS_DRIVER_OK != 0 && old & STATUS_DRIVER_OK == 0 {
            self.activate();
        }
    }

    fn activate(&mut self) {
        if self.status & STATUS_FEATURES_OK == 0 {
            self.status |= STATUS_FAILED;
            return;
        }
        let all_valid = self
            .queues
            .iter()
            .all(|q| !q.ready() || q.is_valid(&self.mem));
        if !all_valid {
            tracing::warn!("virtio-mmio: driver set up an invalid queue; device not activated");
            lock(&self.device).metrics().error();
            self.status |= STATUS_DEVICE_NEEDS_RESET;
            return;
        }
        let queues = std::mem::replace(&mut self.queues, Self::fresh_queues(&self.device));
        let mut dev = lock(&self.device);
        // A device has a handful of queues (`queue_max_sizes`), so the count fits.
        let count = u16::try_from(queues.len()).unwrap_or(u16::MAX);
        if let Err(e) = dev.activate(self.mem.clone(), self.interrupt.clone(), queues) {
            tracing::warn!(error = %e, "virtio-mmio: activation failed");
            dev.metrics().error();
            self.status |= STATUS_DEVICE_NEEDS_RESET;
            return;
        }
        // Buffers the driver made available (and notified) before DRIVER_OK were ignored
        // then; look at every queue once now.
        for index in 0..count {
            dev.queue_notify(index);
        }
    }

    fn read_reg(&mut self, offset: u64) -> u32 {
        match offset {
            regs::MAGIC => MMIO_MAGIC,
            regs::VERSION => MMIO_VERSION,
            regs::DEVICE_ID => lock(&self.device).device_type(),
            regs::VENDOR_ID => VENDOR_ID,
            regs::DEVICE_FEATURES => {
                let f = lock(&self.device).avail_features();
                match self.device_features_sel {
                    0 => lo32(f),
                    1 => hi32(f),
                    _ => 0,
                }
            }
            regs::QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| q.max_size().into()),
            regs::QUEUE_READY => self.selected_queue().map_or(0, |q| q.ready().into()),
            regs::INTERRUPT_STATUS => self.interrupt.status(),
            regs::STATUS => self.status,
            regs::CONFIG_GENERATION => self.config_generation,
            _ => {
                tracing::debug!(offset, "virtio-mmio: read of unknown register");
                0
            }
        }
    }

    fn write_reg(&mut self, offset: u64, value: u32) {
        let lo =
            |q: &mut Queue, f: fn(&mut Queue, Option<u32>, Option<u32>)| f(q, Some(value), None);
        let hi =
            |q: &mut Queue, f: fn(&mut Queue, Option<u32>, Option<u32>)| f(q, None, Some(value));
        match offset {
            regs::DEVICE_FEATURES_SEL => self.device_features_sel = value,
            regs::DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            regs::DRIVER_FEATURES => {
                if self.status & STATUS_FEATURES_OK != 0 {
                    return;
                }
                match self.driver_features_sel {
                    0 => {
                        self.driver_features =
                            (self.driver_features & !0xffff_ffff) | u64::from(value)
                    }
                    1 => {
                        self.driver_features =
                            (self.driver_features & 0xffff_ffff) | (u64::from(value) << 32)
                    }
                    _ => {}
                }
            }
            regs::QUEUE_SEL => self.queue_sel = value,
            regs::QUEUE_NUM => match u16::try_from(value) {
                Ok(size) => self.with_queue(|q| q.set_size(size)),
                // Ignored like any other invalid size (virtio-queue keeps the old one);
                // truncating could turn it into a valid size the driver never asked for.
                Err(_) => {
                    tracing::debug!(value, "virtio-mmio: queue size above 65535 ignored");
                    lock(&self.device).metrics().error();
                }
            },
            regs::QUEUE_READY => self.with_queue(|q| q.set_ready(value == 1)),
            regs::QUEUE_DESC_LOW => self.with_queue(|q| lo(q, Queue::set_desc_table_address)),
            regs::QUEUE_DESC_HIGH => self.with_queue(|q| hi(q, Queue::set_desc_table_address)),
            regs::QUEUE_AVAIL_LOW => self.with_queue(|q| lo(q, Queue::set_avail_ring_address)),
            regs::QUEUE_AVAIL_HIGH => self.with_queue(|q| hi(q, Queue::set_avail_ring_address)),
            regs::QUEUE_USED_LOW => self.with_queue(|q| lo(q, Queue::set_used_ring_address)),
            regs::QUEUE_USED_HIGH => self.with_queue(|q| hi(q, Queue::set_used_ring_address)),
            regs::QUEUE_NOTIFY => {
                let mut dev = lock(&self.device);
                if self.status & STATUS_DRIVER_OK != 0 && dev.is_activated() {
                    // Without VIRTIO_F_NOTIFICATION_DATA the value is the whole queue index:
                    // one above 65535 names no queue, it is not queue `value & 0xffff`.
                    match u16::try_from(value) {
                        Ok(index) => dev.queue_notify(index),
                        Err(_) => dev.metrics().error(),
                    }
                } else {
                    tracing::debug!("virtio-mmio: notify before the device is live");
                }
            }
            regs::INTERRUPT_ACK => self.interrupt.ack(value),
            regs::STATUS => self.set_status(value),
            _ => tracing::debug!(offset, "virtio-mmio: write to unknown register"),
        }
    }
}

fn lock(dev: &Arc<Mutex<dyn VirtioDevice>>) -> MutexGuard<'_, dyn VirtioDevice + 'static> {
    dev.lock().unwrap_or_else(|e| e.into_inner())
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= regs::CONFIG {
            lock(&self.device).read_config(offset - regs::CONFIG, data);
            return;
        }
        if data.len() != 4 || offset & 3 != 0 {
            tracing::debug!(offset, len = data.len(), "virtio-mmio: bad register access");
            lock(&self.device).metrics().error();
            data.fill(0);
            return;
        }
        let v = self.read_reg(offset);
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= regs::CONFIG {
            lock(&self.device).write_config(offset - regs::CONFIG, data);
            self.config_generation = self.config_generation.wrapping_add(1);
            return;
        }
        if data.len() != 4 || offset & 3 != 0 {
            tracing::debug!(offset, len = data.len(), "virtio-mmio: bad register access");
            lock(&self.device).metrics().error();
            return;
        }
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        self.write_reg(offset, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::CountingInterrupt;
    use crate::devices::virtio::rng::Rng;
    use crate::devices::virtio::test_utils::TestQueue;
    use vm_memory::{Bytes, GuestAddress};

    fn rd(t: &mut MmioTransport, off: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn wr(t: &mut MmioTransport, off: u64, v: u32) {
        t.write(off, &v.to_le_bytes());
    }

    fn setup() -> (GuestMemory, MmioTransport, Arc<CountingInterrupt>) {
        let mem = crate::memory::create(1 << 20).unwrap();
        let line = Arc::new(CountingInterrupt::default());
        let dev: Arc<Mutex<dyn VirtioDevice>> = Arc::new(Mutex::new(Rng::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev, line.clone());
        (mem, t, line)
    }

    fn negotiate(t: &mut MmioTransport) {
        wr(t, regs::STATUS, STATUS_ACKNOWLEDGE);
        wr(t, regs::STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        wr(t, regs::DRIVER_FEATURES_SEL, 1);
        wr(t, regs::DRIVER_FEATURES, 1);
        wr(
            t,
            regs::STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
    }

    fn setup_queue(t: &mut MmioTransport, tq: &TestQueue) {
        wr(t, regs::QUEUE_SEL, 0);
        wr(t, regs::QUEUE_NUM, u32::from(tq.size));
        wr(t, regs::QUEUE_DESC_LOW, lo32(tq.desc));
        wr(t, regs::QUEUE_AVAIL_LOW, lo32(tq.avail));
        wr(t, regs::QUEUE_USED_LOW, lo32(tq.used));
        wr(t, regs::QUEUE_READY, 1);
    }

    #[test]
    fn identifies_the_device() {
        let (_, mut t, _) = setup();
        assert_eq!(rd(&mut t, regs::MAGIC), MMIO_MAGIC);
        assert_eq!(rd(&mut t, regs::VERSION), 2);
        assert_eq!(rd(&mut t, regs::DEVICE_ID), 4);
        wr(&mut t, regs::DEVICE_FEATURES_SEL, 1);
        assert_eq!(rd(&mut t, regs::DEVICE_FEATURES), 1, "VIRTIO_F_VERSION_1");
        assert_eq!(rd(&mut t, regs::QUEUE_NUM_MAX), 256);
        wr(&mut t, regs::QUEUE_SEL, 5);
        assert_eq!(rd(&mut t, regs::QUEUE_NUM_MAX), 0, "no such queue");
    }

    #[test]
    fn refuses_features_ok_without_version_1() {
        let (_, mut t, _) = setup();
        wr(&mut t, regs::STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        wr(
            &mut t,
            regs::STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        assert_eq!(rd(&mut t, regs::STATUS) & STATUS_FEATURES_OK, 0);
    }

    #[test]
    fn driver_ok_activates_and_notify_processes() {
        let (mem, mut t, line) = setup();
        let mut tq = TestQueue::new(&mem, 0x1000, 16);
        negotiate(&mut t);
        setup_queue(&mut t, &tq);
        wr(&mut t, regs::STATUS, 0xf);
        assert!(lock(t.device()).is_activated());
        // Queue registers are frozen once live.
        wr(&mut t, regs::QUEUE_NUM, 2);
        tq.add_chain(&mem, 0, &[(0x8000, 32, true)]);
        wr(&mut t, regs::QUEUE_NOTIFY, 0);
        assert_eq!(tq.used(&mem, 0), (0, 32));
        assert_eq!(line.count(), 1);
        assert_eq!(rd(&mut t, regs::INTERRUPT_STATUS), 1);
        wr(&mut t, regs::INTERRUPT_ACK, 1);
        assert_eq!(rd(&mut t, regs::INTERRUPT_STATUS), 0);
        // Reset returns everything to the start.
        wr(&mut t, regs::STATUS, 0);
        assert!(!lock(t.device()).is_activated());
        assert_eq!(rd(&mut t, regs::STATUS), 0);
    }

    #[test]
    fn queue_registers_above_16_bits_are_not_truncated() {
        let (mem, mut t, _) = setup();
        let mut tq = TestQueue::new(&mem, 0x1000, 16);
        negotiate(&mut t);
        setup_queue(&mut t, &tq);
        // 0x1_0004 would truncate to 4, a valid size the driver never chose.
        wr(&mut t, regs::QUEUE_NUM, 0x1_0004);
        assert_eq!(t.queues[0].size(), 16);
        wr(&mut t, regs::STATUS, 0xf);
        assert!(lock(t.device()).is_activated());
        let errors = lock(t.device()).metrics().snapshot("rng").errors;
        tq.add_chain(&mem, 0, &[(0x8000, 32, true)]);
        // Queue 0x1_0000 does not exist; it is not queue 0.
        wr(&mut t, regs::QUEUE_NOTIFY, 0x1_0000);
        assert_eq!(tq.used_idx(&mem), 0);
        assert_eq!(
            lock(t.device()).metrics().snapshot("rng").errors,
            errors + 1
        );
        wr(&mut t, regs::QUEUE_NOTIFY, 0);
        assert_eq!(tq.used_idx(&mem), 1);
    }

    #[test]
    fn invalid_queue_is_not_activated() {
        let (mem, mut t, _) = setup();
        negotiate(&mut t);
        wr(&mut t, regs::QUEUE_SEL, 0);
        wr(&mut t, regs::QUEUE_NUM, 16);
        // Descriptor table outside guest memory (1 MiB).
        wr(&mut t, regs::QUEUE_DESC_LOW, 0x7000_0000);
        wr(&mut t, regs::QUEUE_READY, 1);
        wr(&mut t, regs::STATUS, 0xf);
        assert!(!lock(t.device()).is_activated());
        assert_ne!(rd(&mut t, regs::STATUS) & STATUS_DEVICE_NEEDS_RESET, 0);
        // Notifications to a dead device do nothing.
        wr(&mut t, regs::QUEUE_NOTIFY, 0);
        let used: u16 = mem.read_obj(GuestAddress(0x1000)).unwrap_or(0);
        assert_eq!(used, 0);
    }

    #[test]
    fn bad_widths_and_unknown_registers_are_harmless() {
        let (_, mut t, _) = setup();
        let mut b = [0xaau8; 2];
        t.read(regs::MAGIC, &mut b);
        assert_eq!(b, [0, 0]);
        t.write(regs::STATUS, &[1]);
        assert_eq!(rd(&mut t, regs::STATUS), 0);
        assert_eq!(rd(&mut t, 0x0f0), 0);
        wr(&mut t, 0x0f0, 7);
        let mut b = [0u8; 4];
        t.read(0x3, &mut b); // unaligned
        assert_eq!(lock(t.device()).metrics().snapshot("rng").errors, 3);
        // Config space reads beyond the device's config are zero.
        let mut c = [0xffu8; 8];
        t.read(regs::CONFIG + 0x800, &mut c);
        assert_eq!(c, [0; 8]);
    }
}
