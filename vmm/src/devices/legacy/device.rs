//! The i8042 keyboard controller, reduced to what Linux's probe and reset use, and the
//! power-off port.

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::exit::{ExitLatch, ExitReason};

/// Status register: the output buffer holds a byte for the guest.
const STATUS_OBF: u8 = 0x01;
/// Status register: the system flag, set once the controller passed its self-test.
const STATUS_SYS: u8 = 0x04;
/// Status register: the last byte written went to the command port.
const STATUS_CMD: u8 = 0x08;
/// Status register: the keyboard is not inhibited (no key lock; Linux warns "Keylock active"
/// at boot when this bit is clear).
const STATUS_UNLOCKED: u8 = 0x10;

/// The controller configuration byte at power-on: keyboard interrupt on, system flag,
/// mouse port disabled, scancode translation (what PC firmware leaves).
const CTR_AT_RESET: u8 = 0x65;
/// Configuration byte bits the enable/disable commands change.
const CTR_KBD_DISABLED: u8 = 0x10;
const CTR_AUX_DISABLED: u8 = 0x20;

/// Output-port bit 0: the CPU's reset line, active low.
const OUTPUT_PORT_NO_RESET: u8 = 0x01;

/// A data-port write the last command asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    None,
    /// 0x60: the next data byte is the configuration byte.
    WriteCtr,
    /// 0xd1: the next data byte is the output port.
    WriteOutputPort,
}

/// i8042 at ports 0x60..0x65, with no keyboard and no mouse behind it.
///
/// Linux's probe reads and writes the configuration byte and runs the self-test: a controller
/// that never answers makes each of those wait out its timeout, seconds of every nested boot.
/// This one answers them, and resets the VM on the pulse-reset command (`0xfe`, what
/// `reboot=k` sends) or an output-port write that drops the reset line. Bytes for the
/// keyboard are dropped (the command line's `i8042.nokbd` keeps Linux from sending any).
///
/// What it holds (the configuration byte, a pending byte) is not kept in a snapshot: Linux
/// touches the controller only at boot and at shutdown, where it writes the byte back whole.
pub struct I8042 {
    exit: Arc<ExitLatch>,
    ctr: u8,
    status: u8,
    output: u8,
    pending: Pending,
}

impl I8042 {
    /// Bus window size (data port 0x60 through command port 0x64).
    pub const LEN: u64 = 5;
    /// Offset of the command/status port in the window.
    const COMMAND: u64 = 4;

    pub fn new(exit: Arc<ExitLatch>) -> Self {
        I8042 {
            exit,
            ctr: CTR_AT_RESET,
            status: STATUS_SYS | STATUS_UNLOCKED,
            output: 0,
            pending: Pending::None,
        }
    }

    /// Puts a byte in the output buffer for the guest to read from the data port.
    fn answer(&mut self, byte: u8) {
        self.output = byte;
        self.status |= STATUS_OBF;
    }

    fn reset(&self, why: &str) {
        tracing::info!("guest reset through the i8042 controller ({why})");
        self.exit.set(ExitReason::Reset);
    }

    fn command(&mut self, command: u8) {
        self.status |= STATUS_CMD;
        self.pending = Pending::None;
        match command {
            0x20 => self.answer(self.ctr),
            0x60 => self.pending = Pending::WriteCtr,
            0xa7 => self.ctr |= CTR_AUX_DISABLED,
            0xa8 => self.ctr &= !CTR_AUX_DISABLED,
            // Port tests: 0x00 is "no error".
            0xa9 | 0xab => self.answer(0x00),
            0xaa => {
                self.status |= STATUS_SYS;
                self.answer(0x55);
            }
            0xad => self.ctr |= CTR_KBD_DISABLED,
            0xae => self.ctr &= !CTR_KBD_DISABLED,
            0xd0 => self.answer(OUTPUT_PORT_NO_RESET),
            0xd1 => self.pending = Pending::WriteOutputPort,
            0xfe => self.reset("pulse reset"),
            _ => {}
        }
    }

    fn data(&mut self, byte: u8) {
        self.status &= !STATUS_CMD;
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::WriteCtr => self.ctr = byte,
            Pending::WriteOutputPort if byte & OUTPUT_PORT_NO_RESET == 0 => {
                self.reset("output port")
            }
            Pending::WriteOutputPort | Pending::None => {}
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let [byte] = data else { return };
        *byte = match offset {
            0 => {
                self.status &= !STATUS_OBF;
                self.output
            }
            Self::COMMAND => self.status,
            _ => 0,
        };
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let &[byte] = data else { return };
        match offset {
            0 => self.data(byte),
            Self::COMMAND => self.command(byte),
            _ => {}
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

    fn read(dev: &mut I8042, offset: u64) -> u8 {
        let mut b = [0xee];
        dev.read(offset, &mut b);
        b[0]
    }

    /// Linux's probe: flush, self-test, read the configuration byte twice, write it back
    /// changed, read it again. Every answer is in the output buffer at once.
    #[test]
    fn answers_the_probe_linux_makes() {
        let exit = Arc::new(ExitLatch::new());
        let mut dev = I8042::new(exit.clone());
        assert_eq!(
            read(&mut dev, 4) & STATUS_OBF,
            0,
            "nothing to flush at power-on"
        );
        assert_eq!(
            read(&mut dev, 4) & STATUS_UNLOCKED,
            STATUS_UNLOCKED,
            "no key lock"
        );

        dev.write(4, &[0xaa]);
        assert_eq!(
            read(&mut dev, 4) & (STATUS_OBF | STATUS_SYS),
            STATUS_OBF | STATUS_SYS
        );
        assert_eq!(read(&mut dev, 0), 0x55);
        assert_eq!(
            read(&mut dev, 4) & STATUS_OBF,
            0,
            "reading the data port empties it"
        );

        for _ in 0..2 {
            dev.write(4, &[0x20]);
            assert_eq!(read(&mut dev, 4) & STATUS_OBF, STATUS_OBF);
            assert_eq!(read(&mut dev, 0), CTR_AT_RESET);
        }
        dev.write(4, &[0x60]);
        assert_eq!(read(&mut dev, 4) & STATUS_CMD, STATUS_CMD);
        dev.write(0, &[0x30]);
        assert_eq!(read(&mut dev, 4) & STATUS_CMD, 0);
        dev.write(4, &[0x20]);
        assert_eq!(read(&mut dev, 0), 0x30);

        dev.write(4, &[0xae]);
        dev.write(4, &[0xa8]);
        dev.write(4, &[0x20]);
        assert_eq!(
            read(&mut dev, 0),
            0x00,
            "enable commands clear the disable bits"
        );
        dev.write(4, &[0xab]);
        assert_eq!(read(&mut dev, 0), 0x00, "keyboard interface test passes");
        assert_eq!(exit.get(), None);
    }

    /// A data byte with no command before it is the keyboard's, and dropped.
    #[test]
    fn keyboard_bytes_change_nothing() {
        let exit = Arc::new(ExitLatch::new());
        let mut dev = I8042::new(exit.clone());
        dev.write(0, &[0xff]);
        dev.write(4, &[0x20]);
        assert_eq!(read(&mut dev, 0), CTR_AT_RESET);
        assert_eq!(exit.get(), None);
    }

    #[test]
    fn dropping_the_reset_line_resets() {
        let exit = Arc::new(ExitLatch::new());
        let mut dev = I8042::new(exit.clone());
        dev.write(4, &[0xd1]);
        dev.write(0, &[OUTPUT_PORT_NO_RESET | 0x02]);
        assert_eq!(exit.get(), None, "reset line kept high");
        dev.write(4, &[0xd1]);
        dev.write(0, &[0x02]);
        assert_eq!(exit.get(), Some(ExitReason::Reset));
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
