//! x86-64 register state as the hypervisor traits see it.
//!
//! These are Belljar's own plain types, so that boot code can describe the starting CPU
//! state without naming `kvm_bindings` structures.

/// General-purpose registers, instruction pointer and flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuRegs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub rflags: u64,
}

/// A segment register's hidden (cached descriptor) state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Segment {
    pub base: u64,
    pub limit: u32,
    pub selector: u16,
    pub type_: u8,
    pub present: bool,
    pub dpl: u8,
    /// Default operation size (32-bit) flag.
    pub db: bool,
    /// Code/data (as opposed to system) segment.
    pub s: bool,
    /// 64-bit code segment.
    pub l: bool,
    /// Granularity: limit counted in 4 KiB pages.
    pub g: bool,
    pub avl: bool,
    pub unusable: bool,
}

impl Segment {
    /// Decodes a segment from a GDT entry, the way the CPU loads it.
    pub fn from_gdt_entry(entry: u64, selector: u16) -> Self {
        let base = ((entry >> 16) & 0xff_ffff) | (((entry >> 56) & 0xff) << 24);
        // 16 + 4 bits of limit: always within u32.
        let limit = crate::conv::lo32((entry & 0xffff) | (((entry >> 48) & 0xf) << 16));
        let g = (entry >> 55) & 1 == 1;
        Segment {
            base,
            limit: if g { (limit << 12) | 0xfff } else { limit },
            selector,
            type_: ((entry >> 40) & 0xf) as u8,
            present: (entry >> 47) & 1 == 1,
            dpl: ((entry >> 45) & 3) as u8,
            db: (entry >> 54) & 1 == 1,
            s: (entry >> 44) & 1 == 1,
            l: (entry >> 53) & 1 == 1,
            g,
            avl: (entry >> 52) & 1 == 1,
            unusable: (entry >> 47) & 1 == 0,
        }
    }
}

/// Base and limit of the GDT or IDT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DescriptorTable {
    pub base: u64,
    pub limit: u16,
}

/// Segment, control and descriptor-table registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialRegs {
    pub cs: Segment,
    pub ds: Segment,
    pub es: Segment,
    pub fs: Segment,
    pub gs: Segment,
    pub ss: Segment,
    pub tr: Segment,
    pub ldt: Segment,
    pub gdt: DescriptorTable,
    pub idt: DescriptorTable,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub cr8: u64,
    pub efer: u64,
    pub apic_base: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_flat_64bit_code_segment() {
        // base 0, limit 0xfffff, G=1, L=1, P=1, S=1, type 0xb
        let s = Segment::from_gdt_entry(0x00af_9b00_0000_ffff, 0x8);
        assert_eq!(s.base, 0);
        assert_eq!(s.limit, 0xffff_ffff);
        assert!(s.l && s.g && s.present && s.s && !s.db);
        assert_eq!(s.type_, 0xb);
        assert_eq!(s.selector, 8);
    }

    #[test]
    fn decodes_base_bits() {
        let s = Segment::from_gdt_entry(0x1200_8b34_5678_0067, 0x18);
        assert_eq!(s.base, 0x1234_5678);
        assert_eq!(s.limit, 0x67);
        assert!(!s.s);
        assert!(!s.unusable);
    }
}
