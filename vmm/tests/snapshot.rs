//! Memory snapshots with a tiny hand-made guest: a loop that keeps a counter in a register,
//! stores it in memory and prints a dot on COM1 every 65536 steps. A restored VM must go on
//! counting from the saved value (registers, memory and the UART came back), and two VMs
//! restored from one snapshot (a fork) must run independently. Also the refusals of a
//! damaged or foreign snapshot, each with its stable code.
//!
//! Skipped (with a message) on hosts without /dev/kvm.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use belljar_vmm::builder::Vmm;
use belljar_vmm::config::VmConfig;
use belljar_vmm::hypervisor::kvm::KvmHypervisor;
use belljar_vmm::snapshot::{self, MEMORY_FILE, STATE_FILE, format};
use belljar_vmm_api::control::VmState;
use vm_memory::{Bytes, GuestAddress};

/// Where the guest stores its counter.
const COUNTER: u64 = 0x20_0000;

/// mov ebx, COUNTER; xor ecx, ecx; mov dx, 0x3f8
/// loop: inc ecx; mov [rbx], ecx; test ecx, 0xffff; jnz loop; mov al, '.'; out dx, al; jmp loop
const COUNTING_GUEST: &[u8] = &[
    0xbb, 0x00, 0x00, 0x20, 0x00, // mov ebx, 0x200000
    0x31, 0xc9, // xor ecx, ecx
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
    0xff, 0xc1, // loop: inc ecx
    0x89, 0x0b, // mov [rbx], ecx
    0xf7, 0xc1, 0xff, 0xff, 0x00, 0x00, // test ecx, 0xffff
    0x75, 0xf4, // jnz loop
    0xb0, b'.', // mov al, '.'
    0xee, // out dx, al
    0xeb, 0xef, // jmp loop
];

fn config(dir: &Path, log: &str) -> VmConfig {
    common::raw_config(dir, COUNTING_GUEST, log)
}

fn counter(vmm: &Vmm) -> u32 {
    vmm.memory().read_obj(GuestAddress(COUNTER)).unwrap()
}

/// Waits until `cond` holds, failing after 10 s.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Runs the counting guest until it printed a few dots, snapshots it into `dir/snap` and
/// returns the counter saved (the VM is stopped).
fn counting_snapshot(hv: &KvmHypervisor, dir: &Path) -> u32 {
    let vmm = Vmm::start(&config(dir, "parent.log"), hv).unwrap();
    let log = dir.join("parent.log");
    wait_until("the parent's dots", || {
        std::fs::read(&log).is_ok_and(|l| l.len() >= 3)
    });
    vmm.pause().unwrap();
    let saved = counter(&vmm);
    let info = vmm.snapshot(&dir.join("snap")).unwrap();
    eprintln!(
        "snapshot: {} B state, {} B memory written, {:?}",
        info.state_bytes, info.memory_bytes, info.elapsed
    );
    // A paused VM stays paused through a snapshot.
    assert_eq!(vmm.state(), VmState::Paused);
    assert_eq!(counter(&vmm), saved);
    vmm.shutdown();
    saved
}

#[test]
fn a_restored_guest_counts_on_from_the_saved_value() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let saved = counting_snapshot(&hv, dir.path());
    // Three dots were printed: the count is at least 3 * 65536 (exactly that when the pause
    // came right after the third dot's write, which a CI run met).
    assert!(saved >= 3 * 65536, "{saved}");

    let t = Instant::now();
    let child = Vmm::restore(
        &config(dir.path(), "child.log"),
        &hv,
        &dir.path().join("snap"),
    )
    .unwrap();
    eprintln!("restore took {:?}", t.elapsed());
    // The guest's register held the count: from memory alone it would start over at 1.
    wait_until("the child to count", || counter(&child) > saved + 65536);
    let log = dir.path().join("child.log");
    wait_until("the child's dots", || {
        std::fs::read(&log).is_ok_and(|l| !l.is_empty() && l.iter().all(|&b| b == b'.'))
    });
    assert_eq!(child.state(), VmState::Running);
    child.shutdown();
}

#[test]
fn two_children_of_one_snapshot_run_independently() {
    let Some(hv) = common::kvm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let saved = counting_snapshot(&hv, dir.path());
    let a = Vmm::restore(&config(dir.path(), "a.log"), &hv, &snap).unwrap();
    let b = Vmm::restore(&config(dir.path(), "b.log"), &hv, &snap).unwrap();
    wait_until("both children to count", || {
        counter(&a) > saved && counter(&b) > saved
    });
    // Freeze A: B keeps counting in its own copy of the page, A's stays where it stopped.
    a.pause().unwrap();
    let frozen = counter(&a);
    wait_until("B to pass A", || counter(&b) > frozen + 65536);
    assert_eq!(counter(&a), frozen);
    // A write into A's memory is A's alone: not B's, not the snapshot's file.
    let marker = GuestAddress(0x30_0000);
    a.memory().write_obj(0x5eed_u32, marker).unwrap();
    assert_eq!(b.memory().read_obj::<u32>(marker).unwrap(), 0);
    let file = std::fs::read(snap.join(MEMORY_FILE)).unwrap();
    assert_eq!(&file[0x30_0000..0x30_0004], &[0; 4]);
    let in_file = u32::from_le_bytes(file[0x20_0000..0x20_0004].try_into().unwrap());
    assert_eq!(in_file, saved, "the children never write the snapshot");
    a.shutdown();
    b.shutdown();
}

/// Takes a snapshot of a counting guest and returns its directory's parent.
fn fresh_snapshot(hv: &KvmHypervisor) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    counting_snapshot(hv, dir.path());
    dir
}

fn restore_code(hv: &KvmHypervisor, dir: &Path, cfg: &VmConfig) -> String {
    match Vmm::restore(cfg, hv, &dir.join("snap")) {
        Ok(vmm) => {
            vmm.shutdown();
            "restored".into()
        }
        Err(e) => {
            eprintln!("refused: {e}");
            e.code().to_string()
        }
    }
}

#[test]
fn damaged_or_foreign_snapshots_are_refused_with_stable_codes() {
    let Some(hv) = common::kvm() else { return };
    let dir = fresh_snapshot(&hv);
    let cfg = config(dir.path(), "child.log");
    let state_path = dir.path().join("snap").join(STATE_FILE);
    let good = std::fs::read(&state_path).unwrap();
    let put = |bytes: &[u8]| std::fs::write(&state_path, bytes).unwrap();

    // A flipped byte in the state.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    put(&bad);
    assert_eq!(restore_code(&hv, dir.path(), &cfg), "checksum");
    // Cut short.
    put(&good[..good.len() - 100]);
    assert_eq!(restore_code(&hv, dir.path(), &cfg), "truncated");
    // Another format version.
    let mut bad = good.clone();
    bad[8] = 99;
    put(&bad);
    assert_eq!(restore_code(&hv, dir.path(), &cfg), "format_version");
    // A length field claiming far more than the limit.
    let mut bad = good.clone();
    let at = 14 + format::VMM_VERSION.len();
    bad[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    put(&bad);
    assert_eq!(restore_code(&hv, dir.path(), &cfg), "too_large");

    // Another CPU model: a well-formed file whose state names a different CPU.
    put(&good);
    let mut state: serde_json::Value = format::read(&state_path).unwrap();
    state["cpu_model"] = "OtherVendor family 1 model 2 (Imaginary CPU)".into();
    format::write(&state_path, &state).unwrap();
    assert_eq!(restore_code(&hv, dir.path(), &cfg), "cpu_model");
    put(&good);

    // A configuration of another shape.
    let mut other = cfg.clone();
    other.memory_mib = 32;
    assert_eq!(restore_code(&hv, dir.path(), &other), "config_mismatch");
    let mut other = cfg.clone();
    other.rng = true;
    assert_eq!(restore_code(&hv, dir.path(), &other), "config_mismatch");
    // A memory file of the wrong size.
    let mem = dir.path().join("snap").join(MEMORY_FILE);
    let f = std::fs::OpenOptions::new().write(true).open(&mem).unwrap();
    f.set_len(4096).unwrap();
    assert_eq!(restore_code(&hv, dir.path(), &cfg), "memory");
    // And the CPU model this host reports is not empty (the check compares something).
    assert!(snapshot::host_cpu_model().len() > 20);
}
