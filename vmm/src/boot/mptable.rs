//! Intel MultiProcessor table: how a Linux guest without ACPI learns the vCPUs, the IOAPIC
//! and the ISA interrupt routing (virtio-mmio interrupts go through IOAPIC pins 5..23).

use vm_memory::{Bytes, GuestAddress};

use crate::conv::lo32;
use crate::layout::{IRQ_MAX, MPTABLE_START};
use crate::memory::GuestMemory;

/// Errors writing the MP table.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Too many vCPUs for the MP table: {0}
    TooManyCpus(u8),
    /// Cannot write the MP table to guest memory
    Write(#[source] vm_memory::GuestMemoryError),
}

const APIC_DEFAULT_PHYS_BASE: u32 = 0xfee0_0000;
const IO_APIC_DEFAULT_PHYS_BASE: u32 = 0xfec0_0000;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
/// Most vCPUs Belljar boots (the IOAPIC id follows the APIC ids and must fit in 8 bits).
pub const MAX_CPUS: u8 = 254;

fn checksum(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

/// Builds the floating pointer and configuration table for `cpus` vCPUs, as placed at
/// `MPTABLE_START`.
pub fn build(cpus: u8) -> Result<Vec<u8>, Error> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(Error::TooManyCpus(cpus));
    }
    let ioapic_id = cpus;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for id in 0..cpus {
        let flags = 1 | if id == 0 { 2 } else { 0 }; // enabled, bootstrap processor
        entries.extend([0, id, APIC_VERSION, flags]);
        entries.extend(0x600u32.to_le_bytes()); // family 6
        entries.extend(0x201u32.to_le_bytes()); // FPU + APIC
        entries.extend([0u8; 8]);
        count += 1;
    }
    entries.extend([1, 0]);
    entries.extend(b"ISA   ");
    count += 1;
    entries.extend([2, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend(IO_APIC_DEFAULT_PHYS_BASE.to_le_bytes());
    count += 1;
    for irq in 0..=u8::try_from(IRQ_MAX).expect("IRQ_MAX is 23") {
        // INT, default polarity/trigger, ISA bus irq -> same IOAPIC pin
        entries.extend([3, 0, 0, 0, 0, irq, ioapic_id, irq]);
        count += 1;
    }
    // ExtINT on LINT0, NMI on LINT1 of every local APIC.
    entries.extend([4, 3, 0, 0, 0, 0, 0xff, 0]);
    entries.extend([4, 1, 0, 0, 0, 0, 0xff, 1]);
    count += 2;

    let table_len = 44 + entries.len();
    let mut table = Vec::with_capacity(table_len);
    table.extend(b"PCMP");
    // 20 bytes per vCPU (MAX_CPUS at most) and 8 per IRQ: about 5 KiB, within u16.
    let table_len = u16::try_from(table_len).expect("MP table under 64 KiB");
    table.extend(table_len.to_le_bytes());
    table.push(4); // spec 1.4
    table.push(0); // checksum, below
    table.extend(b"BELLJAR ");
    table.extend(b"MICROVM     ");
    table.extend(0u32.to_le_bytes());
    table.extend(0u16.to_le_bytes());
    table.extend(count.to_le_bytes());
    table.extend(APIC_DEFAULT_PHYS_BASE.to_le_bytes());
    table.extend([0u8; 4]);
    table.extend(&entries);
    table[7] = checksum(&table);

    let mut out = Vec::with_capacity(16 + table.len());
    out.extend(b"_MP_");
    out.extend((lo32(MPTABLE_START) + 16).to_le_bytes()); // below 1 MiB
    out.extend([1, 4, 0, 0, 0, 0, 0, 0]);
    out[10] = checksum(&out[..16]);
    out.extend(table);
    Ok(out)
}

/// Writes the MP table for `cpus` vCPUs into guest memory.
pub fn write(mem: &GuestMemory, cpus: u8) -> Result<(), Error> {
    let table = build(cpus)?;
    mem.write_slice(&table, GuestAddress(MPTABLE_START))
        .map_err(Error::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_are_valid() {
        let t = build(4).unwrap();
        assert_eq!(&t[..4], b"_MP_");
        assert_eq!(t[..16].iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
        let len = u16::from_le_bytes([t[20], t[21]]) as usize;
        assert_eq!(&t[16..20], b"PCMP");
        assert_eq!(
            t[16..16 + len].iter().fold(0u8, |a, b| a.wrapping_add(*b)),
            0
        );
        assert_eq!(16 + len, t.len());
    }

    #[test]
    fn counts_entries() {
        let t = build(2).unwrap();
        let count = u16::from_le_bytes([t[16 + 34], t[16 + 35]]);
        // 2 cpus + bus + ioapic + 24 irqs + 2 lints
        assert_eq!(count, 2 + 1 + 1 + 24 + 2);
        assert!(build(0).is_err());
        assert!(build(255).is_err());
    }

    #[test]
    fn fits_below_1mib() {
        let t = build(MAX_CPUS).unwrap();
        assert!(MPTABLE_START + t.len() as u64 <= 0x10_0000);
    }
}
