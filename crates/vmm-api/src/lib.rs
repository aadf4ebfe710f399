//! The contract between `belljard` and `belljar-vmm`, in one place so that neither side
//! writes the other's format by hand.
//!
//! - [`config`]: the [`VmConfig`] file the daemon writes and the VMM reads (`--config`).
//! - [`control`]: the control socket's requests and responses (JSON lines), and
//!   [`client::ControlClient`], the small synchronous client the daemon and tests use.
//! - [`exit`]: what `belljar-vmm`'s exit status means.
//! - [`host`]: whether this host's KVM can run microVMs (shared with `belljar doctor`).
//! - [`metrics`]: the counters the `metrics` request returns.
//! - [`net`]: the virtio-net settings and the frame socket that carries the guest's
//!   Ethernet frames to the daemon.
//!
//! The crate has no KVM or hypervisor dependency: the daemon links it on every host.

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod control;
pub mod exit;
pub mod host;
pub mod metrics;
pub mod net;

pub use client::ControlClient;
pub use config::VmConfig;
pub use exit::ExitReason;

/// Most vCPUs one microVM may have.
pub const MAX_VCPUS: u8 = 32;

/// Most virtio-mmio devices one VM can have: one legacy interrupt line each, IOAPIC pins 5
/// to 23 but 8 (0-4 are the PIT, keyboard, cascade, COM2 and COM1; 8 is the CMOS clock's).
pub const MAX_VIRTIO_DEVICES: usize = 18;

/// The kernel command line for a Belljar guest, before the daemon adds the root disk and the
/// agent's settings and the VMM appends its `virtio_mmio.device=` entries.
///
/// `pci=off`: virtio-mmio only, no PCI probing. The `i8042.*` parameters stop Linux from
/// probing for an AUX port, a multiplexer and a keyboard that the VMM's i8042 (there for the
/// reset line; it answers the controller's own probe) does not have, which costs over a
/// second of boot.
pub const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.nokbd";
