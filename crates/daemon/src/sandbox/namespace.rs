//! The `namespace` backend through `belljar-namespace`: the image tree as an overlay root,
//! the agent as PID 1 of a user/mount/PID/net/UTS/IPC/cgroup namespace sandbox, limits in
//! cgroups. Weaker isolation than a microVM (one shared kernel), and said so.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use belljar_api::{Backend as BackendKind, LimitState, LimitsReport, SandboxUsage};
use belljar_namespace as ns;

use super::backend::{
    AgentAddress, BackendDriver, BackendError, CapturedLayer, LaunchSpec, Launched, MountSpec,
    Probe, Step,
};

/// PIDs a sandbox may have, so that a fork bomb stays inside it.
pub const PIDS_LIMIT: u64 = 8192;

/// Starts the pool of blank disks of `mib` (see `belljar_namespace::disk_pool`) in `dir`, which
/// is on the sandboxes' filesystem, and makes the launches here take from it; none when
/// `depth` is 0, the backend is unavailable, or the daemon is not root (no disks then).
pub fn start_disk_pool(
    dir: &Path,
    mib: u64,
    depth: u8,
    backend: &dyn BackendDriver,
) -> Option<ns::disk_pool::DiskPool> {
    if depth == 0 || !backend.probe().available || !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    match ns::disk_pool::DiskPool::start(dir, mib << 20, usize::from(depth)) {
        Ok(pool) => {
            pool.install();
            Some(pool)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no pool of blank disks: each start makes its own");
            None
        }
    }
}

#[derive(Default)]
pub struct Namespace {
    probe: OnceLock<Probe>,
}

fn limit_state(s: &ns::LimitStatus) -> LimitState {
    match s {
        ns::LimitStatus::Enforced { how } => LimitState {
            enforced: true,
            detail: how.clone(),
        },
        ns::LimitStatus::NotEnforced { reason } => LimitState {
            enforced: false,
            detail: reason.clone(),
        },
        ns::LimitStatus::NotRequested => LimitState {
            enforced: false,
            detail: "not requested".into(),
        },
    }
}

fn launched(r: &ns::Running) -> Launched {
    Launched {
        agent: AgentAddress::Unix(r.socket.clone()),
        limits: LimitsReport {
            memory: limit_state(&r.limits.memory),
            cpu: limit_state(&r.limits.cpu),
            pids: limit_state(&r.limits.pids),
            disk: limit_state(&r.limits.disk),
        },
    }
}

impl BackendDriver for Namespace {
    fn kind(&self) -> BackendKind {
        BackendKind::Namespace
    }

    fn probe(&self) -> Probe {
        self.probe
            .get_or_init(|| {
                let p = ns::probe();
                Probe {
                    available: p.available,
                    reason: p.reason,
                }
            })
            .clone()
    }

    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, BackendError> {
        let ns_id = spec.id.replace('_', "-");
        let rootfs = if nix::unistd::Uid::effective().is_root() {
            spec.image_dir.join("rootfs")
        } else {
            // Root built the image: this user's sandboxes need a copy owned by their own ids.
            ns::usertree::user_tree(&spec.image_dir, &rootless_tree_cache())
                .map_err(|e| BackendError::Namespace(Step::Launch, e.into()))?
        };
        let spec = ns::SandboxSpec {
            id: ns_id.clone(),
            rootfs,
            layers: spec.layers.clone(),
            state_dir: spec.state_dir.clone(),
            agent: spec.agent.clone(),
            hostname: ns_id,
            limits: ns::Limits {
                memory_bytes: Some(spec.memory_mib << 20),
                cpu: Some(f64::from(spec.vcpus)),
                pids: Some(PIDS_LIMIT),
                disk_bytes: Some(spec.disk_mib << 20),
            },
            env: spec.agent_env.clone(),
            mounts: spec.mounts.iter().map(layer_mount).collect(),
            binds: spec.binds.clone(),
            durable: spec.durable,
        };
        ns::launch(&spec)
            .map(|r| launched(&r))
            .map_err(|e| BackendError::Namespace(Step::Launch, e))
    }

    fn adopt(&self, state_dir: &Path) -> Result<Option<Launched>, BackendError> {
        if !state_dir.exists() {
            return Ok(None);
        }
        ns::adopt(state_dir)
            .map(|r| r.as_ref().map(launched))
            .map_err(|e| BackendError::Namespace(Step::Adopt, e))
    }

    fn exit_watch(&self, state_dir: &Path) -> Result<Option<ns::ExitWatch>, BackendError> {
        if !state_dir.exists() {
            return Ok(None);
        }
        ns::ExitWatch::for_sandbox(state_dir).map_err(|e| BackendError::Namespace(Step::Watch, e))
    }

    /// The kernel's own counts in the sandbox's cgroups, read from the host's hierarchy: no
    /// process can write a count, and the sandbox's `/sys` is read-only, so it cannot lift
    /// the limit either.
    fn usage(&self, state_dir: &Path) -> Result<Option<SandboxUsage>, BackendError> {
        match ns::usage(state_dir) {
            Ok(u) => Ok(Some(sandbox_usage(u, crate::util::now_ms()))),
            Err(ns::Error::NotRunning) => Ok(None),
            Err(e) => Err(BackendError::Namespace(Step::Measure, e)),
        }
    }

    fn stop(&self, state_dir: &Path, grace: Duration) -> Result<(), BackendError> {
        if !state_dir.exists() {
            return Ok(());
        }
        ns::stop(state_dir, grace).map_err(|e| BackendError::Namespace(Step::Stop, e))
    }

    fn destroy(&self, state_dir: &Path) -> Result<(), BackendError> {
        if !state_dir.exists() {
            return Ok(());
        }
        ns::destroy(state_dir).map_err(|e| BackendError::Namespace(Step::Destroy, e))
    }

    fn agent_address(&self, state_dir: &Path) -> AgentAddress {
        AgentAddress::Unix(state_dir.join(ns::AGENT_SOCKET))
    }

    fn capture_dir(
        &self,
        state_dir: &Path,
        path: &str,
        layers_dir: &Path,
    ) -> Result<CapturedLayer, BackendError> {
        ns::layer::capture_dir(state_dir, path, layers_dir)
            .map(|c| CapturedLayer {
                digest: c.digest,
                size_bytes: c.size_bytes,
            })
            .map_err(BackendError::Directory)
    }

    fn capture(&self, state_dir: &Path, layers_dir: &Path) -> Result<CapturedLayer, BackendError> {
        ns::layer::capture(state_dir, layers_dir)
            .map(|c| CapturedLayer {
                digest: c.digest,
                size_bytes: c.size_bytes,
            })
            .map_err(BackendError::Capture)
    }

    fn capture_mounts(
        &self,
        state_dir: &Path,
        slots: &[usize],
        layers_dir: &Path,
    ) -> Result<Vec<CapturedLayer>, BackendError> {
        slots
            .iter()
            .map(|slot| {
                ns::layer::capture_mount(state_dir, *slot, layers_dir)
                    .map(|c| CapturedLayer {
                        digest: c.digest,
                        size_bytes: c.size_bytes,
                    })
                    .map_err(BackendError::Capture)
            })
            .collect()
    }

    fn mount_live(&self, state_dir: &Path, mount: &MountSpec) -> Result<(), BackendError> {
        ns::live_mounts::mount(state_dir, &layer_mount(mount)).map_err(BackendError::Mount)
    }

    fn unmount_live(&self, state_dir: &Path, slot: usize, path: &str) -> Result<(), BackendError> {
        ns::live_mounts::unmount(state_dir, slot, Path::new(path)).map_err(BackendError::Mount)
    }

    fn freeze(&self, state_dir: &Path) -> Result<(), BackendError> {
        ns::freeze(state_dir).map_err(freeze_error)
    }

    fn thaw(&self, state_dir: &Path) -> Result<(), BackendError> {
        ns::thaw(state_dir).map_err(|e| BackendError::Namespace(Step::Thaw, e))
    }
}

fn sandbox_usage(u: ns::cgroup::Usage, measured_at: i64) -> SandboxUsage {
    SandboxUsage {
        memory_bytes: u.memory_bytes,
        memory_peak_bytes: u.memory_peak_bytes,
        memory_limit_bytes: u.memory_limit_bytes,
        cpu_usec: u.cpu_usec,
        pids: u.pids,
        oom_kills: u.oom_kills,
        pids_denied: u.pids_denied,
        measured_at,
    }
}

fn layer_mount(m: &MountSpec) -> ns::LayerMount {
    ns::LayerMount {
        layers: m.layers.clone(),
        path: m.path.clone().into(),
        slot: m.slot,
    }
}

/// Where a rootless daemon keeps its users' copies of images (see `belljar_namespace::usertree`):
/// the user's cache, not `BELLJAR_HOME`, so that every daemon of the user (tests start many)
/// makes each copy once, and not the image cache, which root wrote.
fn rootless_tree_cache() -> std::path::PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("belljar-rootless")
}

/// A sandbox without a freezer is [`BackendError::NoFreezer`] (the API's `not_supported`);
/// any other failure to freeze is one.
fn freeze_error(e: ns::Error) -> BackendError {
    match e {
        ns::Error::Cgroup(e @ ns::cgroup::Error::NoFreezer) => BackendError::NoFreezer(e),
        other => BackendError::Namespace(Step::Freeze, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rootless daemon on cgroup v1 makes sandboxes without a freezer: pausing one answered
    /// 500 `internal` ("The sandbox has no freezer cgroup"); it is a limit of the host.
    #[test]
    fn a_sandbox_without_a_freezer_is_not_supported_not_a_failure() {
        let e = freeze_error(ns::Error::Cgroup(ns::cgroup::Error::NoFreezer));
        assert!(
            matches!(e, BackendError::NoFreezer(ns::cgroup::Error::NoFreezer)),
            "{e:?}"
        );
        assert!(e.to_string().contains("cgroup v2"), "{e}");
        // One sentence, not a capitalised one inside another ("...: The sandbox has...").
        assert!(
            e.to_string().starts_with("The sandbox has no freezer"),
            "{e}"
        );
        let other = freeze_error(ns::Error::Spec("x".into()));
        assert!(
            matches!(other, BackendError::Namespace(Step::Freeze, _)),
            "{other:?}"
        );
        assert_eq!(
            crate::util::error_chain(&other),
            "Freezing the sandbox failed: Invalid sandbox spec: x"
        );
    }

    /// A sandbox that ended (or never started here) has no usage: `None`, which the daemon
    /// answers as "not running", not a failure to measure.
    #[test]
    fn a_sandbox_that_does_not_run_has_no_usage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Namespace::default().usage(dir.path()).unwrap(), None);
        assert_eq!(
            Namespace::default()
                .usage(&dir.path().join("gone"))
                .unwrap(),
            None
        );
    }
}
