//! 8250 UART model (vm-superio) on the port-I/O bus.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use crate::bus::BusDevice;
use crate::devices::{Interrupt, SuperioTrigger};
use crate::metrics::DeviceMetrics;

/// Where console output goes.
pub struct SerialOutput {
    file: Option<File>,
    echo: bool,
    metrics: Arc<DeviceMetrics>,
}

impl SerialOutput {
    pub fn new(file: Option<File>, echo: bool, metrics: Arc<DeviceMetrics>) -> Self {
        SerialOutput {
            file,
            echo,
            metrics,
        }
    }
}

impl Write for SerialOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.metrics.add_in(buf.len() as u64);
        if let Some(f) = &mut self.file {
            // A full disk must not stop the guest; the byte is counted and dropped.
            let _ = f.write_all(buf);
        }
        if self.echo {
            let _ = std::io::stdout().write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(f) = &mut self.file {
            f.flush()?;
        }
        if self.echo {
            std::io::stdout().flush()?;
        }
        Ok(())
    }
}

/// COM1 on the port bus (8 registers).
pub struct Serial {
    pub(super) inner:
        vm_superio::Serial<SuperioTrigger, vm_superio::serial::NoEvents, SerialOutput>,
}

impl Serial {
    /// Bus window size.
    pub const LEN: u64 = 8;

    pub fn new(irq: Arc<dyn Interrupt>, out: SerialOutput) -> Self {
        Serial {
            inner: vm_superio::Serial::new(SuperioTrigger(irq), out),
        }
    }

    /// Sends console input to the guest.
    pub fn input(&mut self, bytes: &[u8]) -> usize {
        self.inner.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        // The bus routes only offsets below LEN here, so they fit a u8.
        if data.len() == 1
            && offset < Self::LEN
            && let Ok(offset) = u8::try_from(offset)
        {
            data[0] = self.inner.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        // The bus routes only offsets below LEN here, so they fit a u8.
        if data.len() == 1
            && offset < Self::LEN
            && let Ok(offset) = u8::try_from(offset)
        {
            let _ = self.inner.write(offset, data[0]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::CountingInterrupt;

    #[test]
    fn bytes_reach_the_log_file_and_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let metrics = Arc::new(DeviceMetrics::default());
        let irq = Arc::new(CountingInterrupt::default());
        let out = SerialOutput::new(Some(File::create(&path).unwrap()), false, metrics.clone());
        let mut serial = Serial::new(irq.clone(), out);
        for b in b"hi\n" {
            serial.write(0, &[*b]);
        }
        serial.write(0, b"xy"); // wrong width: ignored
        assert_eq!(std::fs::read(&path).unwrap(), b"hi\n");
        assert_eq!(metrics.snapshot("serial").bytes_in, 3);
        // Line status register reports an empty transmitter.
        let mut lsr = [0u8];
        serial.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
    }

    #[test]
    fn transmit_interrupt_fires_when_enabled() {
        let metrics = Arc::new(DeviceMetrics::default());
        let irq = Arc::new(CountingInterrupt::default());
        let mut serial = Serial::new(irq.clone(), SerialOutput::new(None, false, metrics));
        serial.write(1, &[0x02]); // IER: THR empty interrupt
        serial.write(0, b"a");
        assert!(irq.count() >= 1);
    }
}
