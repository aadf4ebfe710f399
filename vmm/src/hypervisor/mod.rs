//! The hypervisor boundary.
//!
//! Everything above this module (boot code, devices, the VMM loop) talks to the hypervisor
//! through the object-safe `Hypervisor`, `Vm` and `Vcpu` traits. No `kvm-ioctls` type,
//! `EventFd`, irqfd or ioeventfd appears in a signature here, so a Hypervisor.framework
//! backend (macOS) can sit behind the same traits: interrupts are raised with
//! `Vm::set_irq_line`, guest memory is handed over as a `GuestMemoryMmap`, and I/O exits are
//! delivered through the single `IoHandler` callback interface.

#[cfg(target_os = "linux")]
pub mod kvm;
pub mod x86_64;

use serde::{Deserialize, Serialize};

use crate::memory::GuestMemory;

pub use x86_64::{CpuRegs, DescriptorTable, Segment, SpecialRegs};

/// Errors from a hypervisor backend.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot open the hypervisor device
    Open(#[source] std::io::Error),
    /// The hypervisor lacks a capability Belljar needs: {0}
    MissingCapability(&'static str),
    /// Cannot create the VM
    CreateVm(#[source] std::io::Error),
    /// Cannot map guest memory
    MapMemory(#[source] std::io::Error),
    /// Cannot create the interrupt controller
    IrqController(#[source] std::io::Error),
    /// Cannot set interrupt line {0}
    IrqLine(u32, #[source] std::io::Error),
    /// Cannot create vCPU {0}
    CreateVcpu(u8, #[source] std::io::Error),
    /// Cannot configure vCPU {0}
    ConfigureVcpu(u8, #[source] std::io::Error),
    /// Cannot run vCPU {0}
    Run(u8, #[source] std::io::Error),
    /// Cannot save the {0}
    SaveState(&'static str, #[source] std::io::Error),
    /// Cannot restore the {0}
    RestoreState(&'static str, #[source] std::io::Error),
}

/// A vCPU's saved state. Only the backend that wrote it reads it; above the hypervisor
/// boundary it is opaque serde data.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VcpuSnapshot {
    #[cfg(target_os = "linux")]
    Kvm(Box<kvm::state::KvmVcpuState>),
}

/// A VM's saved hypervisor state (interrupt controllers, timers, clock), opaque like
/// `VcpuSnapshot`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmSnapshot {
    #[cfg(target_os = "linux")]
    Kvm(Box<kvm::state::KvmVmState>),
}

/// Whether a `/proc/cpuinfo` text advertises hardware virtualization (`vmx` or `svm`).
pub fn cpuinfo_has_hw_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// Whether this host's CPU advertises hardware virtualization; `None` if unknown.
///
/// A `/dev/kvm` without it is software-based (PVM and the like): guest user code runs
/// natively but guest kernel code is emulated, and ordinary Linux kernels may not boot.
pub fn host_has_hw_virt() -> Option<bool> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .map(|c| cpuinfo_has_hw_virt(&c))
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// A hypervisor that can create VMs (one per process in Belljar).
pub trait Hypervisor: Send + Sync {
    /// Short backend name, e.g. `kvm`.
    fn name(&self) -> &'static str;
    /// Creates an empty VM.
    fn create_vm(&self) -> Result<Box<dyn Vm>>;
    /// Kernel command-line options a Linux guest needs on this hypervisor (e.g. to keep it
    /// away from instructions a software hypervisor cannot emulate).
    fn guest_cmdline_extra(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A VM: guest physical address space plus interrupt controller.
pub trait Vm: Send + Sync {
    /// Maps every region of `memory` into the guest physical address space.
    fn map_memory(&self, memory: &GuestMemory) -> Result<()>;
    /// Creates the platform interrupt controllers (PIC + IOAPIC + PIT on x86).
    fn create_irq_controller(&self) -> Result<()>;
    /// Raises (`true`) or lowers (`false`) a platform interrupt line.
    fn set_irq_line(&self, irq: u32, active: bool) -> Result<()>;
    /// Creates vCPU number `id`; vCPU 0 is the boot processor.
    fn create_vcpu(&self, id: u8, vcpu_count: u8) -> Result<Box<dyn Vcpu>>;
    /// Saves the interrupt controllers, timers and clock (every vCPU paused).
    fn save_state(&self) -> Result<VmSnapshot>;
    /// Restores what `save_state` saved, before any vCPU runs.
    fn restore_state(&self, state: &VmSnapshot) -> Result<()>;
}

/// Why a vCPU came back to the VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuExit {
    /// An I/O access was dispatched to the `IoHandler`; keep running.
    Io,
    /// `hlt` with no in-kernel interrupt controller to wait on.
    Halt,
    /// The guest asked for a reset (e.g. triple fault, PSCI/ACPI reset).
    Reset,
    /// The guest asked to power off.
    Shutdown,
    /// The run was interrupted by a signal (used to pause or stop the vCPU).
    Interrupted,
    /// The hypervisor could not handle the guest (emulation failure, bad state, ...).
    Failed(String),
}

/// The one callback interface through which port I/O and MMIO exits reach the device bus.
pub trait IoHandler: Sync {
    /// Guest reads `data.len()` bytes from I/O port `port`.
    fn pio_read(&self, port: u16, data: &mut [u8]);
    /// Guest writes `data` to I/O port `port`.
    fn pio_write(&self, port: u16, data: &[u8]);
    /// Guest reads `data.len()` bytes at guest physical address `addr`.
    fn mmio_read(&self, addr: u64, data: &mut [u8]);
    /// Guest writes `data` at guest physical address `addr`.
    fn mmio_write(&self, addr: u64, data: &[u8]);
}

/// One virtual CPU. It is driven by a single thread.
pub trait Vcpu: Send {
    /// vCPU number.
    fn id(&self) -> u8;
    /// Sets the general-purpose registers.
    fn set_regs(&mut self, regs: &CpuRegs) -> Result<()>;
    /// Reads the general-purpose registers.
    fn regs(&self) -> Result<CpuRegs>;
    /// Sets segment, control and descriptor-table registers.
    fn set_special_regs(&mut self, sregs: &SpecialRegs) -> Result<()>;
    /// Reads segment, control and descriptor-table registers.
    fn special_regs(&self) -> Result<SpecialRegs>;
    /// Runs the vCPU until the next exit, dispatching I/O to `io`.
    fn run(&mut self, io: &dyn IoHandler) -> Result<VcpuExit>;
    /// Saves everything needed to resume this vCPU elsewhere (it must be paused, i.e. not
    /// inside `run`).
    fn save_state(&mut self) -> Result<VcpuSnapshot>;
    /// Restores what `save_state` saved into a vCPU that has not run yet.
    fn restore_state(&mut self, state: &VcpuSnapshot) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_vmx_and_svm_flags() {
        assert!(cpuinfo_has_hw_virt(
            "processor: 0\nflags\t\t: fpu vme vmx sse\n"
        ));
        assert!(cpuinfo_has_hw_virt("flags : fpu svm\n"));
        assert!(!cpuinfo_has_hw_virt("flags : fpu vmxx sse\nvmx\n"));
    }
}
