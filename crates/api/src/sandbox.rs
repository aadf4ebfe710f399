//! Sandboxes: what a user creates, lists, extends, stops and deletes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::{IntoParams, ToSchema};

/// Where a sandbox is in its life: `pending → running → stopping → stopped`, or `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStatus {
    Pending,
    Running,
    Paused,
    Stopping,
    Stopped,
    Failed,
}

impl SandboxStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
        }
    }

    /// Whether the sandbox has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Stopped | Self::Failed)
    }
}

/// What runs a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// A microVM under `belljar-vmm`: hardware isolation.
    Microvm,
    /// Linux namespaces, cgroups and seccomp: weaker isolation, for hosts without usable
    /// hardware virtualization.
    Namespace,
}

/// A backend choice at creation; `auto` picks `microvm` when hardware virtualization is usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    #[default]
    Auto,
    Microvm,
    Namespace,
}

/// Content put into `/workspace` when the sandbox is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Source {
    /// A directory or a tarball (`.tar`, `.tar.gz`, `.tgz`) on the host, unpacked into `/workspace`.
    Path { path: String },
    /// A git repository (a host path or a URL the sandbox can reach) cloned into `/workspace`.
    Git {
        url: String,
        #[serde(default)]
        #[ts(optional)]
        revision: Option<String>,
    },
}

/// The body of `POST /v1/sandboxes`. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// `base` (default), `python3.13`, `node24` or `node22`.
    #[serde(default)]
    #[ts(optional)]
    pub image: Option<String>,
    #[serde(default)]
    #[ts(optional)]
    pub backend: Option<BackendChoice>,
    /// Default 2.
    #[serde(default)]
    #[ts(optional)]
    pub vcpus: Option<u32>,
    /// Default 1024.
    #[serde(default)]
    #[ts(optional)]
    pub memory_mib: Option<u64>,
    /// Size of the writable layer. Default 4096.
    #[serde(default)]
    #[ts(optional)]
    pub disk_mib: Option<u64>,
    /// Milliseconds until the sandbox stops by itself. Default 5 minutes.
    #[serde(default)]
    #[ts(optional)]
    pub timeout_ms: Option<i64>,
    /// Environment of every command, overridden per command.
    #[serde(default)]
    #[ts(optional)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[ts(optional)]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[ts(optional)]
    pub name: Option<String>,
    #[serde(default)]
    #[ts(optional)]
    pub source: Option<Source>,
}

/// Whether each resource limit is enforced on this sandbox, and why not when it is not.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct LimitsReport {
    pub memory: LimitState,
    pub cpu: LimitState,
    pub pids: LimitState,
    /// The sandbox's writable disk (`disk_mib`).
    #[serde(default)]
    pub disk: LimitState,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct LimitState {
    pub enforced: bool,
    /// How it is enforced (`cgroup v2`, `cgroup v1`, `hypervisor`) or why it is not.
    pub detail: String,
}

/// A sandbox as every client sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct Sandbox {
    /// `sbx_` followed by lowercase letters and digits.
    pub id: String,
    #[ts(optional)]
    pub name: Option<String>,
    pub status: SandboxStatus,
    /// Why the sandbox failed or stopped (`timeout`, `stopped by user`, an error message).
    #[ts(optional)]
    pub status_reason: Option<String>,
    pub image: String,
    pub backend: Backend,
    /// Why this backend was chosen, e.g. "KVM is software-based (PVM) here".
    pub backend_reason: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_mib: u64,
    pub env: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    #[ts(optional)]
    pub source: Option<Source>,
    pub created_at: i64,
    #[ts(optional)]
    pub started_at: Option<i64>,
    #[ts(optional)]
    pub stopped_at: Option<i64>,
    /// The sandbox's total allowed run time, extended by `extend`.
    pub timeout_ms: i64,
    /// When the sandbox will stop by itself, while it runs.
    #[ts(optional)]
    pub expires_at: Option<i64>,
    pub limits: LimitsReport,
}

/// `GET /v1/sandboxes` query.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, IntoParams, TS)]
#[into_params(parameter_in = Query)]
pub struct ListSandboxesQuery {
    /// Only sandboxes in this status.
    #[serde(default)]
    pub status: Option<SandboxStatus>,
    /// `key=value`; only sandboxes carrying this tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// Created at or after this time (Unix ms).
    #[serde(default)]
    pub since: Option<i64>,
    /// Created before this time (Unix ms).
    #[serde(default)]
    pub until: Option<i64>,
    /// Page size, 1..=200, default 50.
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One page of sandboxes, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
    #[ts(optional)]
    pub next_cursor: Option<String>,
}

/// `PATCH /v1/sandboxes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// Replaces all tags.
    #[serde(default)]
    #[ts(optional)]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[ts(optional)]
    pub name: Option<String>,
}

/// `POST /v1/sandboxes/{id}/extend`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct ExtendSandbox {
    /// Milliseconds added to the timeout; must be positive.
    pub duration_ms: i64,
}
