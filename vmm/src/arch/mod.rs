//! x86-64 CPU start-up state: GDT, identity page tables and the registers each boot
//! protocol expects. Written into guest memory and applied through the `Vcpu` trait.

use vm_memory::{Bytes, GuestAddress};

use crate::hypervisor::{CpuRegs, DescriptorTable, Segment, SpecialRegs, Vcpu};
use crate::layout::{BOOT_GDT_START, BOOT_IDT_START, PDE_START, PDPTE_START, PML4_START};
use crate::memory::GuestMemory;

/// Errors setting up the boot CPU.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot write boot structures to guest memory
    Memory(#[source] vm_memory::GuestMemoryError),
    /// Cannot set vCPU registers
    Vcpu(#[source] crate::hypervisor::Error),
}

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// Builds a GDT entry from flags (G/DB/L/AVL and P/DPL/S/type), base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The boot GDT: null, 64-bit code (0x8), data (0x10), TSS (0x18), 32-bit code (0x20).
pub const BOOT_GDT: [u64; 5] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
    gdt_entry(0xc09b, 0, 0xfffff),
];
const CODE64_SEL: u16 = 0x8;
const DATA_SEL: u16 = 0x10;
const TSS_SEL: u16 = 0x18;
const CODE32_SEL: u16 = 0x20;

fn write_gdt_idt(mem: &GuestMemory) -> Result<(), Error> {
    for (i, entry) in BOOT_GDT.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(BOOT_GDT_START + i as u64 * 8))
            .map_err(Error::Memory)?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(Error::Memory)?;
    Ok(())
}

/// Identity-maps the first 4 GiB with 2 MiB pages: all of low RAM plus the MMIO window, so
/// early code (and the tiny test guests) can reach devices before setting up its own tables.
pub fn write_page_tables(mem: &GuestMemory) -> Result<(), Error> {
    mem.write_obj(PDPTE_START | 0x03, GuestAddress(PML4_START))
        .map_err(Error::Memory)?;
    for gib in 0..4u64 {
        let pd = PDE_START + gib * 0x1000;
        mem.write_obj(pd | 0x03, GuestAddress(PDPTE_START + gib * 8))
            .map_err(Error::Memory)?;
        for i in 0..512u64 {
            let addr = (gib << 30) | (i << 21);
            mem.write_obj(addr | 0x83, GuestAddress(pd + i * 8))
                .map_err(Error::Memory)?;
        }
    }
    Ok(())
}

fn base_sregs(code_sel: u16) -> SpecialRegs {
    let code = Segment::from_gdt_entry(BOOT_GDT[(code_sel / 8) as usize], code_sel);
    let data = Segment::from_gdt_entry(BOOT_GDT[(DATA_SEL / 8) as usize], DATA_SEL);
    let tss = Segment::from_gdt_entry(BOOT_GDT[(TSS_SEL / 8) as usize], TSS_SEL);
    SpecialRegs {
        cs: code,
        ds: data,
        es: data,
        fs: data,
        gs: data,
        ss: data,
        tr: tss,
        ldt: Segment {
            unusable: true,
            ..Default::default()
        },
        gdt: DescriptorTable {
            base: BOOT_GDT_START,
            // A handful of 8-byte entries: far below the 64 KiB a GDT limit can express.
            limit: u16::try_from(std::mem::size_of_val(&BOOT_GDT) - 1).expect("small GDT"),
        },
        idt: DescriptorTable {
            base: BOOT_IDT_START,
            limit: 7,
        },
        ..Default::default()
    }
}

/// Puts `vcpu` in 64-bit long mode with paging on (identity map), at `entry`, with `rsi`
/// pointing at the boot parameters — the Linux 64-bit boot protocol.
pub fn setup_long_mode(
    mem: &GuestMemory,
    vcpu: &mut dyn Vcpu,
    entry: u64,
    stack: u64,
    rsi: u64,
) -> Result<(), Error> {
    write_gdt_idt(mem)?;
    write_page_tables(mem)?;
    let mut sregs = base_sregs(CODE64_SEL);
    sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
    sregs.cr3 = PML4_START;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_special_regs(&sregs).map_err(Error::Vcpu)?;
    vcpu.set_regs(&CpuRegs {
        rip: entry,
        rsp: stack,
        rbp: stack,
        rsi,
        rflags: 0x2,
        ..Default::default()
    })
    .map_err(Error::Vcpu)
}

/// Puts `vcpu` in 32-bit protected mode without paging at `entry`, with `rbx` pointing at
/// the `hvm_start_info` — the PVH boot protocol.
pub fn setup_pvh(
    mem: &GuestMemory,
    vcpu: &mut dyn Vcpu,
    entry: u64,
    start_info: u64,
) -> Result<(), Error> {
    write_gdt_idt(mem)?;
    let mut sregs = base_sregs(CODE32_SEL);
    sregs.cr0 = CR0_PE | CR0_ET;
    vcpu.set_special_regs(&sregs).map_err(Error::Vcpu)?;
    vcpu.set_regs(&CpuRegs {
        rip: entry,
        rbx: start_info,
        rflags: 0x2,
        ..Default::default()
    })
    .map_err(Error::Vcpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_match_the_architecture() {
        assert_eq!(BOOT_GDT[1], 0x00af_9b00_0000_ffff);
        assert_eq!(BOOT_GDT[2], 0x00cf_9300_0000_ffff);
        assert_eq!(BOOT_GDT[3], 0x008f_8b00_0000_ffff);
        assert_eq!(BOOT_GDT[4], 0x00cf_9b00_0000_ffff);
    }

    #[test]
    fn page_tables_identity_map_first_gib() {
        let mem = crate::memory::create(4 << 20).unwrap();
        write_page_tables(&mem).unwrap();
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_START)).unwrap();
        assert_eq!(pml4 & !0xfff, PDPTE_START);
        let pde: u64 = mem.read_obj(GuestAddress(PDE_START + 511 * 8)).unwrap();
        assert_eq!(pde, (511 << 21) | 0x83);
        // The MMIO window at 3.25 GiB is mapped too.
        let pde: u64 = mem
            .read_obj(GuestAddress(PDE_START + 3 * 0x1000 + 128 * 8))
            .unwrap();
        assert_eq!(pde, 0xd000_0000 | 0x83);
    }
}
