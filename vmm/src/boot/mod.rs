//! Direct Linux boot, no firmware: load the kernel (vmlinux ELF or bzImage) with
//! linux-loader, write the command line, the e820 map / PVH start info and the MP table,
//! then put the boot vCPU in the state its boot protocol expects.

pub mod mptable;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::boot_params;
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{KernelLoader, load_cmdline};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::conv::lo32;
use crate::hypervisor::Vcpu;
use crate::layout::*;
use crate::memory::GuestMemory;

/// Errors booting a kernel.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot open kernel {0}
    OpenKernel(String, #[source] std::io::Error),
    /// Kernel {0} is neither an ELF vmlinux nor a bzImage
    UnknownFormat(String),
    /// Cannot load the kernel: {0}
    Load(String),
    /// Invalid kernel command line: {0}
    Cmdline(String),
    /// Cannot write boot structures to guest memory
    Memory(#[source] vm_memory::GuestMemoryError),
    /// Cannot write the MP table
    MpTable(#[source] mptable::Error),
    /// Cannot set up the boot vCPU
    Cpu(#[source] crate::arch::Error),
}

/// How the boot vCPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryPoint {
    /// 64-bit entry with `rsi` = zero page.
    Linux64 { entry: u64 },
    /// PVH 32-bit entry with `rbx` = `hvm_start_info`.
    Pvh { entry: u64 },
}

/// Kernel image formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    Elf,
    BzImage,
}

/// Detects the kernel format from its first bytes.
pub fn detect_format(path: &Path) -> Result<KernelFormat, Error> {
    let name = path.display().to_string();
    let mut f = File::open(path).map_err(|e| Error::OpenKernel(name.clone(), e))?;
    let mut head = [0u8; 0x206];
    let n = read_up_to(&mut f, &mut head).map_err(|e| Error::OpenKernel(name.clone(), e))?;
    if n >= 4 && head[..4] == *b"\x7fELF" {
        return Ok(KernelFormat::Elf);
    }
    if n >= 0x206 && head[0x202..0x206] == *b"HdrS" {
        return Ok(KernelFormat::BzImage);
    }
    Err(Error::UnknownFormat(name))
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

const E820_RAM: u32 = 1;
const PVH_MAGIC: u32 = 0x336e_c578;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x0100_0000;

/// The usable RAM ranges: low memory below the EBDA, then everything from 1 MiB.
fn ram_map(mem: &GuestMemory) -> Vec<(u64, u64)> {
    let mut map = vec![(0, EBDA_START)];
    for region in mem.iter() {
        let start = region.start_addr().0.max(HIMEM_START);
        let end = region.start_addr().0 + region.len();
        if end > start {
            map.push((start, end - start));
        }
    }
    map
}

/// Loads the kernel at `path` and the command line; returns how to enter it.
pub fn load_kernel(mem: &GuestMemory, path: &Path, cmdline: &Cmdline) -> Result<EntryPoint, Error> {
    let name = path.display().to_string();
    let format = detect_format(path)?;
    let mut file = File::open(path).map_err(|e| Error::OpenKernel(name.clone(), e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::OpenKernel(name.clone(), e))?;
    load_cmdline(mem, GuestAddress(CMDLINE_START), cmdline)
        .map_err(|e| Error::Cmdline(e.to_string()))?;
    let cmdline_len = cmdline
        .as_cstring()
        .map_err(|e| Error::Cmdline(e.to_string()))?
        .as_bytes_with_nul()
        .len();
    let cmdline_len =
        u32::try_from(cmdline_len).map_err(|_| Error::Cmdline("too long".to_string()))?;

    let (entry, setup_header) = match format {
        KernelFormat::Elf => {
            let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(|e| Error::Load(e.to_string()))?;
            if let PvhBootCapability::PvhEntryPresent(addr) = r.pvh_boot_cap {
                write_pvh_start_info(mem, cmdline_len)?;
                return Ok(EntryPoint::Pvh { entry: addr.0 });
            }
            (r.kernel_load.0, None)
        }
        KernelFormat::BzImage => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(|e| Error::Load(e.to_string()))?;
            // The 64-bit entry point sits 0x200 bytes into the protected-mode kernel.
            (r.kernel_load.0 + 0x200, r.setup_header)
        }
    };
    write_zero_page(mem, setup_header, cmdline_len)?;
    Ok(EntryPoint::Linux64 { entry })
}

fn write_zero_page(
    mem: &GuestMemory,
    setup_header: Option<linux_loader::loader::bootparam::setup_header>,
    cmdline_len: u32,
) -> Result<(), Error> {
    let mut params = boot_params::default();
    if let Some(hdr) = setup_header {
        params.hdr = hdr;
    } else {
        params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
        params.hdr.header = KERNEL_HDR_MAGIC;
        params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.cmd_line_ptr = lo32(CMDLINE_START); // below 1 MiB
    params.hdr.cmdline_size = cmdline_len;
    let map = ram_map(mem);
    for (i, (addr, size)) in map.iter().enumerate().take(params.e820_table.len()) {
        params.e820_table[i].addr = *addr;
        params.e820_table[i].size = *size;
        params.e820_table[i].r#type = E820_RAM;
    }
    // The zero page holds 128 entries, so the count fits its u8.
    params.e820_entries = u8::try_from(map.len().min(params.e820_table.len())).unwrap_or(u8::MAX);
    mem.write_obj(params, GuestAddress(ZERO_PAGE_START))
        .map_err(Error::Memory)
}

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct StartInfo {
    magic: u32,
    version: u32,
    flags: u32,
    nr_modules: u32,
    modlist_paddr: u64,
    cmdline_paddr: u64,
    rsdp_paddr: u64,
    memmap_paddr: u64,
    memmap_entries: u32,
    reserved: u32,
}
// SAFETY: repr(C) integers laid out without implicit padding (56 bytes); any bits are valid.
unsafe impl ByteValued for StartInfo {}

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct MemmapEntry {
    addr: u64,
    size: u64,
    type_: u32,
    reserved: u32,
}
// SAFETY: repr(C) integers without padding (24 bytes); any bits are valid.
unsafe impl ByteValued for MemmapEntry {}

fn write_pvh_start_info(mem: &GuestMemory, _cmdline_len: u32) -> Result<(), Error> {
    let map = ram_map(mem);
    for (i, (addr, size)) in map.iter().enumerate() {
        let e = MemmapEntry {
            addr: *addr,
            size: *size,
            type_: E820_RAM,
            reserved: 0,
        };
        mem.write_obj(
            e,
            GuestAddress(PVH_MEMMAP_START + (i * std::mem::size_of::<MemmapEntry>()) as u64),
        )
        .map_err(Error::Memory)?;
    }
    let info = StartInfo {
        magic: PVH_MAGIC,
        version: 1,
        cmdline_paddr: CMDLINE_START,
        memmap_paddr: PVH_MEMMAP_START,
        // At most two RAM ranges (below and above the MMIO gap).
        memmap_entries: u32::try_from(map.len()).expect("two ranges"),
        ..Default::default()
    };
    mem.write_obj(info, GuestAddress(PVH_INFO_START))
        .map_err(Error::Memory)
}

/// Writes the MP table and sets up the boot vCPU for `entry`.
pub fn setup_boot_cpu(
    mem: &GuestMemory,
    vcpu: &mut dyn Vcpu,
    entry: EntryPoint,
    vcpu_count: u8,
) -> Result<(), Error> {
    mptable::write(mem, vcpu_count).map_err(Error::MpTable)?;
    match entry {
        EntryPoint::Linux64 { entry } => {
            crate::arch::setup_long_mode(mem, vcpu, entry, BOOT_STACK_POINTER, ZERO_PAGE_START)
        }
        EntryPoint::Pvh { entry } => crate::arch::setup_pvh(mem, vcpu, entry, PVH_INFO_START),
    }
    .map_err(Error::Cpu)
}

/// Builds the kernel command line: the user's part, the console and one
/// `virtio_mmio.device=` entry per device.
pub fn build_cmdline(base: &str, devices: &[(u64, u32)]) -> Result<Cmdline, Error> {
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE).map_err(|e| Error::Cmdline(e.to_string()))?;
    if !base.is_empty() {
        cmdline
            .insert_str(base)
            .map_err(|e| Error::Cmdline(e.to_string()))?;
    }
    for &(addr, irq) in devices {
        cmdline
            .add_virtio_mmio_device(VIRTIO_MMIO_SIZE, GuestAddress(addr), irq, None)
            .map_err(|e| Error::Cmdline(e.to_string()))?;
    }
    Ok(cmdline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_announces_virtio_devices() {
        let c = build_cmdline("console=ttyS0", &[(0xd000_0000, 5), (0xd000_1000, 6)]).unwrap();
        let s = c.as_cstring().unwrap().into_string().unwrap();
        assert!(s.starts_with("console=ttyS0 "));
        assert!(s.contains("virtio_mmio.device=4K@0xd0000000:5"));
        assert!(s.contains("virtio_mmio.device=4K@0xd0001000:6"));
    }

    #[test]
    fn rejects_non_kernels() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, b"not a kernel").unwrap();
        assert!(matches!(detect_format(&p), Err(Error::UnknownFormat(_))));
        assert!(matches!(
            detect_format(&dir.path().join("missing")),
            Err(Error::OpenKernel(..))
        ));
    }

    #[test]
    fn zero_page_has_e820_and_cmdline() {
        let mem = crate::memory::create(64 << 20).unwrap();
        write_zero_page(&mem, None, 10).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap();
        assert_eq!(p.e820_entries, 2);
        let e = p.e820_table[1];
        assert_eq!({ e.addr }, HIMEM_START);
        assert_eq!({ e.size }, (64 << 20) - HIMEM_START);
        assert_eq!(u64::from(p.hdr.cmd_line_ptr), CMDLINE_START);
        assert_eq!({ p.hdr.header }, KERNEL_HDR_MAGIC);
    }

    #[test]
    fn pvh_start_info_points_at_memmap() {
        let mem = crate::memory::create(64 << 20).unwrap();
        write_pvh_start_info(&mem, 10).unwrap();
        let info: StartInfo = mem.read_obj(GuestAddress(PVH_INFO_START)).unwrap();
        assert_eq!(info.magic, PVH_MAGIC);
        assert_eq!(info.memmap_entries, 2);
        let e: MemmapEntry = mem.read_obj(GuestAddress(PVH_MEMMAP_START)).unwrap();
        assert_eq!((e.addr, e.size), (0, EBDA_START));
    }
}
