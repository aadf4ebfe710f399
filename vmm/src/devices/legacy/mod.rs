//! Legacy PC devices the Linux boot path touches: the i8042 controller, whose only job
//! here is the CPU reset command that `reboot` uses, and Belljar's one-port power-off device
//! (the guest agent's way to end the VM, since x86 without ACPI has none), and the CMOS
//! real-time clock, whose absence costs every boot a long poll.

mod device;
mod rtc;

pub use device::{I8042, PowerOff};
pub use rtc::Rtc;
