//! KVM plumbing tests with tiny hand-made guests: a few dozen instructions loaded at 1 MiB
//! and entered in 64-bit mode. They prove vCPU setup, port I/O and MMIO exits through the
//! bus, virtio-mmio register access, a vsock packet exchange and clean shutdown, without
//! booting Linux (which the PVM-based /dev/kvm on our build machines cannot do).
//!
//! Skipped (with a message) on hosts without /dev/kvm.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use belljar_vmm::builder::{BuildOptions, Vmm};
use belljar_vmm::config::{VmConfig, VsockConfig};
use belljar_vmm::exit::ExitReason;
use belljar_vmm_api::control::VmState;
use vm_memory::{Bytes, GuestAddress};

const BASE: u64 = 0x10_0000;
/// `BASE` for 32-bit guest fields (virtqueue addresses, `lidt` operands).
const BASE32: u32 = 0x10_0000;

/// A small test length or index as the u32 a guest structure holds.
fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap()
}

const MMIO: u32 = 0xd000_0000;

/// A tiny x86-64 assembler for the handful of instructions these guests use.
#[derive(Default)]
struct Asm(Vec<u8>);

impl Asm {
    fn mov_ebx(&mut self, v: u32) -> &mut Self {
        self.0.push(0xbb);
        self.0.extend(v.to_le_bytes());
        self
    }
    /// mov dword [rbx + off], v
    fn store(&mut self, off: u32, v: u32) -> &mut Self {
        self.0.extend([0xc7, 0x83]);
        self.0.extend(off.to_le_bytes());
        self.0.extend(v.to_le_bytes());
        self
    }
    /// mov eax, dword [rbx + off]
    fn load(&mut self, off: u32) -> &mut Self {
        self.0.extend([0x8b, 0x83]);
        self.0.extend(off.to_le_bytes());
        self
    }
    /// Prints the 4 bytes of eax on COM1, low byte first.
    fn print_eax(&mut self) -> &mut Self {
        self.0.extend([0x66, 0xba, 0xf8, 0x03]); // mov dx, 0x3f8
        for _ in 0..4 {
            self.0.extend([0xee, 0xc1, 0xe8, 0x08]); // out dx, al; shr eax, 8
        }
        self
    }
    fn print(&mut self, s: &[u8]) -> &mut Self {
        self.0.extend([0x66, 0xba, 0xf8, 0x03]);
        for b in s {
            self.0.extend([0xb0, *b, 0xee]); // mov al, b; out dx, al
        }
        self
    }
    /// Spins until the u16 at `addr` is at least `min`.
    fn wait_u16(&mut self, addr: u32, min: u8) -> &mut Self {
        self.0.push(0xb9);
        self.0.extend(addr.to_le_bytes()); // mov ecx, addr
        self.0
            .extend([0x0f, 0xb7, 0x01, 0x83, 0xf8, min, 0x72, 0xf8]); // movzx; cmp; jb
        self
    }
    /// i8042 CPU reset.
    fn reset(&mut self) -> &mut Self {
        self.0.extend([0xb0, 0xfe, 0xe6, 0x64]);
        self
    }
    fn hlt(&mut self) -> &mut Self {
        self.0.push(0xf4);
        self
    }
}

fn config(dir: &Path, image: &[u8]) -> VmConfig {
    common::raw_config(dir, image, "console.log")
}

/// Waits (5 s at most) until the guest has written `expected` to its console log `log`.
fn wait_for_console(log: &Path, expected: &[u8]) {
    let t = Instant::now();
    while std::fs::read(log).unwrap_or_default() != expected {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the guest never wrote {:?}",
            String::from_utf8_lossy(expected)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn run(vmm: &Vmm) -> ExitReason {
    let reason = vmm
        .wait(Duration::from_secs(5))
        .expect("guest did not finish");
    vmm.shutdown();
    reason
}

#[test]
fn serial_output_and_i8042_reset() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut a = Asm::default();
    a.print(b"hello\n").reset().hlt();
    let t = Instant::now();
    let vmm = Vmm::start(&config(dir.path(), &a.0), &hv).unwrap();
    assert_eq!(run(&vmm), ExitReason::Reset);
    eprintln!("tiny guest ran in {:?}", t.elapsed());
    let log = std::fs::read(dir.path().join("console.log")).unwrap();
    assert_eq!(log, b"hello\n");
    let m = vmm.metrics();
    assert!(m.vcpus[0].io_exits >= 7, "{m:?}");
    assert_eq!(m.devices[0].bytes_in, 6);
}

#[test]
fn halt_without_irqchip_powers_off() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut a = Asm::default();
    a.print(b"x").hlt();
    let vmm = Vmm::start_with(
        &config(dir.path(), &a.0),
        &hv,
        BuildOptions { irqchip: false },
    )
    .unwrap();
    assert_eq!(run(&vmm), ExitReason::PowerOff);
    assert_eq!(vmm.metrics().vcpus[0].halt_exits, 1);
}

#[test]
fn virtio_mmio_registers_and_unknown_mmio() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut a = Asm::default();
    a.mov_ebx(MMIO)
        .load(0x000) // magic
        .print_eax()
        .load(0x008) // device id
        .print_eax()
        .store(0x070, 1) // status = ACKNOWLEDGE
        .load(0x070)
        .print_eax()
        .mov_ebx(MMIO + 0x10_0000) // nobody there
        .load(0)
        .print_eax()
        .reset();
    let mut cfg = config(dir.path(), &a.0);
    cfg.rng = true;
    let vmm = Vmm::start(&cfg, &hv).unwrap();
    assert_eq!(run(&vmm), ExitReason::Reset);
    let log = std::fs::read(dir.path().join("console.log")).unwrap();
    assert_eq!(&log[0..4], b"virt");
    assert_eq!(&log[4..8], &4u32.to_le_bytes()); // virtio-rng
    assert_eq!(&log[8..12], &1u32.to_le_bytes());
    assert_eq!(&log[12..16], &[0xff; 4]);
    assert_eq!(vmm.metrics().unknown_mmio, 1);
}

/// Guest-side virtqueue layout inside the raw image.
struct Ring {
    desc: u32,
    avail: u32,
    used: u32,
}

fn ring(off: u32) -> Ring {
    Ring {
        desc: BASE32 + off,
        avail: BASE32 + off + 0x100,
        used: BASE32 + off + 0x200,
    }
}

fn put_desc(img: &mut [u8], r: &Ring, idx: usize, addr: u32, len: u32, flags: u16) {
    let at = usize::try_from(r.desc - BASE32).unwrap() + idx * 16;
    img[at..at + 8].copy_from_slice(&u64::from(addr).to_le_bytes());
    img[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
    img[at + 12..at + 14].copy_from_slice(&flags.to_le_bytes());
}

fn put_avail(img: &mut [u8], r: &Ring, heads: &[u16]) {
    let at = usize::try_from(r.avail - BASE32).unwrap();
    img[at + 2..at + 4].copy_from_slice(&u16::try_from(heads.len()).unwrap().to_le_bytes());
    for (i, h) in heads.iter().enumerate() {
        img[at + 4 + 2 * i..at + 6 + 2 * i].copy_from_slice(&h.to_le_bytes());
    }
}

fn vsock_hdr(op: u16, src_port: u32, dst_port: u32, len: u32) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend(3u64.to_le_bytes()); // src cid
    h.extend(2u64.to_le_bytes()); // dst cid (host)
    h.extend(src_port.to_le_bytes());
    h.extend(dst_port.to_le_bytes());
    h.extend(len.to_le_bytes());
    h.extend(1u16.to_le_bytes()); // stream
    h.extend(op.to_le_bytes());
    h.extend(0u32.to_le_bytes()); // flags
    h.extend(65536u32.to_le_bytes()); // buf_alloc
    h.extend(0u32.to_le_bytes()); // fwd_cnt
    h
}

#[test]
fn vsock_packet_exchange() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("vsock.sock");
    let listener = UnixListener::bind(format!("{}_52", uds.display())).unwrap();

    let (rx, tx, ev) = (ring(0x1000), ring(0x2000), ring(0x3000));
    let mut img = vec![0u8; 0x8000];
    // Two tx packets: REQUEST to host port 52, then RW "hello".
    let req = vsock_hdr(1, 1000, 52, 0);
    let mut rw = vsock_hdr(5, 1000, 52, 5);
    rw.extend(b"hello");
    img[0x4000..0x4000 + req.len()].copy_from_slice(&req);
    img[0x4100..0x4100 + rw.len()].copy_from_slice(&rw);
    put_desc(&mut img, &tx, 0, BASE32 + 0x4000, u32_of(req.len()), 0);
    put_desc(&mut img, &tx, 1, BASE32 + 0x4100, u32_of(rw.len()), 0);
    put_avail(&mut img, &tx, &[0, 1]);
    // Four writable rx buffers.
    for i in 0..4 {
        put_desc(
            &mut img,
            &rx,
            i,
            BASE32 + 0x5000 + u32_of(i) * 0x400,
            0x400,
            2,
        );
    }
    put_avail(&mut img, &rx, &[0, 1, 2, 3]);

    let mut a = Asm::default();
    a.mov_ebx(MMIO)
        .store(0x070, 1)
        .store(0x070, 3)
        .store(0x024, 1) // driver features, high word
        .store(0x020, 1) // VIRTIO_F_VERSION_1
        .store(0x070, 0xb);
    for (q, r) in [&rx, &tx, &ev].into_iter().enumerate() {
        a.store(0x030, u32_of(q))
            .store(0x038, 16)
            .store(0x080, r.desc)
            .store(0x084, 0)
            .store(0x090, r.avail)
            .store(0x094, 0)
            .store(0x0a0, r.used)
            .store(0x0a4, 0)
            .store(0x044, 1);
    }
    a.store(0x070, 0xf) // DRIVER_OK
        .store(0x050, 1) // notify tx
        .wait_u16(rx.used + 2, 2) // RESPONSE, then the host's data
        .reset();
    img[..a.0.len()].copy_from_slice(&a.0);

    let mut cfg = config(dir.path(), &img);
    cfg.vsock = Some(VsockConfig {
        guest_cid: 3,
        uds_path: uds.clone(),
    });
    let vmm = Vmm::start(&cfg, &hv).unwrap();

    let (mut host, _) = listener.accept().unwrap();
    host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 5];
    host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    host.write_all(b"world").unwrap();

    assert_eq!(run(&vmm), ExitReason::Reset);
    let mem = vmm.memory();
    let used_idx: u16 = mem.read_obj(GuestAddress(u64::from(rx.used) + 2)).unwrap();
    assert!(used_idx >= 2);
    let head: u32 = mem
        .read_obj(GuestAddress(u64::from(rx.used) + 4 + 8))
        .unwrap();
    let pkt = GuestAddress(BASE + 0x5000 + u64::from(head) * 0x400);
    let op: u16 = mem.read_obj(GuestAddress(pkt.0 + 30)).unwrap();
    assert_eq!(op, 5, "second rx packet is RW");
    let mut data = [0u8; 5];
    mem.read_slice(&mut data, GuestAddress(pkt.0 + 44)).unwrap();
    assert_eq!(&data, b"world");
    let first_op: u16 = mem.read_obj(GuestAddress(BASE + 0x5000 + 30)).unwrap();
    assert_eq!(first_op, 2, "first rx packet is RESPONSE");
}

#[test]
fn two_vcpus_start_and_stop() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut a = Asm::default();
    // The boot vCPU prints and halts; the second vCPU waits for INIT/SIPI in the kernel.
    a.print(b"up").hlt();
    let mut cfg = config(dir.path(), &a.0);
    cfg.vcpus = 2;
    let vmm = Vmm::start(&cfg, &hv).unwrap();
    // Paused only once the guest is running: the boot vCPU has printed and halts.
    wait_for_console(&dir.path().join("console.log"), b"up");
    assert_eq!(vmm.state(), VmState::Running);
    vmm.pause().unwrap();
    assert_eq!(vmm.state(), VmState::Paused);
    vmm.resume();
    vmm.request_stop();
    assert_eq!(run(&vmm), ExitReason::Stopped);
    assert_eq!(vmm.metrics().vcpus.len(), 2);
    let log = std::fs::read(dir.path().join("console.log")).unwrap();
    assert_eq!(log, b"up");
}

#[test]
fn ioapic_interrupt_reaches_the_guest() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    const VECTOR: u8 = 0x30;
    let mut img = vec![0u8; 0x4000];
    // Handler at +0x800: print "I!" and reset.
    let mut h = Asm::default();
    h.print(b"I!").reset().hlt();
    img[0x800..0x800 + h.0.len()].copy_from_slice(&h.0);
    let handler = BASE + 0x800;
    // IDT at +0x3000 with one 64-bit interrupt gate; IDTR at +0x2000.
    let gate = 0x3000 + usize::from(VECTOR) * 16;
    img[gate..gate + 2].copy_from_slice(&u16::try_from(handler & 0xffff).unwrap().to_le_bytes());
    img[gate + 2..gate + 4].copy_from_slice(&8u16.to_le_bytes()); // 64-bit code selector
    img[gate + 5] = 0x8e; // present, DPL 0, interrupt gate
    img[gate + 6..gate + 8].copy_from_slice(
        &u16::try_from((handler >> 16) & 0xffff)
            .unwrap()
            .to_le_bytes(),
    );
    img[gate + 8..gate + 12].copy_from_slice(&u32::try_from(handler >> 32).unwrap().to_le_bytes());
    img[0x2000..0x2002].copy_from_slice(&0xfffu16.to_le_bytes());
    img[0x2002..0x200a].copy_from_slice(&(BASE + 0x3000).to_le_bytes());

    let mut a = Asm::default();
    a.0.extend([0x0f, 0x01, 0x1c, 0x25]); // lidt [abs32]
    a.0.extend((BASE32 + 0x2000).to_le_bytes());
    a.mov_ebx(0xfee0_0000)
        .store(0xf0, 0x1ff) // local APIC on, spurious vector 0xff
        // Mask LINT0. GSI 5 also reaches the 8259, and the BSP's LINT0 is ExtINT (virtual
        // wire), so on real KVM the PIC's vector 5 could win the race against the IOAPIC's.
        .store(0x350, 1 << 16);
    a.mov_ebx(0xfec0_0000)
        .store(0x00, 0x10 + 2 * 5) // IOAPIC redirection entry for pin 5, low half
        .store(0x10, u32::from(VECTOR)) // fixed, edge, unmasked
        .store(0x00, 0x10 + 2 * 5 + 1)
        .store(0x10, 0); // destination APIC 0
    a.print(b"W");
    a.0.extend([0xfb, 0xf4, 0xeb, 0xfd]); // sti; hlt; jmp back to hlt
    img[..a.0.len()].copy_from_slice(&a.0);

    let vmm = Vmm::start(&config(dir.path(), &img), &hv).unwrap();
    // Wait for the guest to be ready, then raise the line as a device would.
    let log = dir.path().join("console.log");
    wait_for_console(&log, b"W");
    // No further wait: the IOAPIC entry is programmed before "W", and an edge raised while
    // the guest still has interrupts off stays pending in the local APIC until its `sti`.
    let line = belljar_vmm::devices::IrqLine::new(vmm.vm().clone(), 5);
    belljar_vmm::devices::Interrupt::trigger(&line);
    // Without the interrupt the guest would sleep in `hlt` forever and `run` would time out.
    assert_eq!(run(&vmm), ExitReason::Reset);
    let out = std::fs::read(&log).unwrap();
    if belljar_vmm::hypervisor::host_has_hw_virt() == Some(false) {
        // Software KVM (PVM) routes the interrupt to the vCPU but cannot deliver it through
        // the IDT of a guest kernel that is not PVM-aware: the delivery ends in a triple
        // fault (a reset). `int n` in guest kernel mode is an emulation error there too.
        assert!(out == b"W" || out == b"WI!", "{out:?}");
    } else {
        assert_eq!(out, b"WI!");
    }
}
