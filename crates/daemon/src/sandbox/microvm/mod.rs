//! The `microvm` backend: one `belljar-vmm` process per sandbox on hardware KVM.
//!
//! The probe decides whether microVMs are usable at all, which is what `auto` needs. A microVM
//! is usable only with `/dev/kvm` that this user can open, a CPU with
//! the `vmx` or `svm` flag, KVM that is not the software PVM flavour (which runs guest kernel
//! code emulated, far too slowly for a Linux guest), and a tiny probe guest that finishes fast,
//! run by `belljar-vmm` ([`probe_code`]). The host-side facts and verdict live in
//! `belljar_vmm_api::host`, shared with `belljar doctor`. Each sandbox is one `belljar-vmm`
//! process ([`vmm`]).

pub(super) mod dirs;
pub(super) mod layers;
pub mod vmm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use belljar_api::{Backend as BackendKind, LimitState, LimitsReport, SandboxUsage};
use belljar_vmm_api::ExitReason;
use belljar_vmm_api::config::{BootMode, VmConfig};
use belljar_vmm_api::host::{HostFacts, host_verdict};

use super::backend::{
    AgentAddress, BackendDriver, BackendError, CapturedLayer, ExitWatch, LaunchSpec, Launched,
    Probe, Step,
};

pub struct Microvm {
    vmm: Option<PathBuf>,
    kernel: Option<PathBuf>,
    force_for_testing: bool,
}

impl Microvm {
    /// `vmm` is the `belljar-vmm` binary and `kernel` the guest kernel, when found.
    pub fn new(vmm: Option<PathBuf>, kernel: Option<PathBuf>) -> Self {
        Self {
            vmm,
            kernel,
            force_for_testing: false,
        }
    }

    /// Accepts explicit `--backend microvm` requests even when the speed probe fails, as long
    /// as KVM itself is there (`belljard --testing-force-microvm`, for the nested-KVM test
    /// harness `scripts/test-microvm.sh`). What `auto` picks does not change.
    pub fn force_for_testing(mut self, force: bool) -> Self {
        self.force_for_testing = force;
        self
    }

    /// Boots a tiny raw guest that loops a million times in kernel mode, writes to its
    /// memory and resets through the i8042 (exit status 10). Hardware KVM finishes in a few
    /// milliseconds; software virtualization (PVM) needs seconds and fails the time limit.
    fn probe_guest(&self) -> Result<(), ProbeFailure> {
        let vmm = self.vmm.as_ref().ok_or(ProbeFailure::NoVmm)?;
        let dir = tempfile::tempdir().map_err(ProbeFailure::Scratch)?;
        let code = dir.path().join("probe.bin");
        std::fs::write(&code, probe_code(1_000_000)).map_err(ProbeFailure::Scratch)?;
        let config = dir.path().join("probe.json");
        let vm = VmConfig {
            kernel: Some(code),
            boot: BootMode::Raw,
            memory_mib: 16,
            vcpus: 1,
            rng: false,
            ..Default::default()
        };
        std::fs::write(&config, vm.to_json()).map_err(ProbeFailure::Scratch)?;
        let mut child = Command::new(vmm)
            .arg("--config")
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| ProbeFailure::Spawn(vmm.clone(), e))?;
        let deadline = std::time::Instant::now() + PROBE_LIMIT;
        loop {
            match child.try_wait() {
                Ok(Some(status))
                    if ExitReason::from_exit_code(status.code()) == Some(ExitReason::Reset) =>
                {
                    return Ok(());
                }
                Ok(Some(status)) => return Err(ProbeFailure::Failed(status)),
                Ok(None) if std::time::Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ProbeFailure::TooSlow);
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(ProbeFailure::Wait(e)),
            }
        }
    }
}

/// Why the tiny probe guest did not show working hardware virtualization.
#[derive(Debug, thiserror::Error)]
enum ProbeFailure {
    #[error("belljar-vmm was not found (set BELLJAR_VMM)")]
    NoVmm,
    #[error("cannot write the probe guest's files")]
    Scratch(#[source] std::io::Error),
    #[error("cannot run {}", .0.display())]
    Spawn(PathBuf, #[source] std::io::Error),
    #[error("cannot wait for the tiny probe guest")]
    Wait(#[source] std::io::Error),
    #[error("the tiny probe guest failed ({0})")]
    Failed(std::process::ExitStatus),
    #[error(
        "the tiny probe guest did not finish in {PROBE_LIMIT:?}: KVM here runs guest kernel code too slowly"
    )]
    TooSlow,
}

/// How long the probe guest may take; hardware KVM needs a few milliseconds.
const PROBE_LIMIT: Duration = Duration::from_millis(1500);

/// Flat 64-bit code: `loops` iterations of `dec ecx; jnz`, a store to guest memory, then an
/// i8042 reset (`out 0x64, 0xfe`), which `belljar-vmm` reports as [`ExitReason::Reset`].
pub fn probe_code(loops: u32) -> Vec<u8> {
    let mut code = vec![0xB9];
    code.extend_from_slice(&loops.to_le_bytes());
    code.extend_from_slice(&[0xFF, 0xC9, 0x75, 0xFC]);
    code.extend_from_slice(&[0xC7, 0x04, 0x25]);
    code.extend_from_slice(&0x0020_0000u32.to_le_bytes());
    code.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    code.extend_from_slice(&[0xB0, 0xFE, 0xE6, 0x64, 0xF4]);
    code
}

/// A microVM's limits are the hypervisor's: its RAM and vCPUs are all it has.
fn launched(state_dir: &Path) -> Launched {
    let hv = |detail: &str| LimitState {
        enforced: true,
        detail: detail.to_owned(),
    };
    Launched {
        agent: AgentAddress::HybridVsock {
            socket: state_dir.join("vsock.sock"),
            port: belljar_agent_proto::AGENT_VSOCK_PORT,
        },
        limits: LimitsReport {
            memory: hv("hypervisor (guest RAM)"),
            cpu: hv("hypervisor (vCPUs)"),
            pids: hv("the guest kernel's own limit"),
            disk: hv("hypervisor (size of the writable layer's disk)"),
        },
    }
}

impl BackendDriver for Microvm {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn probe(&self) -> Probe {
        let verdict = host_verdict(&HostFacts::gather())
            .map_err(|e| e.to_string())
            .and_then(|flag| {
                self.probe_guest()
                    .map(|()| format!("KVM with hardware virtualization ({flag})"))
                    .map_err(|e| crate::util::error_chain(&e))
            });
        match verdict {
            Ok(reason) => Probe {
                available: true,
                reason,
            },
            Err(reason) => Probe {
                available: false,
                reason,
            },
        }
    }

    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, BackendError> {
        // Each snapshot mount takes one disk; the sandbox's own chain gets what is left.
        let mounts = spec
            .mounts
            .iter()
            .map(|m| {
                Ok(vmm::VmMount {
                    slot: m.slot,
                    disk: layers::mount_disk(&m.layers).map_err(BackendError::LayerDisks)?,
                    path: m.path.clone(),
                })
            })
            .collect::<Result<Vec<_>, BackendError>>()?;
        let lower_disks = layers::layer_disks_within(
            &spec.layers,
            layers::MAX_LAYER_DISKS.saturating_sub(mounts.len()),
        )
        .map_err(BackendError::LayerDisks)?;
        let err = |e: vmm::VmmError| BackendError::Microvm(Step::Launch, e);
        let vm = vmm::VmSpec {
            vmm: self.vmm.clone().ok_or_else(|| BackendError::Unavailable {
                backend: "microvm",
                reason: "belljar-vmm was not found (set BELLJAR_VMM)".into(),
            })?,
            kernel: self
                .kernel
                .clone()
                .ok_or_else(|| err(vmm::VmmError::NoKernel))?,
            root_disk: spec.image_dir.join("rootfs.ext4"),
            state_dir: spec.state_dir.clone(),
            hostname: spec.id.replace('_', "-"),
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            disk_mib: spec.disk_mib,
            agent_env: spec.agent_env.clone(),
            lower_disks,
            mounts,
        };
        vmm::launch(&vm, crate::util::now_ms()).map_err(err)?;
        Ok(launched(&spec.state_dir))
    }

    fn adopt(&self, state_dir: &Path) -> Result<Option<Launched>, BackendError> {
        Ok(vmm::adopt(state_dir).map(|_| launched(state_dir)))
    }

    fn exit_watch(&self, state_dir: &Path) -> Result<Option<ExitWatch>, BackendError> {
        let Some(proc) = vmm::adopt(state_dir) else {
            return Ok(None);
        };
        ExitWatch::for_process(proc.pid, proc.start_time)
            .map_err(|e| BackendError::Namespace(Step::Watch, e))
    }

    /// The VMM process as the host kernel counts it, and the guest RAM its config gives it.
    /// The VMM's own `metrics` report is not asked: it comes from a process the guest could
    /// have taken over. What only the guest knows (its processes, its OOM kills) is `None`.
    fn usage(&self, state_dir: &Path) -> Result<Option<SandboxUsage>, BackendError> {
        let measured_at = crate::util::now_ms();
        let Some(vmm) =
            vmm::usage(state_dir).map_err(|e| BackendError::Microvm(Step::Measure, e))?
        else {
            return Ok(None);
        };
        let guest_ram = vmm::read_config(state_dir)
            .ok()
            .map(|c| c.memory_mib.saturating_mul(1 << 20));
        Ok(Some(SandboxUsage {
            memory_bytes: vmm.rss_bytes,
            memory_peak_bytes: vmm.peak_rss_bytes,
            memory_limit_bytes: guest_ram,
            cpu_usec: Some(vmm.cpu_usec),
            pids: None,
            oom_kills: None,
            pids_denied: None,
            measured_at,
        }))
    }

    /// Flushes the guest's page cache first (the VMM's stop ends the VM at once), so that the
    /// writable layer's disk holds every write: a snapshot or a persistent sandbox's next
    /// session reads it. A paused VM was flushed when it was paused.
    fn stop(&self, state_dir: &Path, grace: Duration) -> Result<(), BackendError> {
        if vmm::adopt(state_dir).is_some() && !vmm::is_paused(state_dir) {
            let synced = layers::guest_sync(state_dir, layers::SYNC_TIMEOUT);
            if let Err(e) = synced {
                tracing::warn!(dir = %state_dir.display(), error = %crate::util::error_chain(&e), "cannot flush the guest before stopping it");
            }
        }
        vmm::stop(state_dir, grace).map_err(|e| BackendError::Microvm(Step::Stop, e))
    }

    fn destroy(&self, state_dir: &Path) -> Result<(), BackendError> {
        // Its files are deleted: nothing to flush.
        vmm::stop(state_dir, Duration::from_secs(2))
            .map_err(|e| BackendError::Microvm(Step::Stop, e))?;
        match std::fs::remove_dir_all(state_dir) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                Err(BackendError::Microvm(
                    Step::Destroy,
                    vmm::VmmError::Io {
                        what: format!("Cannot remove {}", state_dir.display()),
                        source,
                    },
                ))
            }
            _ => Ok(()),
        }
    }

    fn agent_address(&self, state_dir: &Path) -> AgentAddress {
        AgentAddress::HybridVsock {
            socket: state_dir.join("vsock.sock"),
            port: belljar_agent_proto::AGENT_VSOCK_PORT,
        }
    }

    /// The guest flushes its filesystems, then the VMM pauses every vCPU: the processes stay in
    /// guest memory where they were, and the writable layer's disk is consistent while paused.
    fn freeze(&self, state_dir: &Path) -> Result<(), BackendError> {
        if let Err(e) = layers::guest_sync(state_dir, layers::SYNC_TIMEOUT) {
            tracing::warn!(dir = %state_dir.display(), error = %crate::util::error_chain(&e), "cannot flush the guest before pausing it");
        }
        vmm::pause(state_dir).map_err(|e| BackendError::Microvm(Step::Freeze, e))
    }

    fn thaw(&self, state_dir: &Path) -> Result<(), BackendError> {
        vmm::resume(state_dir).map_err(|e| BackendError::Microvm(Step::Thaw, e))
    }

    fn capture(&self, state_dir: &Path, layers_dir: &Path) -> Result<CapturedLayer, BackendError> {
        layers::DiskCopy::take(state_dir)?.capture(layers_dir)
    }

    /// One copy of the writable disk serves every mount: each one's writes are its
    /// `mounts/<slot>/upper` there (the agent's overlay for it).
    fn capture_mounts(
        &self,
        state_dir: &Path,
        slots: &[usize],
        layers_dir: &Path,
    ) -> Result<Vec<CapturedLayer>, BackendError> {
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        layers::DiskCopy::take(state_dir)?.capture_mounts(slots, layers_dir)
    }

    fn capture_dir(
        &self,
        state_dir: &Path,
        path: &str,
        layers_dir: &Path,
    ) -> Result<CapturedLayer, BackendError> {
        super::microvm::dirs::capture_dir(state_dir, path, layers_dir)
    }

    fn forced_for_testing(&self) -> Option<String> {
        if !self.force_for_testing {
            return None;
        }
        let flag = host_verdict(&HostFacts::gather()).ok()?;
        Some(format!(
            "forced usable for testing by --testing-force-microvm on KVM ({flag})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_code_is_the_expected_machine_code() {
        let code = probe_code(100);
        assert_eq!(&code[..5], &[0xB9, 100, 0, 0, 0]);
        assert_eq!(code.len(), 25);
        assert_eq!(code[code.len() - 1], 0xF4);
    }

    #[test]
    fn this_host_is_described_truthfully() {
        // Whatever the host is, a usable verdict needs KVM and a virtualization flag.
        let f = HostFacts::gather();
        if let Ok(flag) = host_verdict(&f) {
            assert!(f.cpu_flags.contains(flag) && !f.pvm);
        }
    }
}
