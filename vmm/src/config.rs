//! The VM configuration: a JSON file (what the daemon writes) or command-line flags.
//!
//! `validate` checks everything that can be checked before touching KVM, so a bad config
//! fails at once with one line and exit status 2 instead of deep inside the guest.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors in a configuration.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot read config file {0}
    Read(String, #[source] std::io::Error),
    /// Invalid config file {0}
    Parse(String, #[source] serde_json::Error),
    /// No kernel given (set "kernel" or --kernel)
    NoKernel,
    /// Kernel {0} cannot be read
    Kernel(String, #[source] std::io::Error),
    /// Memory size must be at least 1 MiB (got {0} MiB)
    Memory(u64),
    /// vCPU count must be between 1 and {max} (got {got})
    Vcpus { got: u8, max: u8 },
    /// Disk {0} cannot be opened
    Disk(String, #[source] std::io::Error),
    /// Too many virtio devices ({0}); at most {1} fit the interrupt lines
    TooManyDevices(usize, usize),
    /// Vsock guest CID must be 3 or more (got {0})
    Cid(u64),
}

/// How the kernel file is interpreted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    /// A Linux kernel: vmlinux ELF (PVH entry if present, else 64-bit entry) or bzImage.
    #[default]
    Linux,
    /// Flat machine code loaded at 1 MiB and entered in 64-bit mode with identity paging
    /// (tests and benchmarks).
    Raw,
}

/// A virtio-blk disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    pub path: PathBuf,
    #[serde(default)]
    pub read_only: bool,
    /// Serial reported to the guest (`/sys/block/vdX/serial`), at most 20 bytes.
    #[serde(default)]
    pub id: String,
}

/// The hybrid vsock device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    #[serde(default = "default_cid")]
    pub guest_cid: u64,
    pub uds_path: PathBuf,
}

fn default_cid() -> u64 {
    3
}

/// The serial console.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    /// File the console output is appended to.
    #[serde(default)]
    pub log: Option<PathBuf>,
    /// Also copy console output to the VMM's stdout.
    #[serde(default)]
    pub echo: bool,
}

/// The whole VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub kernel: Option<PathBuf>,
    #[serde(default)]
    pub boot: BootMode,
    #[serde(default = "default_cmdline")]
    pub cmdline: String,
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    #[serde(default = "default_vcpus")]
    pub vcpus: u8,
    #[serde(default)]
    pub disks: Vec<DiskConfig>,
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    #[serde(default = "default_true")]
    pub rng: bool,
    #[serde(default)]
    pub serial: SerialConfig,
    #[serde(default)]
    pub control_socket: Option<PathBuf>,
    #[serde(default = "default_true")]
    pub seccomp: bool,
}

/// Kernel command line used when none is given.
pub const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.dumbkbd";

fn default_cmdline() -> String {
    DEFAULT_CMDLINE.to_string()
}
fn default_memory() -> u64 {
    256
}
fn default_vcpus() -> u8 {
    1
}
fn default_true() -> bool {
    true
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            kernel: None,
            boot: BootMode::Linux,
            cmdline: default_cmdline(),
            memory_mib: default_memory(),
            vcpus: default_vcpus(),
            disks: Vec::new(),
            vsock: None,
            rng: true,
            serial: SerialConfig::default(),
            control_socket: None,
            seccomp: true,
        }
    }
}

/// Most vCPUs per VM.
pub const MAX_VCPUS: u8 = 32;

impl VmConfig {
    /// Reads a JSON config file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Read(name.clone(), e))?;
        serde_json::from_str(&text).map_err(|e| Error::Parse(name, e))
    }

    /// Number of virtio-mmio devices this config creates.
    pub fn virtio_device_count(&self) -> usize {
        self.disks.len() + usize::from(self.vsock.is_some()) + usize::from(self.rng)
    }

    /// Checks the config against the filesystem without starting anything.
    pub fn validate(&self) -> Result<(), Error> {
        let kernel = self.kernel.as_ref().ok_or(Error::NoKernel)?;
        std::fs::File::open(kernel)
            .and_then(|f| {
                let meta = f.metadata()?;
                if meta.is_dir() {
                    return Err(std::io::Error::other("is a directory"));
                }
                Ok(())
            })
            .map_err(|e| Error::Kernel(kernel.display().to_string(), e))?;
        if self.memory_mib == 0 || self.memory_mib > (1 << 20) {
            return Err(Error::Memory(self.memory_mib));
        }
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(Error::Vcpus {
                got: self.vcpus,
                max: MAX_VCPUS,
            });
        }
        for disk in &self.disks {
            std::fs::OpenOptions::new()
                .read(true)
                .write(!disk.read_only)
                .open(&disk.path)
                .and_then(|f| {
                    if f.metadata()?.is_dir() {
                        return Err(std::io::Error::other("is a directory"));
                    }
                    Ok(())
                })
                .map_err(|e| Error::Disk(disk.path.display().to_string(), e))?;
        }
        let max = (crate::layout::IRQ_MAX - crate::layout::VIRTIO_IRQ_BASE + 1) as usize;
        if self.virtio_device_count() > max {
            return Err(Error::TooManyDevices(self.virtio_device_count(), max));
        }
        if let Some(v) = &self.vsock
            && (v.guest_cid < 3 || v.guest_cid > u64::from(u32::MAX))
        {
            return Err(Error::Cid(v.guest_cid));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_kernel(dir: &tempfile::TempDir) -> VmConfig {
        let k = dir.path().join("vmlinux");
        std::fs::write(&k, b"\x7fELF").unwrap();
        VmConfig {
            kernel: Some(k),
            ..Default::default()
        }
    }

    #[test]
    fn parses_the_documented_example() {
        let json = r#"{
            "kernel": "/k/vmlinux",
            "cmdline": "console=ttyS0",
            "memory_mib": 512,
            "vcpus": 2,
            "disks": [{"path": "/i/root.ext4", "read_only": true, "id": "root"},
                      {"path": "/s/rw.ext4"}],
            "vsock": {"guest_cid": 3, "uds_path": "/s/vsock.sock"},
            "rng": true,
            "serial": {"log": "/s/console.log", "echo": false},
            "control_socket": "/s/vmm.sock",
            "seccomp": true
        }"#;
        let c: VmConfig = serde_json::from_str(json).unwrap();
        assert_eq!(c.vcpus, 2);
        assert!(c.disks[0].read_only && !c.disks[1].read_only);
        assert_eq!(c.vsock.as_ref().unwrap().guest_cid, 3);
        assert_eq!(c.virtio_device_count(), 4);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<VmConfig>(r#"{"kernal": "/k"}"#).is_err());
    }

    #[test]
    fn validation_catches_bad_configs() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            VmConfig::default().validate(),
            Err(Error::NoKernel)
        ));
        let c = VmConfig {
            kernel: Some(dir.path().join("missing")),
            ..Default::default()
        };
        assert!(matches!(c.validate(), Err(Error::Kernel(..))));
        let mut c = with_kernel(&dir);
        c.validate().unwrap();
        c.memory_mib = 0;
        assert!(matches!(c.validate(), Err(Error::Memory(0))));
        let mut c = with_kernel(&dir);
        c.vcpus = 0;
        assert!(matches!(c.validate(), Err(Error::Vcpus { .. })));
        let mut c = with_kernel(&dir);
        c.disks.push(DiskConfig {
            path: dir.path().join("nope.img"),
            read_only: true,
            id: String::new(),
        });
        let e = c.validate().unwrap_err();
        assert!(matches!(e, Error::Disk(..)));
        assert!(!e.to_string().contains('\n'));
    }
}
