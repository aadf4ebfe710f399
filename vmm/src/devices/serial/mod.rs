//! The 8250 serial console (COM1): the guest kernel's log, written to a file and optionally
//! echoed to the VMM's stdout.

mod device;

pub use device::{Serial, SerialOutput};
