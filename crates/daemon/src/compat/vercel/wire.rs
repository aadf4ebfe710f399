//! Vercel Sandbox's wire format, as the `@vercel/sandbox` SDK (1.x and 3.x) sends and
//! validates it, and its translation from the daemon's own types.
//!
//! Requests are lenient (unknown fields are ignored, as Vercel's API ignores what a newer SDK
//! adds); answers carry every field the SDK's validators require. Times are Unix ms.

use std::collections::BTreeMap;

use belljar_api::{
    Command, CommandStatus, KeepLastSnapshots, Sandbox, SandboxStatus, Snapshot, SnapshotStatus,
};
use serde::{Deserialize, Serialize};

use super::runtime;

/// Vercel's region field; everything here is on this machine.
pub const REGION: &str = "local";

/// `POST /v1/sandboxes`, `POST /v2/sandboxes` and `POST /v3/sandboxes`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRequest {
    #[serde(default)]
    pub ports: Option<Vec<u16>>,
    #[serde(default)]
    pub source: Option<SourceRequest>,
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub persistent: Option<bool>,
    #[serde(default)]
    pub network_policy: Option<serde_json::Value>,
    #[serde(default)]
    pub network_id: Option<String>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub snapshot_expiration: Option<i64>,
    #[serde(default)]
    pub keep_last_snapshots: Option<KeepLast>,
    #[serde(default)]
    pub mounts: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub vcpus: Option<u32>,
    #[serde(default)]
    pub memory: Option<u64>,
}

/// What a new sandbox starts with.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SourceRequest {
    #[serde(rename_all = "camelCase")]
    Git {
        url: String,
        #[serde(default)]
        depth: Option<u32>,
        #[serde(default)]
        revision: Option<String>,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
    },
    Tarball {
        url: String,
    },
    #[serde(rename_all = "camelCase")]
    Snapshot {
        snapshot_id: String,
    },
}

/// Vercel's `keepLastSnapshots`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeepLast {
    pub count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_evicted: Option<bool>,
}

impl From<KeepLast> for KeepLastSnapshots {
    fn from(k: KeepLast) -> Self {
        Self {
            count: k.count,
            expiration_ms: k.expiration,
            delete_evicted: k.delete_evicted,
        }
    }
}

/// `POST .../cmd`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRequest {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub sudo: bool,
    #[serde(default)]
    pub wait: bool,
    /// 3.x: interleave the output with the answer of a `wait` request.
    #[serde(default)]
    pub logs: bool,
    /// 3.x: kill the command after this many ms.
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// `POST .../fs/read` and `POST .../fs/mkdir`.
#[derive(Debug, Deserialize)]
pub struct PathRequest {
    pub path: String,
    #[serde(default)]
    pub cwd: Option<String>,
}

/// `POST .../kill`: the SDK sends the signal's number.
#[derive(Debug, Deserialize)]
pub struct KillRequest {
    #[serde(default)]
    pub signal: Option<serde_json::Value>,
}

/// `POST .../extend-timeout`.
#[derive(Debug, Deserialize)]
pub struct ExtendRequest {
    pub duration: i64,
}

/// `POST .../snapshot`.
#[derive(Debug, Default, Deserialize)]
pub struct SnapshotRequest {
    #[serde(default)]
    pub expiration: Option<i64>,
}

/// List queries: 1.x pages by time (`since`, `until`), 3.x by cursor.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub since: Option<i64>,
    #[serde(default)]
    pub until: Option<i64>,
    #[serde(default)]
    pub cursor: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub name_prefix: Option<String>,
    #[serde(default)]
    pub tags: Option<String>,
    #[serde(default)]
    pub wait: Option<String>,
    #[serde(default)]
    pub resume: Option<String>,
}

/// A sandbox as 1.x sees it, and a session as 3.x does.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub id: String,
    pub memory: u64,
    pub vcpus: u32,
    pub region: &'static str,
    pub runtime: String,
    pub timeout: i64,
    pub status: &'static str,
    pub requested_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_snapshot_id: Option<String>,
    pub created_at: i64,
    pub cwd: &'static str,
    pub updated_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<serde_json::Value>,
}

/// Vercel's status of a sandbox. Vercel has no paused state: a paused sandbox with
/// `auto_resume` runs any command, file or terminal call (the daemon resumes it first), so it
/// is `running`; without it a command is refused as for a stopped session, and the 3.x SDK
/// then resumes it (`?resume=true`), so it is `stopped`.
pub fn status(s: &Sandbox) -> &'static str {
    match s.status {
        SandboxStatus::Paused if s.lifecycle.auto_resume => "running",
        SandboxStatus::Paused => "stopped",
        SandboxStatus::Pending => "pending",
        SandboxStatus::Running => "running",
        SandboxStatus::Stopping => "stopping",
        SandboxStatus::Stopped => "stopped",
        SandboxStatus::Failed => "failed",
    }
}

impl From<&Sandbox> for Session {
    fn from(s: &Sandbox) -> Self {
        let updated = [Some(s.created_at), s.started_at, s.stopped_at]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(s.created_at);
        Self {
            id: s.id.clone(),
            memory: s.memory_mib,
            vcpus: s.vcpus,
            region: REGION,
            runtime: runtime::of_image(&s.image).to_owned(),
            timeout: s.timeout_ms,
            status: status(s),
            requested_at: s.created_at,
            started_at: s.started_at,
            stopped_at: s.stopped_at,
            duration: s.started_at.zip(s.stopped_at).map(|(a, b)| b - a),
            source_snapshot_id: match &s.source {
                Some(belljar_api::Source::Snapshot { snapshot_id }) => Some(snapshot_id.clone()),
                _ => None,
            },
            created_at: s.created_at,
            cwd: runtime::CWD,
            updated_at: updated,
            network_policy: s.network_policy.as_ref().map(super::policy::to_vercel),
        }
    }
}

/// 3.x's named sandbox; its current session is the daemon's sandbox.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedSandbox {
    pub name: String,
    pub persistent: bool,
    pub region: &'static str,
    pub vcpus: u32,
    pub memory: u64,
    pub runtime: String,
    pub timeout: i64,
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    pub current_session_id: String,
    pub status: &'static str,
    pub cwd: &'static str,
    pub tags: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<serde_json::Value>,
    /// The sandbox's snapshot policy ([`NamedSandbox::with_policy`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_expiration: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_last_snapshots: Option<KeepLast>,
}

impl NamedSandbox {
    /// With the sandbox's snapshot policy, which the daemon keeps beside the sandbox.
    pub fn with_policy(
        mut self,
        policy: (Option<i64>, Option<belljar_api::KeepLastSnapshots>),
    ) -> Self {
        self.snapshot_expiration = policy.0;
        self.keep_last_snapshots = policy.1.map(|k| KeepLast {
            count: k.count,
            expiration: k.expiration_ms,
            delete_evicted: k.delete_evicted,
        });
        self
    }
}

impl From<&Sandbox> for NamedSandbox {
    fn from(s: &Sandbox) -> Self {
        let session = Session::from(s);
        Self {
            name: s.name.clone().unwrap_or_else(|| s.id.clone()),
            persistent: s.lifecycle.persistent,
            region: REGION,
            vcpus: s.vcpus,
            memory: s.memory_mib,
            runtime: session.runtime,
            timeout: s.timeout_ms,
            created_at: s.created_at,
            updated_at: session.updated_at,
            expires_at: s.expires_at,
            current_session_id: s.id.clone(),
            status: session.status,
            cwd: runtime::CWD,
            tags: s.tags.clone(),
            network_policy: session.network_policy,
            snapshot_expiration: None,
            keep_last_snapshots: None,
        }
    }
}

/// A forwarded port.
#[derive(Debug, Serialize)]
pub struct Route {
    pub url: String,
    pub subdomain: String,
    pub port: u16,
}

/// A command; 1.x names its sandbox `sandboxId`, 3.x its session `sessionId`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireCommand {
    pub id: String,
    pub name: String,
    pub args: Vec<String>,
    pub cwd: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    pub started_at: i64,
}

/// Which SDK line an answer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    V1,
    V2,
}

/// The exit code Vercel reports: the process's, `128 + signal` for one a signal ended (as a
/// shell reports it), and 255 for one lost with its sandbox; `null` while it runs.
pub fn exit_code(c: &Command) -> Option<i32> {
    match c.status {
        CommandStatus::Pending | CommandStatus::Running => None,
        CommandStatus::Exited => c.exit_code.or(c.signal.map(|s| 128 + s)).or(Some(255)),
        CommandStatus::Lost => Some(255),
    }
}

impl WireCommand {
    pub fn new(c: &Command, line: Line) -> Self {
        let (sandbox_id, session_id) = match line {
            Line::V1 => (Some(c.sandbox_id.clone()), None),
            Line::V2 => (None, Some(c.sandbox_id.clone())),
        };
        Self {
            id: c.id.clone(),
            name: c.argv.first().cloned().unwrap_or_default(),
            args: c.argv.iter().skip(1).cloned().collect(),
            cwd: c.cwd.clone(),
            sandbox_id,
            session_id,
            exit_code: exit_code(c),
            duration_ms: c.finished_at.map(|f| f - c.started_at),
            started_at: c.started_at,
        }
    }
}

/// A snapshot; 1.x names its source `sourceSandboxId`, 3.x `sourceSessionId`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSnapshot {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_sandbox_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_session_id: Option<String>,
    pub region: &'static str,
    pub status: &'static str,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

impl WireSnapshot {
    pub fn new(s: &Snapshot, line: Line) -> Self {
        let (source_sandbox_id, source_session_id) = match line {
            Line::V1 => (Some(s.source_sandbox_id.clone()), None),
            Line::V2 => (None, Some(s.source_sandbox_id.clone())),
        };
        Self {
            id: s.id.clone(),
            source_sandbox_id,
            source_session_id,
            region: REGION,
            status: match s.status {
                SnapshotStatus::Created => "created",
                SnapshotStatus::Deleted => "deleted",
                SnapshotStatus::Failed => "failed",
            },
            size_bytes: s.size_bytes,
            expires_at: s.expires_at,
            created_at: s.created_at,
            updated_at: s.created_at,
            parent_id: s.parent.clone(),
        }
    }
}

/// 1.x pagination: `next` is the `until` of the next page (a creation time), or `null`.
#[derive(Debug, Serialize)]
pub struct TimePagination {
    pub count: usize,
    pub next: Option<i64>,
    pub prev: Option<i64>,
}

/// 3.x pagination: an opaque cursor.
#[derive(Debug, Serialize)]
pub struct CursorPagination {
    pub count: usize,
    pub next: Option<String>,
}

/// An NDJSON line of command output.
#[derive(Debug, Serialize)]
pub struct LogLine<'a> {
    pub stream: &'a str,
    pub data: String,
}

/// The NDJSON line that ends a log stream early.
#[derive(Debug, Serialize)]
pub struct LogError {
    pub stream: &'static str,
    pub data: ErrorData,
}

#[derive(Debug, Serialize)]
pub struct ErrorData {
    pub code: String,
    pub message: String,
}
