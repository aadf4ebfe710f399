//! The i8042 keyboard controller, reduced to reset (vm-superio's model), and the power-off
//! port.

use std::sync::Arc;

use vm_superio::I8042Device;

use crate::bus::BusDevice;
use crate::exit::{ExitLatch, ExitReason};

/// Resets by ending the VMM with `ExitReason::Reset`.
struct ResetTrigger(Arc<ExitLatch>);

impl vm_superio::Trigger for ResetTrigger {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        tracing::info!("guest reset through the i8042 controller");
        self.0.set(ExitReason::Reset);
        Ok(())
    }
}

/// i8042 at ports 0x60..0x65.
pub struct I8042 {
    inner: I8042Device<ResetTrigger>,
}

impl I8042 {
    /// Bus window size (data port 0x60 through command port 0x64).
    pub const LEN: u64 = 5;

    pub fn new(exit: Arc<ExitLatch>) -> Self {
        I8042 {
            inner: I8042Device::new(ResetTrigger(exit)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        // The bus routes only offsets below LEN here, so they fit a u8.
        if data.len() == 1
            && let Ok(offset) = u8::try_from(offset)
        {
            data[0] = self.inner.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        // The bus routes only offsets below LEN here, so they fit a u8.
        if data.len() == 1
            && let Ok(offset) = u8::try_from(offset)
        {
            let _ = self.inner.write(offset, data[0]);
        }
    }
}

/// One I/O port: any one-byte write powers the VM off. Reads return 0.
pub struct PowerOff {
    exit: Arc<ExitLatch>,
}

impl PowerOff {
    pub const LEN: u64 = 1;

    pub fn new(exit: Arc<ExitLatch>) -> Self {
        PowerOff { exit }
    }
}

impl BusDevice for PowerOff {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.len() == 1 {
            tracing::info!("guest power-off through the power-off port");
            self.exit.set(ExitReason::PowerOff);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_on_the_power_off_port_powers_off() {
        let exit = Arc::new(ExitLatch::new());
        let mut dev = PowerOff::new(exit.clone());
        dev.write(0, &[0, 0]); // wrong width
        assert_eq!(exit.get(), None);
        dev.write(0, &[1]);
        assert_eq!(exit.get(), Some(ExitReason::PowerOff));
    }

    #[test]
    fn reset_command_latches_reset() {
        let exit = Arc::new(ExitLatch::new());
        let mut dev = I8042::new(exit.clone());
        dev.write(0, &[0xfe]); // data port: not a command
        assert_eq!(exit.get(), None);
        dev.write(4, &[0xfe, 0]); // wrong width
        assert_eq!(exit.get(), None);
        dev.write(4, &[0xfe]);
        assert_eq!(exit.get(), Some(ExitReason::Reset));
    }
}
