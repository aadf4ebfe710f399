//! The one trait every sandbox backend implements, and how `auto` picks one.
//!
//! Backend calls block (they fork, mount, wait for processes), so the daemon runs them on
//! tokio's blocking pool. Everything a backend needs to find a sandbox again after a daemon
//! restart lives in the sandbox's state directory, never in the daemon's memory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use belljar_api::{Backend as BackendKind, BackendChoice, BackendInfo, LimitsReport, SandboxUsage};
pub use belljar_namespace::ExitWatch;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot run on this host.
    #[error("The {backend} backend is unavailable: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
    /// The sandbox ended before its agent answered; `output` is the end of what it printed
    /// (console, agent log, VMM log).
    #[error(
        "The sandbox ended before its agent answered{}",
        output.as_deref().map(|o| format!("; its last output:\n{o}")).unwrap_or_default()
    )]
    Ended { output: Option<String> },
    /// The sandbox could not be killed.
    #[error("Cannot kill the sandbox")]
    Kill(#[source] std::io::Error),
    /// A namespace sandbox could not be started, found, watched, measured, frozen, thawed,
    /// stopped or deleted (also a microVM's exit watch, which is the namespace crate's).
    #[error("{0} the sandbox failed")]
    Namespace(Step, #[source] belljar_namespace::Error),
    /// A microVM could not be started, measured, paused, resumed, stopped or deleted.
    #[error("{0} the microVM failed")]
    Microvm(Step, #[source] super::microvm::vmm::VmmError),
    /// This backend cannot do that (yet).
    #[error("The {backend} backend cannot {what} yet")]
    Unsupported {
        backend: &'static str,
        what: &'static str,
    },
    /// A namespace sandbox's writes (its writable layer, or a snapshot mount's) could not be
    /// read or copied into a snapshot layer.
    #[error("Capturing the sandbox's files failed")]
    Capture(#[source] belljar_namespace::layer::Error),
    /// A microVM's writable disk could not be copied and read for a snapshot.
    #[error("Capturing the microVM's files failed")]
    MicrovmCapture(#[source] super::microvm::layers::Error),
    /// The disks a microVM starts from (its snapshot layers and mounts) could not be made.
    #[error("Making the microVM's snapshot disks failed")]
    LayerDisks(#[source] super::microvm::layers::Error),
    /// The sandbox has no freezer (a rootless daemon on cgroup v1, or without delegation), so
    /// it cannot be paused, forked or snapshotted while it runs: a limit of this host, not a
    /// failure. Its message is the host's reason, a sentence of its own.
    #[error(transparent)]
    NoFreezer(belljar_namespace::cgroup::Error),
    /// A directory of the sandbox could not be captured.
    #[error(transparent)]
    Directory(belljar_namespace::layer::DirError),
    /// A snapshot could not be mounted into (or unmounted from) the running sandbox.
    #[error(transparent)]
    Mount(belljar_namespace::live_mounts::LiveError),
}

impl BackendError {
    /// Whether a capture stopped at the sandbox's disk size
    /// ([`belljar_namespace::layer::Error::TooLarge`]).
    pub fn is_too_large(&self) -> bool {
        use belljar_namespace::layer::Error;
        matches!(
            self,
            BackendError::Capture(Error::TooLarge { .. })
                | BackendError::MicrovmCapture(super::microvm::layers::Error::Layer(
                    Error::TooLarge { .. }
                ))
        )
    }
}

/// A snapshot layer a backend captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedLayer {
    /// Its content address, also its directory name in the layers directory.
    pub digest: String,
    pub size_bytes: u64,
}

/// Which step of a sandbox's life failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display)]
pub enum Step {
    #[strum(to_string = "Launching")]
    Launch,
    #[strum(to_string = "Finding")]
    Adopt,
    #[strum(to_string = "Watching")]
    Watch,
    #[strum(to_string = "Measuring")]
    Measure,
    #[strum(to_string = "Freezing")]
    Freeze,
    #[strum(to_string = "Thawing")]
    Thaw,
    #[strum(to_string = "Stopping")]
    Stop,
    #[strum(to_string = "Deleting")]
    Destroy,
}

/// How the daemon reaches a sandbox's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAddress {
    /// The agent listens on this Unix socket (namespace backend).
    Unix(PathBuf),
    /// The VMM's hybrid vsock socket; connect with `CONNECT <port>`.
    HybridVsock { socket: PathBuf, port: u32 },
}

/// Everything a backend needs to start one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSpec {
    /// The sandbox id (`sbx_...`).
    pub id: String,
    /// The sandbox's own directory for backend state.
    pub state_dir: PathBuf,
    /// The image directory (`<cache>/images/<name>/current`).
    pub image_dir: PathBuf,
    /// The agent binary on the host, when the backend injects it.
    pub agent: PathBuf,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_mib: u64,
    /// Extra environment for the agent.
    pub agent_env: Vec<(String, String)>,
    /// Snapshot layer directories stacked on the image, topmost first.
    pub layers: Vec<PathBuf>,
    /// Directory snapshots mounted at paths of the sandbox.
    pub mounts: Vec<MountSpec>,
    /// Host folders and volumes, opened for this launch (namespace backend).
    pub binds: Vec<belljar_namespace::host_mounts::BindMount>,
    /// Whether the sandbox's writes must keep their syncs (a persistent sandbox: its files
    /// outlive it); a disposable one skips them where the backend can.
    pub durable: bool,
}

/// A directory snapshot mounted at a path of the sandbox (copy-on-write).
#[derive(Debug, Clone, PartialEq)]
pub struct MountSpec {
    /// Layer directories, topmost first.
    pub layers: Vec<PathBuf>,
    /// Absolute path in the sandbox.
    pub path: String,
    /// Names the mount's directories in the sandbox's state (stable across starts).
    pub slot: usize,
}

/// A sandbox that runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Launched {
    pub agent: AgentAddress,
    pub limits: LimitsReport,
}

/// Whether a backend can run here, and why (not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub available: bool,
    pub reason: String,
}

/// One way to run sandboxes (the API's `Backend` names which). All methods block.
pub trait BackendDriver: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// Whether the backend can run on this host; cheap after the first call.
    fn probe(&self) -> Probe;
    /// Starts the sandbox; returns once its agent has been started (it may not listen yet).
    fn launch(&self, spec: &LaunchSpec) -> Result<Launched, BackendError>;
    /// Finds the sandbox again after a daemon restart; `None` when it no longer runs.
    fn adopt(&self, state_dir: &Path) -> Result<Option<Launched>, BackendError>;
    /// Whether the sandbox still runs.
    fn alive(&self, state_dir: &Path) -> bool {
        matches!(self.adopt(state_dir), Ok(Some(_)))
    }
    /// A pidfd on the process whose end is the sandbox's end (PID 1, or the VMM), so that
    /// the daemon can wait for it instead of polling; `None` when the sandbox does not run.
    fn exit_watch(&self, state_dir: &Path) -> Result<Option<ExitWatch>, BackendError>;
    /// What the running or paused sandbox uses now, as the host measures it (never as the
    /// sandbox reports it), without waking it; `None` when it does not run.
    fn usage(&self, state_dir: &Path) -> Result<Option<SandboxUsage>, BackendError>;
    /// Stops the sandbox: a graceful end, then a forced one after `grace`.
    fn stop(&self, state_dir: &Path, grace: Duration) -> Result<(), BackendError>;
    /// Stops the sandbox if needed and deletes its writable layer and state.
    fn destroy(&self, state_dir: &Path) -> Result<(), BackendError>;
    /// Where the sandbox's agent listens.
    fn agent_address(&self, state_dir: &Path) -> AgentAddress;
    /// Copies the sandbox's writable layer into `layers_dir/<digest>`; the sandbox must be
    /// stopped or frozen.
    fn capture(
        &self,
        _state_dir: &Path,
        _layers_dir: &Path,
    ) -> Result<CapturedLayer, BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "snapshot a sandbox",
        })
    }
    /// Copies directory `path` of the running, frozen sandbox into `layers_dir/<digest>`.
    fn capture_dir(
        &self,
        _state_dir: &Path,
        _path: &str,
        _layers_dir: &Path,
    ) -> Result<CapturedLayer, BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "snapshot a directory",
        })
    }
    /// Copies the sandbox's writes under each of its snapshot mounts `slots` into
    /// `layers_dir/<digest>`, in the order of `slots`; the sandbox must be stopped or frozen.
    fn capture_mounts(
        &self,
        _state_dir: &Path,
        _slots: &[usize],
        _layers_dir: &Path,
    ) -> Result<Vec<CapturedLayer>, BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "snapshot mounts",
        })
    }
    /// Mounts a directory snapshot into the running sandbox.
    fn mount_live(&self, _state_dir: &Path, _mount: &MountSpec) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "mount snapshots",
        })
    }
    /// Unmounts the mount of `slot` at `path` (if the sandbox runs) and discards the
    /// sandbox's writes under it.
    fn unmount_live(
        &self,
        _state_dir: &Path,
        _slot: usize,
        _path: &str,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "unmount snapshots",
        })
    }
    /// Stops every process of the sandbox where it is, keeping its memory.
    fn freeze(&self, _state_dir: &Path) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "freeze a sandbox",
        })
    }
    /// Lets a frozen sandbox run again.
    fn thaw(&self, _state_dir: &Path) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.kind().into(),
            what: "thaw a sandbox",
        })
    }
    /// `Some(reason)` when this backend is forced usable for testing despite a failed probe
    /// (the microVM harness on nested KVM, whose speed the probe rightly rejects). Only an
    /// explicit request for the backend honours it; `auto` always follows the probe.
    fn forced_for_testing(&self) -> Option<String> {
        None
    }
}

/// The backends of this daemon, probed once at start.
pub struct Backends {
    all: Vec<(Box<dyn BackendDriver>, Probe)>,
    /// What `auto` resolves to.
    pub default: BackendKind,
    pub default_reason: String,
}

impl Backends {
    /// Probes every backend and decides what `auto` means here: `microvm` when usable, else
    /// `namespace`, with the microVM probe's reason.
    pub fn new(backends: Vec<Box<dyn BackendDriver>>) -> Self {
        let all: Vec<_> = backends
            .into_iter()
            .map(|b| {
                let p = b.probe();
                (b, p)
            })
            .collect();
        let find = |k: BackendKind| all.iter().find(|(b, _)| b.kind() == k);
        let (default, default_reason) =
            match (find(BackendKind::Microvm), find(BackendKind::Namespace)) {
                (Some((_, p)), _) if p.available => (BackendKind::Microvm, p.reason.clone()),
                (vm, Some((_, ns))) => {
                    let why_not_vm = vm
                        .map(|(_, p)| p.reason.clone())
                        .unwrap_or_else(|| "the microvm backend is not built in".into());
                    let reason = if ns.available {
                        why_not_vm
                    } else {
                        format!(
                            "{why_not_vm}; and namespaces are unusable too: {}",
                            ns.reason
                        )
                    };
                    (BackendKind::Namespace, reason)
                }
                _ => (
                    BackendKind::Namespace,
                    "no backend is usable on this host".into(),
                ),
            };
        Self {
            all,
            default,
            default_reason,
        }
    }

    /// The backend of an existing sandbox.
    pub fn get(&self, kind: BackendKind) -> Option<&dyn BackendDriver> {
        self.all
            .iter()
            .find(|(b, _)| b.kind() == kind)
            .map(|(b, _)| b.as_ref())
    }

    /// Resolves a creation request's choice to a usable backend and the reason for it.
    pub fn choose(
        &self,
        choice: BackendChoice,
    ) -> Result<(&dyn BackendDriver, String), BackendError> {
        let (kind, reason) = match choice {
            BackendChoice::Auto => (self.default, self.default_reason.clone()),
            BackendChoice::Microvm => (BackendKind::Microvm, "requested".to_owned()),
            BackendChoice::Namespace => (BackendKind::Namespace, "requested".to_owned()),
        };
        let name: &'static str = kind.into();
        let (backend, probe) =
            self.all
                .iter()
                .find(|(b, _)| b.kind() == kind)
                .ok_or_else(|| BackendError::Unavailable {
                    backend: name,
                    reason: "not built into this daemon".into(),
                })?;
        if probe.available {
            return Ok((backend.as_ref(), reason));
        }
        match backend.forced_for_testing() {
            Some(forced) if choice != BackendChoice::Auto => Ok((
                backend.as_ref(),
                format!("{forced} (the probe said: {})", probe.reason),
            )),
            _ => Err(BackendError::Unavailable {
                backend: name,
                reason: probe.reason.clone(),
            }),
        }
    }

    /// What `GET /v1/info` reports per backend.
    pub fn info(&self) -> Vec<BackendInfo> {
        self.all
            .iter()
            .map(|(b, p)| BackendInfo {
                backend: b.kind(),
                available: p.available,
                reason: p.reason.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend with a fixed probe result, to test the choice logic alone; `forced` makes it
    /// answer `forced_for_testing` as the harness's microVM backend does.
    struct Fixed(BackendKind, bool, &'static str, bool);

    impl BackendDriver for Fixed {
        fn kind(&self) -> BackendKind {
            self.0
        }
        fn probe(&self) -> Probe {
            Probe {
                available: self.1,
                reason: self.2.into(),
            }
        }
        fn launch(&self, _: &LaunchSpec) -> Result<Launched, BackendError> {
            Err(BackendError::Ended { output: None })
        }
        fn adopt(&self, _: &Path) -> Result<Option<Launched>, BackendError> {
            Ok(None)
        }
        fn exit_watch(&self, _: &Path) -> Result<Option<ExitWatch>, BackendError> {
            Ok(None)
        }
        fn usage(&self, _: &Path) -> Result<Option<SandboxUsage>, BackendError> {
            Ok(None)
        }
        fn stop(&self, _: &Path, _: Duration) -> Result<(), BackendError> {
            Ok(())
        }
        fn destroy(&self, _: &Path) -> Result<(), BackendError> {
            Ok(())
        }
        fn agent_address(&self, p: &Path) -> AgentAddress {
            AgentAddress::Unix(p.to_path_buf())
        }
        fn forced_for_testing(&self) -> Option<String> {
            self.3.then(|| "forced usable for testing".into())
        }
    }

    #[test]
    fn auto_prefers_a_usable_microvm_and_explains_a_fallback() {
        let b = Backends::new(vec![
            Box::new(Fixed(
                BackendKind::Microvm,
                false,
                "KVM is software-based (PVM) here",
                false,
            )),
            Box::new(Fixed(BackendKind::Namespace, true, "ok", false)),
        ]);
        assert_eq!(b.default, BackendKind::Namespace);
        assert_eq!(b.default_reason, "KVM is software-based (PVM) here");
        let (chosen, reason) = b.choose(BackendChoice::Auto).unwrap();
        assert_eq!(chosen.kind(), BackendKind::Namespace);
        assert!(reason.contains("PVM"));
        let err = b.choose(BackendChoice::Microvm).err().unwrap();
        assert!(err.to_string().contains("PVM"), "{err}");

        let b = Backends::new(vec![
            Box::new(Fixed(
                BackendKind::Microvm,
                true,
                "KVM with hardware virtualization",
                false,
            )),
            Box::new(Fixed(BackendKind::Namespace, true, "ok", false)),
        ]);
        assert_eq!(b.default, BackendKind::Microvm);
        assert_eq!(b.info().len(), 2);
    }

    #[test]
    fn forcing_for_testing_serves_explicit_requests_but_never_changes_auto() {
        let b = Backends::new(vec![
            Box::new(Fixed(
                BackendKind::Microvm,
                false,
                "too slow: nested KVM",
                true,
            )),
            Box::new(Fixed(BackendKind::Namespace, true, "ok", false)),
        ]);
        assert_eq!(b.default, BackendKind::Namespace);
        let (chosen, _) = b.choose(BackendChoice::Auto).unwrap();
        assert_eq!(chosen.kind(), BackendKind::Namespace);
        let (chosen, reason) = b.choose(BackendChoice::Microvm).unwrap();
        assert_eq!(chosen.kind(), BackendKind::Microvm);
        assert!(
            reason.contains("for testing") && reason.contains("nested KVM"),
            "{reason}"
        );
        // `GET /v1/info` still reports the probe's verdict.
        assert!(!b.info()[0].available);
    }
}
