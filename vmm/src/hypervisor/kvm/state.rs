//! Saving and restoring KVM's share of a VM: every vCPU's registers and in-kernel state, the
//! in-kernel interrupt controllers and PIT, and the KVM clock.
//!
//! The structures are `kvm-bindings`' own (with their serde support), kept behind the opaque
//! `VcpuSnapshot`/`VmSnapshot` of the hypervisor traits so nothing above this module names
//! them. The orders of the get and set calls follow what KVM requires (see the comments);
//! Firecracker's `vstate` documents the same constraints.

use kvm_bindings::{
    CpuId, KVM_CLOCK_TSC_STABLE, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    KVM_MAX_CPUID_ENTRIES, KVM_MAX_MSR_ENTRIES, Msrs, kvm_clock_data, kvm_cpuid_entry2,
    kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_pit_state2,
    kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

use super::io_err;
use crate::hypervisor::{Error, Result};

/// IA32_TSC_DEADLINE: restored after IA32_TSC, or KVM arms the timer against the wrong TSC.
const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

/// One vCPU's state as KVM holds it.
#[derive(Serialize, Deserialize)]
pub struct KvmVcpuState {
    cpuid: Vec<kvm_cpuid_entry2>,
    mp_state: kvm_mp_state,
    regs: kvm_regs,
    sregs: kvm_sregs,
    xsave: kvm_xsave,
    xcrs: Option<kvm_xcrs>,
    debug_regs: kvm_debugregs,
    lapic: Option<kvm_lapic_state>,
    msrs: Vec<kvm_msr_entry>,
    events: kvm_vcpu_events,
    tsc_khz: Option<u32>,
}

impl std::fmt::Debug for KvmVcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvmVcpuState")
            .field("rip", &self.regs.rip)
            .field("msrs", &self.msrs.len())
            .finish_non_exhaustive()
    }
}

/// The VM-wide in-kernel state: interrupt controllers, PIT and clock.
#[derive(Serialize, Deserialize)]
pub struct KvmVmState {
    /// PIC master, PIC slave, IOAPIC; absent when the VM has no in-kernel irqchip.
    irqchips: Option<Vec<kvm_irqchip>>,
    pit: Option<kvm_pit_state2>,
    clock: kvm_clock_data,
}

impl std::fmt::Debug for KvmVmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvmVmState")
            .field("irqchip", &self.irqchips.is_some())
            .field("clock", &self.clock.clock)
            .finish_non_exhaustive()
    }
}

fn save_err(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> Error {
    move |e| Error::SaveState(what, io_err(e))
}

fn restore_err(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> Error {
    move |e| Error::RestoreState(what, io_err(e))
}

fn other(what: &'static str, e: impl std::fmt::Debug) -> Error {
    Error::RestoreState(what, std::io::Error::other(format!("{e:?}")))
}

/// Lets KVM finish an I/O instruction whose exit the VMM already answered (a port read's
/// value only reaches the guest's register on the next entry) without running any further
/// guest code: with `immediate_exit` set, KVM_RUN completes it and returns EINTR.
fn complete_pending_io(fd: &mut VcpuFd) {
    fd.set_kvm_immediate_exit(1);
    let _ = fd.run();
    fd.set_kvm_immediate_exit(0);
}

/// Reads every MSR KVM lists as saveable. KVM stops a batch at the first MSR this vCPU
/// cannot read; that one is left out and the batch resumes after it.
fn save_msrs(fd: &VcpuFd, index: &[u32]) -> Result<Vec<kvm_msr_entry>> {
    let mut saved = Vec::with_capacity(index.len());
    let mut rest: Vec<u32> = index.to_vec();
    while !rest.is_empty() {
        let take = rest.len().min(KVM_MAX_MSR_ENTRIES);
        let entries: Vec<kvm_msr_entry> = rest[..take]
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|e| other("MSRs", e))?;
        let read = fd.get_msrs(&mut msrs).map_err(save_err("MSRs"))?;
        saved.extend_from_slice(&msrs.as_slice()[..read]);
        rest.drain(..(read + 1).min(take));
    }
    // The deadline goes last so it is set against the restored TSC.
    saved.sort_by_key(|e| e.index == MSR_IA32_TSC_DEADLINE);
    Ok(saved)
}

/// Captures a paused vCPU.
pub fn save_vcpu(fd: &mut VcpuFd, msr_index: &[u32]) -> Result<KvmVcpuState> {
    complete_pending_io(fd);
    // KVM_GET_MP_STATE first: it accepts pending APIC events, which may change the state
    // read below.
    let mp_state = fd.get_mp_state().map_err(save_err("MP state"))?;
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(save_err("CPUID"))?
        .as_slice()
        .to_vec();
    let regs = fd.get_regs().map_err(save_err("registers"))?;
    let sregs = fd.get_sregs().map_err(save_err("special registers"))?;
    let xsave = fd.get_xsave().map_err(save_err("XSAVE"))?;
    // A host without XSAVE has no XCRs; a VM without an in-kernel irqchip has no LAPIC.
    let xcrs = fd.get_xcrs().ok();
    let debug_regs = fd.get_debug_regs().map_err(save_err("debug registers"))?;
    let lapic = fd.get_lapic().ok();
    let msrs = save_msrs(fd, msr_index)?;
    let tsc_khz = fd.get_tsc_khz().ok();
    // Events last: the exceptions and interrupts pending at this instant.
    let events = fd.get_vcpu_events().map_err(save_err("vCPU events"))?;
    Ok(KvmVcpuState {
        cpuid,
        mp_state,
        regs,
        sregs,
        xsave,
        xcrs,
        debug_regs,
        lapic,
        msrs,
        events,
        tsc_khz,
    })
}

/// Puts a saved state into a freshly created vCPU that has never run.
pub fn restore_vcpu(fd: &VcpuFd, s: &KvmVcpuState) -> Result<()> {
    let cpuid = CpuId::from_entries(&s.cpuid).map_err(|e| other("CPUID", e))?;
    fd.set_cpuid2(&cpuid).map_err(restore_err("CPUID"))?;
    if let Some(khz) = s.tsc_khz
        && fd.get_tsc_khz().ok() != Some(khz)
        && let Err(e) = fd.set_tsc_khz(khz)
    {
        // A host that cannot scale the TSC still restores; the guest's clock then runs at
        // this host's rate.
        tracing::warn!(error = %e, khz, "cannot set the saved TSC frequency");
    }
    // System registers before MSRs: EFER and the APIC base decide which MSRs are valid.
    fd.set_sregs(&s.sregs)
        .map_err(restore_err("special registers"))?;
    for chunk in s.msrs.chunks(KVM_MAX_MSR_ENTRIES) {
        let msrs = Msrs::from_entries(chunk).map_err(|e| other("MSRs", e))?;
        let written = fd.set_msrs(&msrs).map_err(restore_err("MSRs"))?;
        if let Some(refused) = chunk.get(written) {
            return Err(other(
                "MSRs",
                format!("KVM refused MSR {:#x}", refused.index),
            ));
        }
    }
    // SAFETY: `s.xsave` is a whole `kvm_xsave` (the 4 KiB legacy region) as `save_vcpu` read
    // it from KVM; KVM_SET_XSAVE reads exactly that struct.
    unsafe { fd.set_xsave(&s.xsave) }.map_err(restore_err("XSAVE"))?;
    if let Some(xcrs) = &s.xcrs {
        fd.set_xcrs(xcrs).map_err(restore_err("XCRs"))?;
    }
    fd.set_debug_regs(&s.debug_regs)
        .map_err(restore_err("debug registers"))?;
    if let Some(lapic) = &s.lapic {
        fd.set_lapic(lapic).map_err(restore_err("LAPIC"))?;
    }
    fd.set_mp_state(s.mp_state)
        .map_err(restore_err("MP state"))?;
    fd.set_regs(&s.regs).map_err(restore_err("registers"))?;
    fd.set_vcpu_events(&s.events)
        .map_err(restore_err("vCPU events"))?;
    Ok(())
}

fn irqchip(fd: &VmFd, chip_id: u32) -> Result<kvm_irqchip> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    fd.get_irqchip(&mut chip).map_err(save_err("irqchip"))?;
    Ok(chip)
}

/// Captures the VM-wide state (every vCPU paused).
pub fn save_vm(fd: &VmFd, has_irqchip: bool) -> Result<KvmVmState> {
    let (irqchips, pit) = if has_irqchip {
        (
            Some(vec![
                irqchip(fd, KVM_IRQCHIP_PIC_MASTER)?,
                irqchip(fd, KVM_IRQCHIP_PIC_SLAVE)?,
                irqchip(fd, KVM_IRQCHIP_IOAPIC)?,
            ]),
            Some(fd.get_pit2().map_err(save_err("PIT"))?),
        )
    } else {
        (None, None)
    };
    let clock = fd.get_clock().map_err(save_err("clock"))?;
    Ok(KvmVmState {
        irqchips,
        pit,
        clock,
    })
}

/// Puts saved VM-wide state into a VM whose irqchip exists and whose vCPUs have not run.
pub fn restore_vm(fd: &VmFd, s: &KvmVmState) -> Result<()> {
    if let Some(pit) = &s.pit {
        fd.set_pit2(pit).map_err(restore_err("PIT"))?;
    }
    let mut clock = s.clock;
    // KVM only reports this flag; it refuses it on set.
    clock.flags &= !KVM_CLOCK_TSC_STABLE;
    fd.set_clock(&clock).map_err(restore_err("clock"))?;
    for chip in s.irqchips.iter().flatten() {
        fd.set_irqchip(chip).map_err(restore_err("irqchip"))?;
    }
    Ok(())
}
