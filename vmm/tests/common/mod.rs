//! Set-up shared by the tests that run hand-made guests on this host's `/dev/kvm`
//! (`tiny_guest.rs`, `snapshot.rs`, `boot_protocols.rs`): opening KVM, which only a machine off CI may lack, and a
//! raw-boot configuration for a guest image written to a file.

// Each test crate that includes this module uses its own part of it.
#![allow(dead_code)]

use std::path::Path;

use belljar_vmm::config::{BootMode, SerialConfig, VmConfig};
use belljar_vmm::hypervisor::kvm::KvmHypervisor;

/// KVM, or `None` (with a message) on a host without `/dev/kvm`; CI machines have it, so
/// there its absence fails the test instead of skipping it.
pub fn kvm() -> Option<KvmHypervisor> {
    if !Path::new("/dev/kvm").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI machines have /dev/kvm"
        );
        eprintln!("not run: no /dev/kvm");
        return None;
    }
    Some(KvmHypervisor::new().expect("open /dev/kvm"))
}

/// A 16 MiB VM that runs `image` from its first byte (raw boot, no RNG device), its serial
/// output logged to `dir/log`.
pub fn raw_config(dir: &Path, image: &[u8], log: &str) -> VmConfig {
    let kernel = dir.join("guest.bin");
    std::fs::write(&kernel, image).unwrap();
    VmConfig {
        kernel: Some(kernel),
        boot: BootMode::Raw,
        memory_mib: 16,
        rng: false,
        serial: SerialConfig {
            log: Some(dir.join(log)),
            echo: false,
        },
        ..Default::default()
    }
}
