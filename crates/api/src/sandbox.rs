//! Sandboxes: what a user creates, lists, extends, stops and deletes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::{IntoParams, ToSchema};

use crate::limits::{self, Invalid, Validate};

/// Where a sandbox is in its life: `pending → running → stopping → stopped`, or `failed`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    TS,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum SandboxStatus {
    Pending,
    Running,
    Paused,
    Stopping,
    Stopped,
    Failed,
}

impl SandboxStatus {
    /// The wire name (`running`), as serde writes it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether the sandbox has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Stopped | Self::Failed)
    }
}

/// What runs a sandbox.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    TS,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Backend {
    /// A microVM under `belljar-vmm`: hardware isolation.
    Microvm,
    /// Linux namespaces, cgroups and seccomp: weaker isolation, for hosts without usable
    /// hardware virtualization.
    Namespace,
}

/// A backend choice at creation; `auto` picks `microvm` when hardware virtualization is usable.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    ToSchema,
    TS,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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
    Path {
        #[schema(min_length = 1, max_length = 4096)]
        path: String,
    },
    /// A git repository (a host path or a URL the sandbox can reach) cloned into `/workspace`.
    Git {
        #[schema(min_length = 1, max_length = 4096)]
        url: String,
        #[serde(default)]
        #[ts(optional)]
        #[schema(max_length = 256)]
        revision: Option<String>,
    },
    /// A snapshot (`snap_...`): the sandbox starts with its files, on its image.
    Snapshot {
        #[schema(min_length = 1, max_length = 64)]
        snapshot_id: String,
    },
}

/// The body of `POST /v1/sandboxes`. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// A template (`/v1/templates`) whose defaults apply to every field this request leaves
    /// out; a sandbox its pool holds ready serves the create when the request asks for
    /// nothing a pooled sandbox cannot take at claim.
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_length = 64)]
    pub template: Option<String>,
    /// `base` (default), `python3.13`, `node24` or `node22`.
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_length = 128)]
    pub image: Option<String>,
    #[serde(default)]
    #[ts(optional)]
    pub backend: Option<BackendChoice>,
    /// Default 2; at most 32.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 32)]
    pub vcpus: Option<u32>,
    /// Default 1024; 64 to 262144.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 64, maximum = 262144)]
    pub memory_mib: Option<u64>,
    /// Size of the writable layer. Default 4096; 64 to 1048576 (1 TiB).
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 64, maximum = 1048576)]
    pub disk_mib: Option<u64>,
    /// Milliseconds until the sandbox stops by itself. Default 5 minutes; at most the daemon's
    /// maximum (24 hours by default).
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 2592000000_i64)]
    pub timeout_ms: Option<i64>,
    /// Environment of every command, overridden per command: at most 256 names matching
    /// `[A-Za-z_][A-Za-z0-9_]*`, values up to 32 KiB, 256 KiB in all.
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::env_schema, nullable)]
    pub env: Option<BTreeMap<String, String>>,
    /// At most 50; keys 1 to 64 bytes without `=`, values up to 256 bytes.
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::tags_schema, nullable)]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_length = 128)]
    pub name: Option<String>,
    #[serde(default)]
    #[ts(optional)]
    pub source: Option<Source>,
    /// Default expiration of this sandbox's snapshots, ms after their last use; `0` never.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    pub snapshot_expiration_ms: Option<i64>,
    /// How many of this sandbox's snapshots are kept.
    #[serde(default)]
    #[ts(optional)]
    pub keep_last_snapshots: Option<crate::KeepLastSnapshots>,
    /// The sandbox's firewall; `allow-all` when absent.
    #[serde(default)]
    #[ts(optional)]
    pub network_policy: Option<crate::NetworkPolicy>,
    /// Directory snapshots mounted at paths of the sandbox (namespace backend), at most 16.
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_items = 16)]
    pub mounts: Option<Vec<crate::SnapshotMount>>,
    /// Host folders and named volumes mounted at paths of the sandbox, two-way and live
    /// (namespace backend), at most 16. A host folder must be one the caller may read (and
    /// write, unless `read_only`); over TCP, one under a root the daemon allows
    /// (`belljard --allow-mount-root`).
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_items = 16)]
    pub volumes: Option<Vec<crate::VolumeMount>>,
    /// Sandbox TCP ports exposed on 127.0.0.1 (each on a free host port).
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_items = 64)]
    pub ports: Option<Vec<u32>>,
    /// Stopping (or timing out) snapshots the sandbox, and `start` resumes it from its latest
    /// snapshot with the same id, name, tags and configuration. Default `false`.
    #[serde(default)]
    #[ts(optional)]
    pub persistent: Option<bool>,
    /// Pause after this many ms with no API use and no running command (Modal's
    /// `idle_timeout`, Sandbox0's soft `ttl`).
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 2592000000_i64)]
    pub idle_timeout_ms: Option<i64>,
    /// Delete the sandbox (and its own snapshots' hold) this many ms after it was created,
    /// whatever its state (Sandbox0's `hard_ttl`).
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 315360000000_i64)]
    pub hard_ttl_ms: Option<i64>,
    /// Any API use of the paused sandbox resumes it. Default `true`.
    #[serde(default)]
    #[ts(optional)]
    pub auto_resume: Option<bool>,
}

/// How a sandbox lives on past a stop and how long it may live: persistence, the idle pause,
/// the hard TTL and auto-resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct SandboxLifecycle {
    /// Stopping snapshots it, and `start` resumes it from its latest snapshot.
    #[serde(default)]
    pub persistent: bool,
    /// It pauses after this many ms with no API use and no running command.
    #[serde(default)]
    #[ts(optional)]
    pub idle_timeout_ms: Option<i64>,
    /// It is deleted this many ms after its creation.
    #[serde(default)]
    #[ts(optional)]
    pub hard_ttl_ms: Option<i64>,
    /// When the hard TTL deletes it.
    #[serde(default)]
    #[ts(optional)]
    pub deletes_at: Option<i64>,
    /// Any API use while it is paused resumes it.
    #[serde(default = "yes")]
    pub auto_resume: bool,
}

fn yes() -> bool {
    true
}

impl Default for SandboxLifecycle {
    fn default() -> Self {
        Self {
            persistent: false,
            idle_timeout_ms: None,
            hard_ttl_ms: None,
            deletes_at: None,
            auto_resume: true,
        }
    }
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
    /// The id (`sha256:…`) of the user's image the sandbox stands on, fixed at create: the
    /// name, pulled, imported or built again, may come to name another image; the sandbox
    /// keeps this one. Absent for Belljar's own images.
    #[serde(default)]
    #[ts(optional)]
    pub image_id: Option<String>,
    /// The template (`/v1/templates`) the sandbox was made from, when its create named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub template: Option<String>,
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
    /// The sandbox's firewall (brokered header values redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub network_policy: Option<crate::NetworkPolicy>,
    /// The directory snapshots it mounts, in the order they were mounted (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub mounts: Option<Vec<crate::SnapshotMount>>,
    /// The host folders and volumes it mounts (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub volumes: Option<Vec<crate::VolumeMount>>,
    /// Persistence, idle pause, hard TTL and auto-resume.
    #[serde(flatten)]
    pub lifecycle: SandboxLifecycle,
}

impl Sandbox {
    /// A sandbox about to start: `Pending`, with no name, env, tags, source, mounts, limits
    /// or times past `created_at`, no timeout, and the default lifecycle (not persistent,
    /// auto-resume on). Its maker sets what its request asks for.
    pub fn pending(
        id: String,
        image: String,
        backend: Backend,
        (vcpus, memory_mib, disk_mib): (u32, u64, u64),
        created_at: i64,
    ) -> Self {
        Sandbox {
            id,
            name: None,
            status: SandboxStatus::Pending,
            status_reason: None,
            image,
            image_id: None,
            template: None,
            backend,
            backend_reason: String::new(),
            vcpus,
            memory_mib,
            disk_mib,
            env: BTreeMap::new(),
            tags: BTreeMap::new(),
            source: None,
            created_at,
            started_at: None,
            stopped_at: None,
            timeout_ms: 0,
            expires_at: None,
            limits: LimitsReport::default(),
            network_policy: None,
            mounts: None,
            volumes: None,
            lifecycle: SandboxLifecycle {
                persistent: false,
                idle_timeout_ms: None,
                hard_ttl_ms: None,
                deletes_at: None,
                auto_resume: true,
            },
        }
    }
}

impl Validate for Source {
    fn validate(&self) -> Result<(), Invalid> {
        match self {
            Source::Path { path } => limits::path("source.path", path),
            Source::Git { url, revision } => {
                limits::path("source.url", url)?;
                revision
                    .as_deref()
                    .map_or(Ok(()), |r| limits::text("source.revision", r, 256))
            }
            Source::Snapshot { snapshot_id } => limits::text("source.snapshot_id", snapshot_id, 64),
        }
    }
}

impl Validate for CreateSandbox {
    fn validate(&self) -> Result<(), Invalid> {
        if let Some(template) = &self.template {
            limits::text("template", template, 64)?;
        }
        if let Some(image) = &self.image {
            limits::text("image", image, limits::MAX_NAME)?;
        }
        limits::range("vcpus", self.vcpus, 1, limits::MAX_VCPUS)?;
        limits::range(
            "memory_mib",
            self.memory_mib,
            limits::MIN_MEMORY_MIB,
            limits::MAX_MEMORY_MIB,
        )?;
        limits::range(
            "disk_mib",
            self.disk_mib,
            limits::MIN_DISK_MIB,
            limits::MAX_DISK_MIB,
        )?;
        limits::range("timeout_ms", self.timeout_ms, 1, limits::MAX_TIMEOUT_MS)?;
        limits::env("env", self.env.as_ref())?;
        limits::tags("tags", self.tags.as_ref())?;
        if let Some(name) = &self.name {
            limits::text("name", name, limits::MAX_NAME)?;
        }
        limits::range(
            "snapshot_expiration_ms",
            self.snapshot_expiration_ms,
            0,
            crate::MAX_EXPIRATION_MS,
        )?;
        if let Some(keep) = &self.keep_last_snapshots {
            keep.validate()?;
        }
        if let Some(policy) = &self.network_policy {
            policy.validate()?;
        }
        let mounts = self.mounts.as_deref().unwrap_or_default();
        if mounts.len() > 16 {
            return Err(Invalid::new("mounts", "more than 16"));
        }
        for (i, m) in mounts.iter().enumerate() {
            limits::text(
                &format!("mounts[{i}].snapshot_id"),
                &m.snapshot_id,
                limits::MAX_NAME,
            )?;
            limits::text(&format!("mounts[{i}].path"), &m.path, 1024)?;
        }
        let volumes = self.volumes.as_deref().unwrap_or_default();
        if volumes.len() > crate::MAX_VOLUME_MOUNTS {
            return Err(Invalid::new("volumes", "more than 16"));
        }
        for (i, v) in volumes.iter().enumerate() {
            v.validate()
                .map_err(|e| Invalid::new(format!("volumes[{i}].{}", e.field), e.problem))?;
        }
        let ports = self.ports.as_deref().unwrap_or_default();
        if ports.len() > crate::MAX_PORTS {
            return Err(Invalid::new(
                "ports",
                format!("more than {}", crate::MAX_PORTS),
            ));
        }
        for (i, p) in ports.iter().enumerate() {
            limits::range(&format!("ports[{i}]"), Some(*p), 1, 65535)?;
        }
        limits::range(
            "idle_timeout_ms",
            self.idle_timeout_ms,
            1,
            limits::MAX_TIMEOUT_MS,
        )?;
        limits::range("hard_ttl_ms", self.hard_ttl_ms, 1, crate::MAX_EXPIRATION_MS)?;
        self.source.as_ref().map_or(Ok(()), Validate::validate)
    }
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
    #[param(max_length = 321)]
    pub tag: Option<String>,
    /// Created at or after this time (Unix ms).
    #[serde(default)]
    pub since: Option<i64>,
    /// Created before this time (Unix ms).
    #[serde(default)]
    pub until: Option<i64>,
    /// Page size, 1..=200, default 50.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    #[param(max_length = 256)]
    pub cursor: Option<String>,
}

/// One page of sandboxes, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
    #[ts(optional)]
    pub next_cursor: Option<String>,
}

impl Validate for ListSandboxesQuery {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range("limit", self.limit, 1, 200)?;
        if let Some(tag) = &self.tag {
            limits::text("tag", tag, limits::MAX_TAG_KEY + 1 + limits::MAX_TAG_VALUE)?;
        }
        if let Some(cursor) = &self.cursor {
            limits::text("cursor", cursor, 256)?;
        }
        Ok(())
    }
}

/// `PATCH /v1/sandboxes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandbox {
    /// Replaces all tags (the bounds of `CreateSandbox.tags`).
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::tags_schema, nullable)]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_length = 128)]
    pub name: Option<String>,
    /// Replaces the firewall whole, not merged into the old one (the same as `PUT
    /// /v1/sandboxes/{id}/network/policy`); open flows it denies are cut at once.
    #[serde(default)]
    #[ts(optional)]
    pub network_policy: Option<crate::NetworkPolicy>,
}

impl Validate for UpdateSandbox {
    fn validate(&self) -> Result<(), Invalid> {
        limits::tags("tags", self.tags.as_ref())?;
        if let Some(policy) = &self.network_policy {
            policy.validate()?;
        }
        if let Some(name) = &self.name {
            limits::text("name", name, limits::MAX_NAME)?;
        }
        Ok(())
    }
}

/// `POST /v1/sandboxes/{id}/extend`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct ExtendSandbox {
    /// Milliseconds added to the timeout; must be positive.
    #[schema(minimum = 1, maximum = 2592000000_i64)]
    pub duration_ms: i64,
}

impl Validate for ExtendSandbox {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range(
            "duration_ms",
            Some(self.duration_ms),
            1,
            limits::MAX_TIMEOUT_MS,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CommandStatus;

    /// strum's names (used for store columns, CLI flags and output) are serde's wire names.
    #[test]
    fn strum_and_serde_agree_on_names() {
        fn check<T>(values: &[T])
        where
            T: Copy
                + Serialize
                + Into<&'static str>
                + std::str::FromStr
                + PartialEq
                + std::fmt::Debug,
        {
            for v in values {
                let name: &'static str = (*v).into();
                assert_eq!(serde_json::to_value(v).unwrap(), name);
                assert!(name.parse::<T>().ok() == Some(*v), "{name}");
            }
        }
        use SandboxStatus::*;
        check(&[Pending, Running, Paused, Stopping, Stopped, Failed]);
        check(&[Backend::Microvm, Backend::Namespace]);
        check(&[
            BackendChoice::Auto,
            BackendChoice::Microvm,
            BackendChoice::Namespace,
        ]);
        check(&[
            CommandStatus::Pending,
            CommandStatus::Running,
            CommandStatus::Exited,
            CommandStatus::Lost,
        ]);
        assert!("docker".parse::<BackendChoice>().is_err());
    }
}
