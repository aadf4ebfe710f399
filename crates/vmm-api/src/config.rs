//! The VM configuration: the JSON file the daemon writes and `belljar-vmm --config` reads.
//!
//! Unknown fields are refused everywhere, so a misspelt or newer field fails at once instead
//! of being ignored. [`VmConfig::validate`] checks everything that can be checked before
//! touching KVM, so a bad config fails with one line and exit status 2
//! ([`crate::exit::CONFIG_ERROR_STATUS`]) instead of deep inside the guest.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::net::NetConfig;
use crate::{DEFAULT_CMDLINE, MAX_VCPUS, MAX_VIRTIO_DEVICES};

/// Errors in a configuration.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// Cannot read config file {0}
    Read(String, #[source] std::io::Error),
    /// Invalid config file {0}
    Parse(String, #[source] JsonError),
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
    /// Invalid network settings
    Net(#[from] crate::net::Error),
}

/// What was wrong in a JSON config and where: `disks[0]: unknown field ...`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

/// Most guest RAM, in MiB (1 TiB).
pub const MAX_MEMORY_MIB: u64 = 1 << 20;

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

/// The guest's vsock CID unless the config says otherwise (0-2 are reserved).
pub const DEFAULT_GUEST_CID: u64 = 3;

fn default_cid() -> u64 {
    DEFAULT_GUEST_CID
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
    /// virtio-net, its frames on a Unix socket to the daemon (`crate::net`).
    #[serde(default)]
    pub net: Option<NetConfig>,
    #[serde(default = "default_true")]
    pub rng: bool,
    #[serde(default)]
    pub serial: SerialConfig,
    #[serde(default)]
    pub control_socket: Option<PathBuf>,
    #[serde(default = "default_true")]
    pub seccomp: bool,
}

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
            net: None,
            rng: true,
            serial: SerialConfig::default(),
            control_socket: None,
            seccomp: true,
        }
    }
}

impl VmConfig {
    /// Reads a JSON config file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Read(name.clone(), e))?;
        Self::from_json(&name, &text)
    }

    /// Parses a config; `name` says where it came from in the error. The error names the
    /// field that was wrong (`disks[1].read_only: invalid type ...`).
    pub fn from_json(name: &str, text: &str) -> Result<Self, Error> {
        let err = |msg: String| Error::Parse(name.to_owned(), JsonError(msg));
        let mut de = serde_json::Deserializer::from_str(text);
        let config: Self =
            serde_path_to_error::deserialize(&mut de).map_err(|e| err(e.to_string()))?;
        // Trailing data after the object is an error too.
        de.end().map_err(|e| err(e.to_string()))?;
        Ok(config)
    }

    /// The config as the JSON the VMM reads.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing cannot fail.
        serde_json::to_string_pretty(self).expect("VmConfig serializes")
    }

    /// Number of virtio-mmio devices this config creates.
    pub fn virtio_device_count(&self) -> usize {
        self.disks.len()
            + usize::from(self.vsock.is_some())
            + usize::from(self.net.is_some())
            + usize::from(self.rng)
    }

    /// Checks the values alone, without the filesystem: what the daemon can check before it
    /// writes a config.
    pub fn validate_values(&self) -> Result<(), Error> {
        if self.kernel.is_none() {
            return Err(Error::NoKernel);
        }
        self.validate_values_without_kernel()
    }

    /// `validate_values` for a VM restored from a snapshot, which boots no kernel.
    pub fn validate_values_without_kernel(&self) -> Result<(), Error> {
        if self.memory_mib == 0 || self.memory_mib > MAX_MEMORY_MIB {
            return Err(Error::Memory(self.memory_mib));
        }
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(Error::Vcpus {
                got: self.vcpus,
                max: MAX_VCPUS,
            });
        }
        if self.virtio_device_count() > MAX_VIRTIO_DEVICES {
            return Err(Error::TooManyDevices(
                self.virtio_device_count(),
                MAX_VIRTIO_DEVICES,
            ));
        }
        if let Some(v) = &self.vsock
            && (v.guest_cid < 3 || v.guest_cid > u64::from(u32::MAX))
        {
            return Err(Error::Cid(v.guest_cid));
        }
        if let Some(n) = &self.net {
            n.validate()?;
        }
        Ok(())
    }

    /// Checks the config against the filesystem without starting anything: the kernel can be
    /// read and every disk opened the way the VMM will open it.
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
        self.validate_values()?;
        self.validate_disks()
    }

    /// `validate` for a VM restored from a snapshot: no kernel, the disks must open.
    pub fn validate_for_restore(&self) -> Result<(), Error> {
        self.validate_values_without_kernel()?;
        self.validate_disks()
    }

    fn validate_disks(&self) -> Result<(), Error> {
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

    /// The full error text, sources included, as `belljar-vmm` prints it (`{e:#}`).
    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut src = e.source();
        while let Some(inner) = src {
            s.push_str(": ");
            s.push_str(&inner.to_string());
            src = inner.source();
        }
        s
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
            "net": {"socket": "/s/net.sock", "mac": "02:62:6a:00:00:02", "mtu": 1500},
            "rng": true,
            "serial": {"log": "/s/console.log", "echo": false},
            "control_socket": "/s/vmm.sock",
            "seccomp": true
        }"#;
        let c = VmConfig::from_json("vm.json", json).unwrap();
        assert_eq!(c.vcpus, 2);
        assert!(c.disks[0].read_only && !c.disks[1].read_only);
        assert_eq!(c.vsock.as_ref().unwrap().guest_cid, 3);
        assert_eq!(c.net.as_ref().unwrap().mac.to_string(), "02:62:6a:00:00:02");
        assert_eq!(c.virtio_device_count(), 5);
    }

    #[test]
    fn a_config_round_trips_through_its_json() {
        let c = VmConfig {
            kernel: Some("/k/vmlinux".into()),
            boot: BootMode::Raw,
            memory_mib: 64,
            vcpus: 3,
            disks: vec![DiskConfig {
                path: "/d".into(),
                read_only: true,
                id: "root".into(),
            }],
            vsock: Some(VsockConfig {
                guest_cid: 9,
                uds_path: "/v.sock".into(),
            }),
            net: Some(NetConfig {
                socket: "/n.sock".into(),
                mac: crate::net::MacAddr([2, 0, 0, 0, 0, 7]),
                mtu: 9000,
            }),
            rng: false,
            serial: SerialConfig {
                log: Some("/c.log".into()),
                echo: true,
            },
            control_socket: Some("/vmm.sock".into()),
            seccomp: false,
            ..Default::default()
        };
        assert_eq!(VmConfig::from_json("x", &c.to_json()).unwrap(), c);
        // Defaults fill what a minimal config leaves out.
        let min = VmConfig::from_json("x", r#"{"kernel":"/k"}"#).unwrap();
        assert_eq!(min.cmdline, DEFAULT_CMDLINE);
        assert_eq!(
            (min.memory_mib, min.vcpus, min.rng, min.seccomp),
            (256, 1, true, true)
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = VmConfig::from_json("vm.json", r#"{"kernal": "/k"}"#).unwrap_err();
        assert!(
            chain(&e).contains("unknown field `kernal`"),
            "{}",
            chain(&e)
        );
        let e = VmConfig::from_json(
            "vm.json",
            r#"{"kernel": "/k", "disks": [{"path": "/d", "readonly": true}]}"#,
        )
        .unwrap_err();
        let text = chain(&e);
        assert!(
            text.starts_with("Invalid config file vm.json: disks[0]"),
            "{text}"
        );
        assert!(text.contains("readonly"), "{text}");
    }

    #[test]
    fn bad_values_name_their_field() {
        let e = VmConfig::from_json("vm.json", r#"{"kernel": "/k", "vcpus": 300}"#).unwrap_err();
        let text = chain(&e);
        assert!(
            text.starts_with("Invalid config file vm.json: vcpus"),
            "{text}"
        );
        let e = VmConfig::from_json("vm.json", r#"{"kernel": "/k", "boot": "efi"}"#).unwrap_err();
        assert!(
            chain(&e).contains("boot: unknown variant `efi`"),
            "{}",
            chain(&e)
        );
        let e = VmConfig::from_json(
            "vm.json",
            r#"{"kernel": "/k", "net": {"socket": "/n", "mac": "ff:ff:ff:ff:ff"}}"#,
        )
        .unwrap_err();
        let text = chain(&e);
        assert!(text.contains("net.mac: Invalid MAC address"), "{text}");
        let c = VmConfig::from_json(
            "vm.json",
            r#"{"kernel": "/k", "net": {"socket": "/n", "mac": "ff:ff:ff:ff:ff:ff"}}"#,
        )
        .unwrap();
        assert_eq!(
            chain(&c.validate_values().unwrap_err()),
            "Invalid network settings: MAC address ff:ff:ff:ff:ff:ff is not a unicast address"
        );
        let e = VmConfig::from_json("vm.json", r#"{"kernel": "/k"} {}"#).unwrap_err();
        assert!(matches!(e, Error::Parse(..)));
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
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "Memory size must be at least 1 MiB (got 0 MiB)"
        );
        let mut c = with_kernel(&dir);
        c.vcpus = 0;
        assert!(matches!(c.validate(), Err(Error::Vcpus { .. })));
        c.vcpus = MAX_VCPUS + 1;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "vCPU count must be between 1 and 32 (got 33)"
        );
        let mut c = with_kernel(&dir);
        c.vsock = Some(VsockConfig {
            guest_cid: 2,
            uds_path: "/v".into(),
        });
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "Vsock guest CID must be 3 or more (got 2)"
        );
        let mut c = with_kernel(&dir);
        c.disks = vec![
            DiskConfig {
                path: dir.path().join("vmlinux"),
                read_only: true,
                id: String::new(),
            };
            MAX_VIRTIO_DEVICES
        ];
        assert!(matches!(
            c.validate(),
            Err(Error::TooManyDevices(n, MAX_VIRTIO_DEVICES)) if n == MAX_VIRTIO_DEVICES + 1
        ));
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

    #[test]
    fn values_are_checked_without_the_filesystem() {
        let c = VmConfig {
            kernel: Some("/nowhere/vmlinux".into()),
            ..Default::default()
        };
        c.validate_values().unwrap();
        assert!(matches!(c.validate(), Err(Error::Kernel(..))));
    }
}
