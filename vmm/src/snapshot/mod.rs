//! Memory snapshots: pause a running VM, save everything it is (vCPUs, interrupt
//! controllers, timers, clock, devices, guest memory) into a directory, and start a new VMM
//! from that directory where the old one left off.
//!
//! A snapshot is two files: `vmstate` (the checked state file, `format.rs`) and `memory`
//! (raw guest RAM, `memory.rs`). Restoring maps `memory` copy-on-write, so a snapshot
//! restored twice gives two VMs that share every page neither has written: that is fork.
//! Host-side things are not in a snapshot: the restoring VMM's configuration gives the
//! sockets, logs and disk files, and must describe the same VM shape (memory, vCPUs,
//! devices in order). Open vsock connections do not survive (the guest is told so); the
//! disks must hold what they held when the snapshot was taken.

pub mod format;
pub mod memory;

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::builder::{self, BuildOptions, VmShape, Vmm};
use crate::config::VmConfig;
use crate::devices::serial::{self, SerialSaved};
use crate::devices::virtio::mmio::{self, TransportSaved};
use crate::hypervisor::{self, Hypervisor, VcpuSnapshot, VmSnapshot};

/// The state file's name inside a snapshot directory.
pub const STATE_FILE: &str = belljar_vmm_api::control::SNAPSHOT_STATE_FILE;
/// The memory file's name inside a snapshot directory.
pub const MEMORY_FILE: &str = belljar_vmm_api::control::SNAPSHOT_MEMORY_FILE;

/// Errors taking or restoring a snapshot. `code()` is the stable name the VMM reports.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum Error {
    /// {0}
    Format(#[from] format::Error),
    /// {0}
    Memory(#[from] memory::Error),
    /// Snapshot was taken on a {saved} CPU, this host has a {host} CPU
    CpuModel { saved: String, host: String },
    /// Snapshot is of a different VM: {0}
    Shape(String),
    /// Cannot create snapshot file in {0}
    Dir(String, #[source] std::io::Error),
    /// Cannot pause the VM
    Pause(#[source] builder::Error),
    /// The VM has ended; there is nothing to snapshot
    Ended,
    /// Cannot save the vCPUs
    Vcpus(#[from] crate::vcpu::Error),
    /// Hypervisor state
    Hypervisor(#[from] hypervisor::Error),
    /// Cannot rebuild the VM
    Build(#[from] builder::Error),
    /// Cannot restore the serial console
    Serial(#[from] serial::PersistError),
    /// Cannot restore virtio device {0}
    Virtio(String, #[source] mmio::PersistError),
}

impl Error {
    /// The stable code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Format(e) => e.code(),
            Error::Memory(_) => "memory",
            Error::CpuModel { .. } => "cpu_model",
            Error::Shape(_) => "config_mismatch",
            Error::Ended => "vm_ended",
            Error::Dir(..) | Error::Pause(_) | Error::Vcpus(_) => "save_failed",
            Error::Hypervisor(_) | Error::Build(_) | Error::Serial(_) | Error::Virtio(..) => {
                "restore_failed"
            }
        }
    }
}

/// Everything in `vmstate`.
#[derive(Serialize, Deserialize)]
struct Saved {
    cpu_model: String,
    shape: VmShape,
    cmdline: String,
    vm: VmSnapshot,
    vcpus: Vec<VcpuSnapshot>,
    serial: SerialSaved,
    virtio: Vec<TransportSaved>,
}

/// What taking a snapshot cost.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotInfo {
    /// Size of the state file.
    pub state_bytes: u64,
    /// Guest memory bytes written (non-zero pages).
    pub memory_bytes: u64,
    /// From the pause to the files being complete.
    pub elapsed: Duration,
}

/// The host CPU's vendor and model, as `/proc/cpuinfo` names them. A snapshot's vCPUs carry
/// this CPU's features (CPUID, MSRs, XSAVE layout), so another model is refused. Read once
/// (every VM build asks, before the seccomp filter forbids opening files).
pub fn host_cpu_model() -> String {
    static MODEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MODEL.get_or_init(read_cpu_model).clone()
}

fn read_cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    format!(
        "{} family {} model {} ({})",
        field("vendor_id"),
        field("cpu family"),
        field("model"),
        field("model name")
    )
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Vmm {
    /// Saves the VM into `dir` (created if missing). A running VM is paused for the time it
    /// takes and then runs on; a paused one stays paused.
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotInfo, Error> {
        let name = dir.display().to_string();
        std::fs::create_dir_all(dir).map_err(|e| Error::Dir(name.clone(), e))?;
        let create =
            |file: &str| File::create(dir.join(file)).map_err(|e| Error::Dir(name.clone(), e));
        self.snapshot_to(&create(STATE_FILE)?, &create(MEMORY_FILE)?)
    }

    /// `snapshot` into files already open for writing (the control socket's way: the VMM
    /// under its seccomp filter cannot open files).
    pub fn snapshot_to(&self, state: &File, memory: &File) -> Result<SnapshotInfo, Error> {
        if self.exit_reason().is_some() {
            return Err(Error::Ended);
        }
        let started = Instant::now();
        let was_paused = self.pause_requested();
        self.pause().map_err(Error::Pause)?;
        let result = self.snapshot_paused(state, memory, started);
        if !was_paused {
            self.resume();
        }
        result
    }

    fn snapshot_paused(
        &self,
        state: &File,
        memory: &File,
        started: Instant,
    ) -> Result<SnapshotInfo, Error> {
        // Hold every device while saving: the device thread must not move a queue or write
        // guest memory between the device state and the memory being saved.
        let transports: Vec<_> = self.devices.transports.iter().map(|t| lock(t)).collect();
        let devices: Vec<_> = transports.iter().map(|t| lock(t.device())).collect();
        let virtio = transports
            .iter()
            .zip(&devices)
            .map(|(t, d)| t.state(&**d))
            .collect();
        let saved = Saved {
            cpu_model: host_cpu_model(),
            shape: self.shape.clone(),
            cmdline: self.cmdline.clone(),
            vcpus: self.save_vcpus()?,
            vm: self.vm().save_state()?,
            serial: lock(&self.devices.serial).state(),
            virtio,
        };
        // Memory first: a state file that is whole means the snapshot is.
        let memory_bytes = memory::save(self.memory(), memory)?;
        format::write_file(state, &saved)?;
        let state_bytes = state.metadata().map_or(0, |m| m.len());
        Ok(SnapshotInfo {
            state_bytes,
            memory_bytes,
            elapsed: started.elapsed(),
        })
    }

    /// Starts a VM from the snapshot in `dir`, with the host side (sockets, logs, disks)
    /// that `config` gives; its memory, vCPUs and devices must match the snapshot's.
    pub fn restore(config: &VmConfig, hv: &dyn Hypervisor, dir: &Path) -> Result<Arc<Vmm>, Error> {
        let started = Instant::now();
        let saved: Saved = format::read(&dir.join(STATE_FILE))?;
        let host = host_cpu_model();
        if saved.cpu_model != host {
            return Err(Error::CpuModel {
                saved: saved.cpu_model,
                host,
            });
        }
        if (config.memory_mib, config.vcpus) != (saved.shape.memory_mib, saved.shape.vcpus) {
            return Err(Error::Shape(format!(
                "it has {} MiB and {} vCPUs, the configuration {} MiB and {} vCPUs",
                saved.shape.memory_mib, saved.shape.vcpus, config.memory_mib, config.vcpus
            )));
        }
        if saved.vcpus.len() != usize::from(saved.shape.vcpus) {
            return Err(Error::Shape(
                "vCPU states do not match the vCPU count".into(),
            ));
        }
        let ranges = crate::memory::ram_ranges(saved.shape.memory_mib << 20);
        let mem = memory::restore(&dir.join(MEMORY_FILE), &ranges)?;
        let opts = BuildOptions {
            irqchip: saved.shape.irqchip,
        };
        let parts = builder::assemble(config, hv, opts, mem, started)?;
        if parts.shape != saved.shape {
            return Err(Error::Shape(format!(
                "its devices are {:?}, the configuration's {:?}",
                saved.shape.devices, parts.shape.devices
            )));
        }
        parts.vm.restore_state(&saved.vm)?;
        lock(&parts.devices.serial).restore(&saved.serial)?;
        for ((t, s), name) in parts
            .devices
            .transports
            .iter()
            .zip(&saved.virtio)
            .zip(&saved.shape.devices)
        {
            lock(t)
                .restore(s)
                .map_err(|e| Error::Virtio(name.clone(), e))?;
        }
        let mut vcpus = Vec::with_capacity(saved.vcpus.len());
        for (id, state) in (0..saved.shape.vcpus).zip(&saved.vcpus) {
            let mut vcpu = parts.vm.create_vcpu(id, saved.shape.vcpus)?;
            vcpu.restore_state(state)?;
            vcpus.push(vcpu);
        }
        let vmm = builder::launch(parts, vcpus, saved.cmdline)?;
        tracing::info!(elapsed = ?started.elapsed(), "VM restored");
        Ok(vmm)
    }
}
