//! Sandboxes: their lifecycle (`pending → running → stopping → stopped | failed`), the
//! backends that run them, admission, commands and their logs, files, and adoption of running
//! sandboxes after a daemon restart.
//!
//! [`Sandboxes`] is the one entry point the HTTP layer calls. Its state that matters lives in
//! the store and in each sandbox's directory; what it keeps in memory (agent connections,
//! log followers, per-sandbox locks) is rebuilt after a restart.

pub mod admission;
mod adopt;
pub mod backend;
mod build_step;
mod commands;
mod create;
mod files;
mod fork;
mod frozen;
mod lifecycle;
mod lifetime;
mod live_mounts;
mod logs;
pub mod microvm;
mod monitor;
pub mod namespace;
pub mod network;
mod pause;
mod persist;
mod pool;
mod pump;
mod reconfigure;
mod snapshots;
mod source;
mod teardown;
mod templates;
mod terminal;
mod usage;
pub mod volumes;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belljar_agent_proto::client::{AgentClient, ClientError};
use belljar_api::{Backend as BackendKind, Sandbox, SandboxStatus};

use crate::events::Events;
use crate::images::{ImageError, Images};
use crate::paths::Paths;
use crate::store::{Store, StoreError};

/// The state directory's name when both backends used one name (see `state_dir`).
const LEGACY_STATE_DIR: &str = "ns";
use admission::AdmissionError;
use backend::{AgentAddress, BackendError, Backends};
pub use files::{Thumbnail, ThumbnailError};
use logs::LogRegistry;
pub use pool::PoolSizes;
pub use reconfigure::Reconfigure;
pub use terminal::{Terminal, TerminalFrame};

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The request is malformed; the message names the field.
    #[error("{0}")]
    BadRequest(String),
    /// No such sandbox.
    #[error("Sandbox {0} not found")]
    NotFound(String),
    /// No such command in that sandbox.
    #[error("Command {0} not found")]
    CommandNotFound(String),
    /// The sandbox is not running.
    #[error("Sandbox {id} is {status}")]
    NotRunning { id: String, status: &'static str },
    /// The operation conflicts with the sandbox's state.
    #[error("{0}")]
    Conflict(String),
    /// Not enough host memory.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The image is missing or unknown.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The backend failed or cannot run here.
    #[error(transparent)]
    Backend(BackendError),
    /// The agent answered with an error, or could not be reached.
    #[error("{0}")]
    Agent(#[from] ClientError),
    /// The agent did not come up in time.
    #[error("The sandbox's agent did not answer within {0:?}")]
    AgentTimeout(Duration),
    /// A thumbnail could not be made.
    #[error("Cannot make a thumbnail")]
    Thumbnail(#[from] files::ThumbnailError),
    /// No such snapshot.
    #[error("Snapshot {0} not found")]
    SnapshotNotFound(String),
    /// The snapshot is deleted or failed.
    #[error("Snapshot {id} is {status}; nothing can start from it")]
    SnapshotNotUsable { id: String, status: &'static str },
    /// A path the request names is not a plain absolute path.
    #[error("{0}")]
    InvalidPath(String),
    /// A path the request names is, or crosses, something other than a directory.
    #[error("{0}")]
    NotADirectory(String),
    /// Nothing at a path the request names.
    #[error("{0}")]
    PathNotFound(String),
    /// The sandbox itself may not read what the request names (a directory snapshot reads
    /// with the sandbox's rights, never the daemon's).
    #[error("{0}")]
    PermissionDenied(String),
    /// A snapshot would hold more file data than the sandbox's disk: no sandbox's own writes
    /// can, so the layer is not made (the host's disk is not the sandbox's to fill).
    #[error("{0}")]
    SnapshotTooLarge(String),
    /// The caller may not mount that host folder, or no sandbox may.
    #[error("{0}")]
    MountDenied(String),
    /// No such volume.
    #[error("Volume {0} not found")]
    VolumeNotFound(String),
    /// A sandbox mounts the volume.
    #[error("{0}")]
    VolumeInUse(String),
    /// No such template.
    #[error("Template {0} not found")]
    TemplateNotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A host file operation failed.
    #[error("Host I/O failed")]
    Io(#[from] std::io::Error),
}

/// Defaults and limits of sandboxes, from the daemon's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub default_image: String,
    pub default_vcpus: u32,
    pub default_memory_mib: u64,
    pub default_disk_mib: u64,
    pub default_timeout_ms: i64,
    pub max_timeout_ms: i64,
    /// Host memory kept free of sandboxes, MiB.
    pub memory_reserve_mib: u64,
    /// The sum of sandboxes' memory limits may reach this many times the host's RAM.
    pub memory_overcommit: f64,
    /// The agent binary given by `BELLJAR_AGENT`, if any.
    pub agent: Option<PathBuf>,
    /// How long a sandbox gets to end by itself before it is killed.
    pub stop_grace: Duration,
    /// How long a new sandbox's agent gets to answer.
    pub ready_timeout: Duration,
    /// Output bytes the agent keeps per command; `None` leaves the agent's default (64 MiB).
    pub command_output_limit: Option<u64>,
    /// Snapshot chains deeper than this are squashed in the background.
    pub squash_depth: usize,
    /// Sandboxes kept started ahead of demand, per image (see `pool`); empty: no pool.
    pub pool: PoolSizes,
    /// Host folders under these may be mounted by TCP callers (`--allow-mount-root`).
    pub allow_mount_roots: Vec<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            default_image: "base".into(),
            default_vcpus: 2,
            default_memory_mib: 1024,
            default_disk_mib: 4096,
            default_timeout_ms: 5 * 60_000,
            max_timeout_ms: 24 * 3_600_000,
            memory_reserve_mib: 512,
            memory_overcommit: admission::DEFAULT_OVERCOMMIT,
            agent: None,
            stop_grace: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(20),
            command_output_limit: None,
            squash_depth: snapshots::squash::DEFAULT_SQUASH_DEPTH,
            pool: PoolSizes::default(),
            allow_mount_roots: Vec::new(),
        }
    }
}

/// The sandbox manager; cheap to clone.
#[derive(Clone)]
pub struct Sandboxes {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    events: Arc<Events>,
    paths: Paths,
    backends: Backends,
    images: Images,
    settings: Settings,
    agents: Mutex<HashMap<String, AgentClient>>,
    /// A second connection per sandbox for the log pumps, whose streams last as long as their
    /// commands: they must not use up the HTTP/2 streams that requests need.
    pump_agents: Mutex<HashMap<String, AgentClient>>,
    logs: LogRegistry,
    /// Serialises lifecycle changes of one sandbox (create, stop, delete, extend).
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Serialises admission so that two creations cannot both take the last free memory.
    admission: tokio::sync::Mutex<()>,
    monitor: monitor::MonitorState,
    snapshots: snapshots::SnapshotState,
    network: network::NetState,
    lifetime: lifetime::LifetimeState,
    pool: pool::PoolState,
    /// The teardowns of deleted sandboxes still running in the background (see `teardown`).
    teardowns: tokio_util::task::TaskTracker,
    /// This daemon's epoch, sent with every command start and with adoption's listing, so
    /// that an agent refuses the starts a daemon before this one sent (see `adopt`).
    epoch: u64,
}

/// An epoch of its own for this daemon run (agents compare epochs for equality only).
fn daemon_epoch() -> u64 {
    rand::random()
}

impl Sandboxes {
    pub fn new(
        store: Store,
        events: Arc<Events>,
        paths: Paths,
        backends: Backends,
        images: Images,
        settings: Settings,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                events,
                paths,
                backends,
                images,
                settings,
                agents: Default::default(),
                pump_agents: Default::default(),
                logs: LogRegistry::default(),
                locks: Default::default(),
                admission: Default::default(),
                monitor: Default::default(),
                snapshots: Default::default(),
                network: Default::default(),
                lifetime: Default::default(),
                pool: Default::default(),
                teardowns: tokio_util::task::TaskTracker::new(),
                epoch: daemon_epoch(),
            }),
        }
    }

    pub fn backends(&self) -> &Backends {
        &self.inner.backends
    }

    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The store, for tests that count what the daemon reads.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// A sandbox by id.
    pub fn get(&self, id: &str) -> Result<Sandbox, SandboxError> {
        self.inner
            .store
            .sandbox(id)?
            .map(|s| self.for_client(s))
            .ok_or_else(|| SandboxError::NotFound(id.to_owned()))
    }

    /// A sandbox as clients see it: its row, its policy (secrets redacted) and its mounts.
    fn for_client(&self, s: Sandbox) -> Sandbox {
        self.with_mounts(self.with_network(s))
    }

    /// Fills in the directory snapshots the sandbox mounts.
    fn with_mounts(&self, mut s: Sandbox) -> Sandbox {
        match self.inner.store.sandbox_mounts(&s.id) {
            Ok(held) => {
                s.mounts = (!held.is_empty()).then(|| held.into_iter().map(Into::into).collect())
            }
            Err(e) => {
                tracing::warn!(sandbox = %s.id, error = %e, "cannot read the sandbox's mounts")
            }
        }
        s
    }

    /// Tells subscribers of a change that is not in the sandbox's row (its mounts).
    fn announce(&self, id: &str) -> Result<(), SandboxError> {
        self.emit_sandbox(self.record(id)?);
        Ok(())
    }

    /// Emits a sandbox event showing it as GET does: a bare record (pause, stop, a mount)
    /// must not drop its policy or its mounts from subscribers' view.
    fn emit_sandbox(&self, s: Sandbox) {
        let shown = self.for_client(s);
        (self.inner.events).emit(crate::store::EventBody::Sandbox(Box::new(shown)));
    }

    /// A sandbox's row without its network policy: for the daemon's own checks on busy paths
    /// (every command asks several times), where reading and parsing the policy's file would
    /// cost more than the row itself. What goes back to a client comes from [`Self::get`].
    fn record(&self, id: &str) -> Result<Sandbox, SandboxError> {
        self.inner
            .store
            .sandbox(id)?
            .ok_or_else(|| SandboxError::NotFound(id.to_owned()))
    }

    /// A sandbox that must be running.
    fn running(&self, id: &str) -> Result<Sandbox, SandboxError> {
        must_run(self.get(id)?)
    }

    /// [`Self::running`] without the network policy (see [`Self::record`]).
    fn running_record(&self, id: &str) -> Result<Sandbox, SandboxError> {
        must_run(self.record(id)?)
    }

    fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.inner
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// The backend's state directory of an existing sandbox: `<sandbox>/namespace` or
    /// `<sandbox>/microvm`, or `<sandbox>/ns`, the one name both backends used before (kept so
    /// that sandboxes an older daemon started are still found after an upgrade).
    fn state_dir(&self, id: &str) -> PathBuf {
        let base = self.inner.paths.sandbox_dir(id);
        [BackendKind::Namespace, BackendKind::Microvm]
            .map(|kind| base.join(<&str>::from(kind)))
            .into_iter()
            .chain([base.join(LEGACY_STATE_DIR)])
            .find(|dir| dir.is_dir())
            .unwrap_or_else(|| base.join(LEGACY_STATE_DIR))
    }

    /// Where a new sandbox's backend keeps its state: `<sandbox>/<backend>`.
    fn new_state_dir(&self, id: &str, kind: BackendKind) -> PathBuf {
        self.inner.paths.sandbox_dir(id).join(<&str>::from(kind))
    }

    /// The agent connection of a running sandbox, connecting when there is none.
    async fn agent(&self, sandbox: &Sandbox) -> Result<AgentClient, SandboxError> {
        self.cached_agent(sandbox, &self.inner.agents).await
    }

    /// The log pumps' connection to a running sandbox's agent.
    async fn pump_agent(&self, id: &str) -> Result<AgentClient, SandboxError> {
        let sandbox = self.running_record(id)?;
        self.cached_agent(&sandbox, &self.inner.pump_agents).await
    }

    async fn cached_agent(
        &self,
        sandbox: &Sandbox,
        cache: &Mutex<HashMap<String, AgentClient>>,
    ) -> Result<AgentClient, SandboxError> {
        if let Some(c) = cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&sandbox.id)
        {
            return Ok(c.clone());
        }
        let backend =
            self.inner
                .backends
                .get(sandbox.backend)
                .ok_or_else(|| BackendError::Unavailable {
                    backend: sandbox.backend.into(),
                    reason: "not built into this daemon".into(),
                })?;
        let client = connect(&backend.agent_address(&self.state_dir(&sandbox.id))).await?;
        cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sandbox.id.clone(), client.clone());
        Ok(client)
    }

    /// The agent of a running sandbox by id (a paused one with `auto_resume` is resumed).
    async fn agent_of(&self, id: &str) -> Result<AgentClient, SandboxError> {
        let s = self.awake(id).await?;
        self.agent(&s).await
    }

    /// Maps an agent error, dropping the cached connection when the transport failed so that
    /// the next call reconnects.
    fn agent_error(&self, id: &str, e: ClientError) -> SandboxError {
        if !matches!(e, ClientError::Api { .. }) {
            self.forget_agent(id);
        }
        SandboxError::Agent(e)
    }

    fn forget_agent(&self, id: &str) {
        for cache in [&self.inner.agents, &self.inner.pump_agents] {
            cache.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        }
    }
}

/// `s`, or the error for a sandbox that is not running.
fn must_run(s: Sandbox) -> Result<Sandbox, SandboxError> {
    if s.status != SandboxStatus::Running {
        return Err(SandboxError::NotRunning {
            id: s.id,
            status: s.status.as_str(),
        });
    }
    Ok(s)
}

async fn connect(addr: &AgentAddress) -> Result<AgentClient, ClientError> {
    match addr {
        AgentAddress::Unix(path) => AgentClient::connect_unix(path).await,
        AgentAddress::HybridVsock { socket, port } => {
            AgentClient::connect_hybrid_vsock(socket, *port).await
        }
    }
}

impl From<BackendError> for SandboxError {
    /// A capture that would outgrow the sandbox's disk is the sandbox's doing, with a code of
    /// its own; every other backend failure stays one.
    fn from(e: BackendError) -> Self {
        if e.is_too_large() {
            SandboxError::SnapshotTooLarge(e.to_string())
        } else {
            SandboxError::Backend(e)
        }
    }
}
