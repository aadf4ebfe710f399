//! The three Linux entry paths, exercised on KVM with tiny hand-made "kernels": a bzImage
//! (64-bit entry at load + 0x200, `rsi` = zero page), an ELF vmlinux without a PVH note
//! (64-bit entry, `rsi` = zero page) and an ELF with a PVH note (32-bit protected mode,
//! `rbx` = hvm_start_info). Each guest prints a marker plus 4 bytes read from its boot
//! structure, then resets.

mod common;

use std::path::Path;
use std::time::Duration;

use belljar_vmm::builder::Vmm;
use belljar_vmm::config::{SerialConfig, VmConfig};
use belljar_vmm::exit::ExitReason;

/// Prints `tag`, then the 4 bytes at [reg + disp] (`load` is the mov-to-eax encoding).
fn guest_code(tag: &[u8], load: &[u8]) -> Vec<u8> {
    let mut c = vec![0x66, 0xba, 0xf8, 0x03]; // mov dx, 0x3f8
    for b in tag {
        c.extend([0xb0, *b, 0xee]);
    }
    c.extend(load);
    for _ in 0..4 {
        c.extend([0xee, 0xc1, 0xe8, 0x08]); // out dx, al; shr eax, 8
    }
    c.extend([0xb0, 0xfe, 0xe6, 0x64, 0xf4]); // i8042 reset; hlt
    c
}

fn bzimage(code: &[u8]) -> Vec<u8> {
    let mut img = vec![0u8; 1024 + 0x200 + code.len()];
    img[0x1f1] = 1; // setup_sects: setup is (1 + 1) * 512 bytes
    img[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    img[0x202..0x206].copy_from_slice(b"HdrS");
    img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    img[0x211] = 1; // LOADED_HIGH
    img[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
    img[1024 + 0x200..].copy_from_slice(code);
    img
}

/// An ELF64 executable with one PT_LOAD of `code` at physical 0x100000 and, if `pvh`, a
/// PT_NOTE carrying XEN_ELFNOTE_PHYS32_ENTRY = 0x100000.
fn elf(code: &[u8], pvh: bool) -> Vec<u8> {
    let phnum: u16 = if pvh { 2 } else { 1 };
    let note_off = 0x100usize;
    let code_off = 0x200usize;
    let mut e = vec![0u8; code_off];
    e[..4].copy_from_slice(b"\x7fELF");
    e[4] = 2; // 64-bit
    e[5] = 1; // little endian
    e[6] = 1; // version
    e[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e[18..20].copy_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    e[20..24].copy_from_slice(&1u32.to_le_bytes());
    e[24..32].copy_from_slice(&0x10_0000u64.to_le_bytes()); // e_entry
    e[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    e[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    e[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    e[56..58].copy_from_slice(&phnum.to_le_bytes());
    let phdr = |e: &mut Vec<u8>, i: usize, p_type: u32, off: u64, paddr: u64, size: u64| {
        let at = 64 + i * 56;
        e[at..at + 4].copy_from_slice(&p_type.to_le_bytes());
        e[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes()); // R+X
        e[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
        e[at + 16..at + 24].copy_from_slice(&paddr.to_le_bytes()); // vaddr
        e[at + 24..at + 32].copy_from_slice(&paddr.to_le_bytes()); // paddr
        e[at + 32..at + 40].copy_from_slice(&size.to_le_bytes()); // filesz
        e[at + 40..at + 48].copy_from_slice(&size.to_le_bytes()); // memsz
        e[at + 48..at + 56].copy_from_slice(&4u64.to_le_bytes());
    };
    phdr(&mut e, 0, 1, code_off as u64, 0x10_0000, code.len() as u64);
    if pvh {
        let mut note = Vec::new();
        note.extend(4u32.to_le_bytes()); // namesz
        note.extend(4u32.to_le_bytes()); // descsz
        note.extend(18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
        note.extend(b"Xen\0");
        note.extend(0x10_0000u32.to_le_bytes());
        e[note_off..note_off + note.len()].copy_from_slice(&note);
        phdr(&mut e, 1, 4, note_off as u64, 0, note.len() as u64);
    }
    e.extend(code);
    e
}

fn boot(dir: &Path, image: &[u8]) -> Option<Vec<u8>> {
    let hv = common::kvm()?;
    let kernel = dir.join("kernel");
    std::fs::write(&kernel, image).unwrap();
    let log = dir.join("console.log");
    let cfg = VmConfig {
        kernel: Some(kernel),
        memory_mib: 64,
        vcpus: 2,
        serial: SerialConfig {
            log: Some(log.clone()),
            echo: false,
        },
        ..Default::default()
    };
    let vmm = Vmm::start(&cfg, &hv).unwrap();
    let reason = vmm.wait(Duration::from_secs(5));
    vmm.shutdown();
    assert_eq!(reason, Some(ExitReason::Reset));
    assert!(vmm.cmdline.contains("virtio_mmio.device=4K@0xd0000000:5"));
    Some(std::fs::read(log).unwrap())
}

#[test]
fn bzimage_64bit_entry_gets_the_zero_page() {
    let dir = tempfile::tempdir().unwrap();
    // mov eax, [rsi + 0x202]: the setup header's "HdrS".
    let code = guest_code(b"bz:", &[0x8b, 0x86, 0x02, 0x02, 0, 0]);
    if let Some(out) = boot(dir.path(), &bzimage(&code)) {
        assert_eq!(out, b"bz:HdrS");
    }
}

#[test]
fn elf_without_pvh_note_uses_64bit_entry() {
    let dir = tempfile::tempdir().unwrap();
    let code = guest_code(b"elf:", &[0x8b, 0x86, 0x02, 0x02, 0, 0]);
    if let Some(out) = boot(dir.path(), &elf(&code, false)) {
        assert_eq!(out, b"elf:HdrS");
    }
}

#[test]
fn elf_with_pvh_note_enters_32bit_with_start_info() {
    let dir = tempfile::tempdir().unwrap();
    // 32-bit code: mov eax, [ebx] reads hvm_start_info.magic.
    let code = guest_code(b"pvh:", &[0x8b, 0x03]);
    if let Some(out) = boot(dir.path(), &elf(&code, true)) {
        assert_eq!(&out[..4], b"pvh:");
        assert_eq!(&out[4..], &0x336e_c578u32.to_le_bytes());
    }
}
