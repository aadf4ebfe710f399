//! Belljar's microVM monitor: boots a Linux guest on KVM with virtio-mmio devices.
//!
//! The library holds all the logic (hypervisor boundary, boot, devices, control socket);
//! `main.rs` only parses the configuration and calls `vmm::run`.

pub mod arch;
pub mod boot;
pub mod builder;
pub mod bus;
pub mod control;
pub mod conv;
pub mod devices;
pub mod exit;
pub mod hypervisor;
pub mod layout;
pub mod memory;
pub mod metrics;
pub mod seccomp;
pub mod snapshot;
pub mod vcpu;

/// The VM configuration lives in the daemon <-> VMM contract crate.
pub use belljar_vmm_api::config;
