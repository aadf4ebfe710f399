//! KVM backend of the hypervisor traits (Linux, x86-64).
//!
//! This is the only place in Belljar that names `kvm-ioctls` and `kvm-bindings` types.

pub mod state;

use std::sync::Arc;

use kvm_bindings::{
    CpuId, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY, KVM_SYSTEM_EVENT_RESET,
    KVM_SYSTEM_EVENT_SHUTDOWN, kvm_dtable, kvm_fpu, kvm_pit_config, kvm_regs, kvm_segment,
    kvm_sregs, kvm_userspace_memory_region,
};
use kvm_ioctls::{Cap, Kvm, VcpuExit as KvmExit, VcpuFd, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::{
    CpuRegs, DescriptorTable, Error, Hypervisor, IoHandler, Result, Segment, SpecialRegs, Vcpu,
    VcpuExit, VcpuSnapshot, Vm, VmSnapshot,
};
use crate::memory::GuestMemory;

/// Where KVM puts the three-page TSS needed by VMX real-mode emulation; just below 4 GiB and
/// outside both guest RAM and the MMIO window.
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;

fn io_err(e: kvm_ioctls::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.errno())
}

/// CPUID.1:ECX features hidden from guests on software KVM: CX16 (bit 13). PVM's
/// instruction emulator cannot run `lock cmpxchg16b`, which the Linux SLUB allocator uses
/// when the CPU advertises it. (PVM keeps XSAVE visible whatever the CPUID says, so `xrstor`
/// is avoided with the `noxsave` kernel option instead; see `guest_cmdline_extra`.)
const EMULATION_UNSAFE_ECX: u32 = 1 << 13;

/// The KVM hypervisor (`/dev/kvm`).
pub struct KvmHypervisor {
    kvm: Arc<Kvm>,
    emulation_safe_cpuid: bool,
}

impl KvmHypervisor {
    /// Opens `/dev/kvm` and checks the capabilities Belljar relies on.
    pub fn new() -> Result<Self> {
        let kvm = Kvm::new().map_err(|e| Error::Open(io_err(e)))?;
        for (cap, name) in [
            (Cap::Irqchip, "irqchip"),
            (Cap::UserMemory, "user memory"),
            (Cap::SetTssAddr, "TSS address"),
            (Cap::Pit2, "PIT2"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(Error::MissingCapability(name));
            }
        }
        Ok(KvmHypervisor {
            kvm: Arc::new(kvm),
            emulation_safe_cpuid: super::host_has_hw_virt() == Some(false),
        })
    }

    /// Whether guests get a CPUID without features software KVM cannot emulate (on by
    /// default when the host CPU has no vmx/svm flag).
    pub fn emulation_safe_cpuid(&self) -> bool {
        self.emulation_safe_cpuid
    }

    /// Forces the emulation-safe CPUID on or off.
    pub fn set_emulation_safe_cpuid(&mut self, on: bool) {
        self.emulation_safe_cpuid = on;
    }
}

impl Hypervisor for KvmHypervisor {
    fn name(&self) -> &'static str {
        "kvm"
    }

    fn guest_cmdline_extra(&self) -> Vec<String> {
        if self.emulation_safe_cpuid {
            vec!["noxsave".to_string()]
        } else {
            Vec::new()
        }
    }

    fn create_vm(&self) -> Result<Box<dyn Vm>> {
        let fd = self
            .kvm
            .create_vm()
            .map_err(|e| Error::CreateVm(io_err(e)))?;
        fd.set_tss_address(KVM_TSS_ADDRESS)
            .map_err(|e| Error::CreateVm(io_err(e)))?;
        let cpuid = self
            .kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| Error::CreateVm(io_err(e)))?;
        // The MSRs a snapshot saves: every one KVM lists as saveable.
        let msr_index = self
            .kvm
            .get_msr_index_list()
            .map_err(|e| Error::CreateVm(io_err(e)))?
            .as_slice()
            .to_vec();
        Ok(Box::new(KvmVm {
            fd,
            cpuid,
            emulation_safe_cpuid: self.emulation_safe_cpuid,
            msr_index: Arc::new(msr_index),
            has_irqchip: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

/// A KVM VM.
pub struct KvmVm {
    fd: VmFd,
    cpuid: CpuId,
    emulation_safe_cpuid: bool,
    msr_index: Arc<Vec<u32>>,
    has_irqchip: std::sync::atomic::AtomicBool,
}

impl Vm for KvmVm {
    fn map_memory(&self, memory: &GuestMemory) -> Result<()> {
        for (slot, region) in memory.iter().enumerate() {
            let mem_region = kvm_userspace_memory_region {
                // Two RAM regions at most (below and above the MMIO gap).
                slot: u32::try_from(slot).expect("two regions"),
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
                flags: 0,
            };
            // SAFETY: the host range belongs to `memory`'s mmap, which the VMM keeps alive
            // (it is never unmapped) for as long as the VM exists.
            unsafe { self.fd.set_user_memory_region(mem_region) }
                .map_err(|e| Error::MapMemory(io_err(e)))?;
        }
        Ok(())
    }

    fn create_irq_controller(&self) -> Result<()> {
        self.fd
            .create_irq_chip()
            .map_err(|e| Error::IrqController(io_err(e)))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.fd
            .create_pit2(pit)
            .map_err(|e| Error::IrqController(io_err(e)))?;
        self.has_irqchip
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn save_state(&self) -> Result<VmSnapshot> {
        let irqchip = self.has_irqchip.load(std::sync::atomic::Ordering::SeqCst);
        Ok(VmSnapshot::Kvm(Box::new(state::save_vm(
            &self.fd, irqchip,
        )?)))
    }

    fn restore_state(&self, saved: &VmSnapshot) -> Result<()> {
        let VmSnapshot::Kvm(s) = saved;
        state::restore_vm(&self.fd, s)
    }

    fn set_irq_line(&self, irq: u32, active: bool) -> Result<()> {
        self.fd
            .set_irq_line(irq, active)
            .map_err(|e| Error::IrqLine(irq, io_err(e)))
    }

    fn create_vcpu(&self, id: u8, vcpu_count: u8) -> Result<Box<dyn Vcpu>> {
        let fd = self
            .fd
            .create_vcpu(u64::from(id))
            .map_err(|e| Error::CreateVcpu(id, io_err(e)))?;
        let mut cpuid = self.cpuid.clone();
        patch_cpuid(&mut cpuid, id, vcpu_count, self.emulation_safe_cpuid);
        fd.set_cpuid2(&cpuid)
            .map_err(|e| Error::ConfigureVcpu(id, io_err(e)))?;
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        fd.set_fpu(&fpu)
            .map_err(|e| Error::ConfigureVcpu(id, io_err(e)))?;
        Ok(Box::new(KvmVcpu {
            id,
            fd,
            msr_index: self.msr_index.clone(),
        }))
    }
}

/// Makes the CPUID the guest sees describe this vCPU: its APIC id, the vCPU count and the
/// "running on a hypervisor" bit; optionally hides features software KVM cannot emulate.
fn patch_cpuid(cpuid: &mut CpuId, id: u8, vcpu_count: u8, emulation_safe: bool) {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                entry.ebx = (entry.ebx & 0x0000_ffff)
                    | (u32::from(id) << 24)
                    | (u32::from(vcpu_count) << 16);
                // CPUID.1:ECX bit 31: hypervisor present.
                entry.ecx |= 1 << 31;
                if emulation_safe {
                    entry.ecx &= !EMULATION_UNSAFE_ECX;
                }
                // HTT: more than one logical processor per package.
                if vcpu_count > 1 {
                    entry.edx |= 1 << 28;
                }
            }
            0xb | 0x1f => {
                entry.edx = u32::from(id);
            }
            _ => {}
        }
    }
}

/// A KVM vCPU.
pub struct KvmVcpu {
    id: u8,
    fd: VcpuFd,
    msr_index: Arc<Vec<u32>>,
}

fn to_kvm_segment(s: &Segment) -> kvm_segment {
    kvm_segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: u8::from(s.present),
        dpl: s.dpl,
        db: u8::from(s.db),
        s: u8::from(s.s),
        l: u8::from(s.l),
        g: u8::from(s.g),
        avl: u8::from(s.avl),
        unusable: u8::from(s.unusable),
        padding: 0,
    }
}

fn from_kvm_segment(s: &kvm_segment) -> Segment {
    Segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: s.present != 0,
        dpl: s.dpl,
        db: s.db != 0,
        s: s.s != 0,
        l: s.l != 0,
        g: s.g != 0,
        avl: s.avl != 0,
        unusable: s.unusable != 0,
    }
}

impl Vcpu for KvmVcpu {
    fn id(&self) -> u8 {
        self.id
    }

    fn set_regs(&mut self, r: &CpuRegs) -> Result<()> {
        let regs = kvm_regs {
            rax: r.rax,
            rbx: r.rbx,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
            rsp: r.rsp,
            rbp: r.rbp,
            r8: r.r8,
            r9: r.r9,
            r10: r.r10,
            r11: r.r11,
            r12: r.r12,
            r13: r.r13,
            r14: r.r14,
            r15: r.r15,
            rip: r.rip,
            rflags: r.rflags,
        };
        self.fd
            .set_regs(&regs)
            .map_err(|e| Error::ConfigureVcpu(self.id, io_err(e)))
    }

    fn regs(&self) -> Result<CpuRegs> {
        let r = self
            .fd
            .get_regs()
            .map_err(|e| Error::ConfigureVcpu(self.id, io_err(e)))?;
        Ok(CpuRegs {
            rax: r.rax,
            rbx: r.rbx,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
            rsp: r.rsp,
            rbp: r.rbp,
            r8: r.r8,
            r9: r.r9,
            r10: r.r10,
            r11: r.r11,
            r12: r.r12,
            r13: r.r13,
            r14: r.r14,
            r15: r.r15,
            rip: r.rip,
            rflags: r.rflags,
        })
    }

    fn set_special_regs(&mut self, s: &SpecialRegs) -> Result<()> {
        // Start from KVM's current state so fields we do not model (interrupt bitmap) stay
        // consistent.
        let mut sregs: kvm_sregs = self
            .fd
            .get_sregs()
            .map_err(|e| Error::ConfigureVcpu(self.id, io_err(e)))?;
        sregs.cs = to_kvm_segment(&s.cs);
        sregs.ds = to_kvm_segment(&s.ds);
        sregs.es = to_kvm_segment(&s.es);
        sregs.fs = to_kvm_segment(&s.fs);
        sregs.gs = to_kvm_segment(&s.gs);
        sregs.ss = to_kvm_segment(&s.ss);
        sregs.tr = to_kvm_segment(&s.tr);
        sregs.ldt = to_kvm_segment(&s.ldt);
        sregs.gdt = kvm_dtable {
            base: s.gdt.base,
            limit: s.gdt.limit,
            padding: [0; 3],
        };
        sregs.idt = kvm_dtable {
            base: s.idt.base,
            limit: s.idt.limit,
            padding: [0; 3],
        };
        sregs.cr0 = s.cr0;
        sregs.cr2 = s.cr2;
        sregs.cr3 = s.cr3;
        sregs.cr4 = s.cr4;
        sregs.cr8 = s.cr8;
        sregs.efer = s.efer;
        if s.apic_base != 0 {
            sregs.apic_base = s.apic_base;
        }
        self.fd
            .set_sregs(&sregs)
            .map_err(|e| Error::ConfigureVcpu(self.id, io_err(e)))
    }

    fn special_regs(&self) -> Result<SpecialRegs> {
        let s = self
            .fd
            .get_sregs()
            .map_err(|e| Error::ConfigureVcpu(self.id, io_err(e)))?;
        Ok(SpecialRegs {
            cs: from_kvm_segment(&s.cs),
            ds: from_kvm_segment(&s.ds),
            es: from_kvm_segment(&s.es),
            fs: from_kvm_segment(&s.fs),
            gs: from_kvm_segment(&s.gs),
            ss: from_kvm_segment(&s.ss),
            tr: from_kvm_segment(&s.tr),
            ldt: from_kvm_segment(&s.ldt),
            gdt: DescriptorTable {
                base: s.gdt.base,
                limit: s.gdt.limit,
            },
            idt: DescriptorTable {
                base: s.idt.base,
                limit: s.idt.limit,
            },
            cr0: s.cr0,
            cr2: s.cr2,
            cr3: s.cr3,
            cr4: s.cr4,
            cr8: s.cr8,
            efer: s.efer,
            apic_base: s.apic_base,
        })
    }

    fn save_state(&mut self) -> Result<VcpuSnapshot> {
        let msr_index = self.msr_index.clone();
        Ok(VcpuSnapshot::Kvm(Box::new(state::save_vcpu(
            &mut self.fd,
            &msr_index,
        )?)))
    }

    fn restore_state(&mut self, saved: &VcpuSnapshot) -> Result<()> {
        let VcpuSnapshot::Kvm(s) = saved;
        state::restore_vcpu(&self.fd, s)
    }

    fn run(&mut self, io: &dyn IoHandler) -> Result<VcpuExit> {
        let id = self.id;
        match self.fd.run() {
            Ok(exit) => Ok(match exit {
                KvmExit::IoIn(port, data) => {
                    io.pio_read(port, data);
                    VcpuExit::Io
                }
                KvmExit::IoOut(port, data) => {
                    io.pio_write(port, data);
                    VcpuExit::Io
                }
                KvmExit::MmioRead(addr, data) => {
                    io.mmio_read(addr, data);
                    VcpuExit::Io
                }
                KvmExit::MmioWrite(addr, data) => {
                    io.mmio_write(addr, data);
                    VcpuExit::Io
                }
                KvmExit::Hlt => VcpuExit::Halt,
                KvmExit::Shutdown => {
                    // A triple fault: unlike a reset the guest asked for, nothing in its
                    // console says why (on AMD the VMCB, and so the registers, are reset too).
                    tracing::warn!(vcpu = self.id, "guest triple fault (KVM_EXIT_SHUTDOWN)");
                    VcpuExit::Reset
                }
                KvmExit::SystemEvent(kind, _) if kind == KVM_SYSTEM_EVENT_RESET => VcpuExit::Reset,
                KvmExit::SystemEvent(kind, _) if kind == KVM_SYSTEM_EVENT_SHUTDOWN => {
                    VcpuExit::Shutdown
                }
                KvmExit::Intr => VcpuExit::Interrupted,
                KvmExit::FailEntry(reason, cpu) => {
                    VcpuExit::Failed(format!("entry failed: reason {reason:#x} on cpu {cpu}"))
                }
                KvmExit::InternalError => {
                    let rip = self.fd.get_regs().map(|r| r.rip).unwrap_or(0);
                    VcpuExit::Failed(format!("KVM internal error (emulation) at rip {rip:#x}"))
                }
                other => VcpuExit::Failed(format!("unhandled exit {other:?}")),
            }),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                Ok(VcpuExit::Interrupted)
            }
            Err(e) => Err(Error::Run(id, io_err(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    fn cpuid_with_leaf1() -> CpuId {
        let entry = kvm_cpuid_entry2 {
            function: 1,
            ecx: u32::MAX,
            ebx: 0xffff_ffff,
            ..Default::default()
        };
        CpuId::from_entries(&[entry]).unwrap()
    }

    #[test]
    fn leaf1_carries_apic_id_and_hypervisor_bit() {
        let mut c = cpuid_with_leaf1();
        patch_cpuid(&mut c, 3, 4, false);
        let e = c.as_slice()[0];
        assert_eq!(e.ebx >> 24, 3);
        assert_eq!((e.ebx >> 16) & 0xff, 4);
        assert_ne!(e.ecx & (1 << 31), 0);
        assert_ne!(e.ecx & EMULATION_UNSAFE_ECX, 0);
    }

    #[test]
    fn emulation_safe_cpuid_hides_cx16_and_xsave() {
        let mut c = cpuid_with_leaf1();
        patch_cpuid(&mut c, 0, 1, true);
        assert_eq!(c.as_slice()[0].ecx & EMULATION_UNSAFE_ECX, 0);
    }
}
