//! The virtio-rng device model.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use virtio_queue::Queue;

use super::{Error, MAX_BYTES_PER_REQUEST, QUEUE_SIZE};
use crate::devices::virtio::{
    ActivateError, TYPE_RNG, VIRTIO_F_VERSION_1, VirtioDevice, VirtioInterrupt, add_used,
    expect_queues, pop_chain,
};
use crate::memory::GuestMemory;
use crate::metrics::DeviceMetrics;

struct Active {
    mem: GuestMemory,
    interrupt: Arc<VirtioInterrupt>,
    queue: Queue,
}

/// virtio-rng.
pub struct Rng {
    source: File,
    active: Option<Active>,
    metrics: Arc<DeviceMetrics>,
}

impl Rng {
    pub fn new() -> Result<Self, Error> {
        Ok(Rng {
            source: File::open("/dev/urandom").map_err(Error::OpenUrandom)?,
            active: None,
            metrics: Arc::new(DeviceMetrics::default()),
        })
    }

    fn process(&mut self) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let mut used_any = false;
        let mut buf = vec![0u8; MAX_BYTES_PER_REQUEST];
        while let Some(chain) = pop_chain(&mut active.queue, &active.mem, &self.metrics) {
            let head = chain.head_index();
            let written = match chain.writer(&active.mem) {
                Ok(mut w) => {
                    let n = w.available_bytes().min(MAX_BYTES_PER_REQUEST);
                    if self.source.read_exact(&mut buf[..n]).is_ok() {
                        std::io::Write::write_all(&mut w, &buf[..n])
                            // n <= MAX_BYTES_PER_REQUEST, far below u32::MAX.
                            .map(|()| u32::try_from(n).unwrap_or(0))
                            .unwrap_or(0)
                    } else {
                        0
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "virtio-rng: malformed descriptor chain");
                    self.metrics.error();
                    0
                }
            };
            self.metrics.add_out(u64::from(written));
            self.metrics.request();
            used_any |= add_used(&mut active.queue, &active.mem, head, written, &self.metrics);
        }
        if used_any {
            active.interrupt.signal_used_queue();
        }
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn avail_features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn set_acked_features(&mut self, _features: u64) {}

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
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
    use vm_memory::{Bytes, GuestAddress};

    fn setup() -> (GuestMemory, TestQueue, Rng, Arc<CountingInterrupt>) {
        let mem = crate::memory::create(1 << 20).unwrap();
        let tq = TestQueue::new(&mem, 0x1000, 16);
        let mut rng = Rng::new().unwrap();
        let line = Arc::new(CountingInterrupt::default());
        let irq = Arc::new(VirtioInterrupt::new(line.clone()));
        rng.activate(mem.clone(), irq, vec![tq.queue()]).unwrap();
        (mem, tq, rng, line)
    }

    #[test]
    fn fills_writable_buffers() {
        let (mem, mut tq, mut rng, line) = setup();
        tq.add_chain(&mem, 0, &[(0x8000, 64, true), (0x9000, 64, true)]);
        rng.queue_notify(0);
        assert_eq!(tq.used_idx(&mem), 1);
        assert_eq!(tq.used(&mem, 0), (0, 128));
        let mut b = [0u8; 64];
        mem.read_slice(&mut b, GuestAddress(0x8000)).unwrap();
        assert_ne!(b, [0u8; 64], "64 random bytes are not all zero");
        assert_eq!(line.count(), 1);
        assert_eq!(rng.metrics().snapshot("rng").bytes_out, 128);
    }

    #[test]
    fn malformed_chains_complete_with_zero_bytes() {
        let (mem, mut tq, mut rng, _) = setup();
        // Out of guest memory.
        tq.add_chain(&mem, 0, &[(0xffff_0000, 64, true)]);
        // Read-only buffer: nothing to fill.
        tq.add_chain(&mem, 2, &[(0x8000, 64, false)]);
        // Descriptor index out of the table.
        tq.make_available(&mem, 200);
        // Huge length is capped.
        tq.add_chain(&mem, 4, &[(0x10000, 0x80000, true)]);
        rng.queue_notify(0);
        rng.queue_notify(7); // no such queue
        assert_eq!(tq.used(&mem, 0), (0, 0));
        assert_eq!(tq.used(&mem, 1), (2, 0));
        let last = tq.used(&mem, tq.used_idx(&mem) - 1);
        assert_eq!(last, (4, u32::try_from(MAX_BYTES_PER_REQUEST).unwrap()));
        assert!(rng.metrics().snapshot("rng").errors >= 2);
    }

    #[test]
    fn descriptor_loop_does_not_hang() {
        let (mem, mut tq, mut rng, _) = setup();
        tq.set_desc(&mem, 0, 0x8000, 16, 3, 1);
        tq.set_desc(&mem, 1, 0x8100, 16, 3, 0);
        tq.make_available(&mem, 0);
        rng.queue_notify(0);
        assert_eq!(tq.used_idx(&mem), 1);
    }
}
