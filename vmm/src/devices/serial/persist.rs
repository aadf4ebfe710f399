//! The UART's saved state: vm-superio's `SerialState` as plain serde data.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::device::{Serial, SerialOutput};
use crate::devices::SuperioTrigger;

/// Bytes the UART's receive FIFO holds at most (vm-superio's FIFO_SIZE).
const FIFO_SIZE: usize = 64;

/// Errors restoring the UART.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Saved receive buffer holds {0} bytes, more than the UART's FIFO
    FullFifo(usize),
}

/// Registers and pending input of the 8250.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialSaved {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl Serial {
    /// The UART's state.
    pub fn state(&self) -> SerialSaved {
        let s = self.inner.state();
        SerialSaved {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// Puts a saved state back, keeping this UART's interrupt line and output.
    pub fn restore(&mut self, s: &SerialSaved) -> Result<(), Error> {
        if s.in_buffer.len() > FIFO_SIZE {
            return Err(Error::FullFifo(s.in_buffer.len()));
        }
        let state = vm_superio::serial::SerialState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        };
        let irq = self.inner.interrupt_evt().0.clone();
        let placeholder = vm_superio::Serial::new(
            SuperioTrigger(irq.clone()),
            SerialOutput::new(None, false, Arc::default()),
        );
        let out = std::mem::replace(&mut self.inner, placeholder).into_writer();
        // The FIFO length was checked above, the only thing `from_state` refuses.
        self.inner = vm_superio::Serial::from_state(
            &state,
            SuperioTrigger(irq),
            vm_superio::serial::NoEvents,
            out,
        )
        .map_err(|_| Error::FullFifo(s.in_buffer.len()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::BusDevice;
    use crate::devices::CountingInterrupt;
    use crate::metrics::DeviceMetrics;

    fn serial() -> Serial {
        let out = SerialOutput::new(None, false, Arc::new(DeviceMetrics::default()));
        Serial::new(Arc::new(CountingInterrupt::default()), out)
    }

    #[test]
    fn registers_and_pending_input_survive_a_round_trip() {
        let mut a = serial();
        a.write(3, &[0x03]); // LCR: 8N1
        a.write(7, &[0x5a]); // scratch
        a.input(b"ab");
        let saved = a.state();
        let json = serde_json::to_string(&saved).unwrap();
        let mut b = serial();
        b.restore(&serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(b.state(), saved);
        let mut byte = [0u8];
        b.read(0, &mut byte);
        assert_eq!(byte[0], b'a');
    }

    #[test]
    fn an_overfull_fifo_is_refused() {
        let mut saved = serial().state();
        saved.in_buffer = vec![0; FIFO_SIZE + 1];
        assert!(matches!(serial().restore(&saved), Err(Error::FullFifo(65))));
    }
}
