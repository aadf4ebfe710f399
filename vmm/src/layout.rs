//! The guest physical address map: where boot structures, RAM, devices and interrupts live.
//!
//! One place for these numbers, because the boot code, the e820 map, the kernel command line
//! and the device bus must all agree on them.

/// Start of the MMIO window below 4 GiB (RAM beyond it continues at 4 GiB).
pub const MMIO_GAP_START: u64 = 0xc000_0000;
/// End of the MMIO window.
pub const MMIO_GAP_END: u64 = 1 << 32;

/// First virtio-mmio device; each device gets `VIRTIO_MMIO_SIZE` bytes.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Size of one virtio-mmio device window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// First legacy interrupt line used by virtio devices (0-4 are PIT, keyboard, cascade, COM2, COM1).
pub const VIRTIO_IRQ_BASE: u32 = 5;
/// Last usable IOAPIC pin.
pub const IRQ_MAX: u32 = 23;
/// The CMOS clock's line. Linux's `rtc_cmos` claims it as soon as the clock answers, so a
/// virtio device on it loses the race half the time: its driver's probe fails with EBUSY
/// (a vsock device there left a guest's agent unreachable).
pub const RTC_IRQ: u32 = 8;
// The contract's device limit is what these interrupt lines allow: all from the first virtio
// line to the last pin but the clock's.
const _: () = assert!((IRQ_MAX - VIRTIO_IRQ_BASE) as usize == belljar_vmm_api::MAX_VIRTIO_DEVICES);

/// The interrupt line of the `index`th virtio device: the pins from [`VIRTIO_IRQ_BASE`] up,
/// [`RTC_IRQ`] left out. `None` past [`IRQ_MAX`].
pub fn virtio_irq(index: usize) -> Option<u32> {
    let line = VIRTIO_IRQ_BASE.checked_add(u32::try_from(index).ok()?)?;
    let line = if line >= RTC_IRQ { line + 1 } else { line };
    (line <= IRQ_MAX).then_some(line)
}

/// COM1.
pub const SERIAL_PORT: u16 = 0x3f8;
/// COM1 interrupt.
pub const SERIAL_IRQ: u32 = 4;
/// i8042 data port; the command port is `I8042_PORT + 4`.
pub const I8042_PORT: u16 = 0x60;
/// The CMOS real-time clock: index at 0x70, data at 0x71 (its interrupt: [`RTC_IRQ`]).
pub const RTC_PORT: u16 = 0x70;
/// Belljar's power-off port: a one-byte write ends the VM with `ExitReason::PowerOff`. x86
/// without ACPI has no power-off device, so the guest agent (PID 1, with `ioperm`) writes here
/// after syncing its disks. The same number is `belljar_agent_proto::POWER_OFF_PORT`.
pub const POWER_OFF_PORT: u16 = 0x501;

/// Boot GDT.
pub const BOOT_GDT_START: u64 = 0x500;
/// Boot IDT (empty).
pub const BOOT_IDT_START: u64 = 0x520;
/// PVH `hvm_start_info`.
pub const PVH_INFO_START: u64 = 0x6000;
/// PVH memory map entries.
pub const PVH_MEMMAP_START: u64 = 0x7000;
/// Linux zero page (`boot_params`).
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity-mapping page tables: PML4, PDPT, then four PDs (0xb000..0xf000).
pub const PML4_START: u64 = 0x9000;
pub const PDPTE_START: u64 = 0xa000;
pub const PDE_START: u64 = 0xb000;
/// MP table, in the BIOS area where Linux scans for it.
pub const MPTABLE_START: u64 = 0x9fc00;
/// Start of the EBDA / legacy hole (RAM below it is usable).
pub const EBDA_START: u64 = 0x9fc00;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Maximum kernel command line length including the NUL.
pub const CMDLINE_MAX_SIZE: usize = 4096;
/// Where the kernel is loaded (1 MiB).
pub const HIMEM_START: u64 = 0x10_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtio_lines_leave_out_the_legacy_ones() {
        let lines: Vec<u32> = (0..belljar_vmm_api::MAX_VIRTIO_DEVICES)
            .map(|i| virtio_irq(i).expect("a line for every allowed device"))
            .collect();
        assert_eq!(lines[..4], [5, 6, 7, 9]);
        assert_eq!(lines.last(), Some(&IRQ_MAX));
        assert!(!lines.contains(&RTC_IRQ) && !lines.contains(&SERIAL_IRQ));
        assert_eq!(virtio_irq(belljar_vmm_api::MAX_VIRTIO_DEVICES), None);
    }
}
