//! The 8250 serial console (COM1): the guest kernel's log, written to a file and optionally
//! echoed to the VMM's stdout.

mod device;
mod persist;

pub use device::{Serial, SerialOutput};
pub use persist::{Error as PersistError, SerialSaved};
