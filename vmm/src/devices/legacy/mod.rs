//! Legacy PC devices the Linux boot path touches: the i8042 controller, whose only job
//! here is the CPU reset command that `reboot` uses.

mod device;

pub use device::I8042;
