//! E2B's wire types: the control plane's REST bodies (camelCase, as E2B's OpenAPI document
//! spells them) and envd's Connect messages in protobuf's JSON mapping (the SDKs' JSON codec:
//! camelCase names, 64-bit integers as strings, bytes as base64, enums by name, a oneof as
//! the one field that is set).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

// ---- control plane ----

/// `POST /sandboxes` and `/v2/sandboxes`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Seconds.
    pub timeout: Option<i64>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    pub auto_pause: Option<bool>,
    pub volume_mounts: Option<Vec<serde_json::Value>>,
    pub mcp: Option<serde_json::Value>,
}

/// The outbound rules of `network` (the rest of it has no counterpart here).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
}

/// A created or connected sandbox.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub envd_version: &'static str,
    pub envd_access_token: String,
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}` and the items of `GET /v2/sandboxes`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub alias: Option<String>,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: &'static str,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
}

/// `GET /v2/sandboxes` query.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    /// `k=v&k2=v2`, each part URL-encoded.
    pub metadata: Option<String>,
    /// `running`, `paused`, or both separated by commas.
    pub state: Option<String>,
    pub next_token: Option<String>,
    pub limit: Option<u32>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub struct TimeoutRequest {
    /// Seconds from now.
    pub timeout: i64,
}

/// `POST /sandboxes/{id}/connect` (and `/v2/...`, `/resume`).
#[derive(Debug, Default, Deserialize)]
pub struct ConnectRequest {
    pub timeout: Option<i64>,
}

/// A control-plane error, as E2B's API answers one.
#[derive(Debug, Serialize)]
pub struct ApiErrorBody {
    pub code: u16,
    pub message: String,
}

// ---- envd: Connect protocol ----

/// A Connect error (the body of a unary error, the `error` of a stream's end).
#[derive(Debug, Serialize)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

/// The last message of a server stream.
#[derive(Debug, Serialize)]
pub struct EndOfStream {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
}

/// An empty message.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Empty {}

// ---- envd: process.Process ----

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PtyRequest {
    pub size: Option<PtySizeMsg>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PtySizeMsg {
    pub cols: u32,
    pub rows: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    pub process: ProcessConfig,
    pub pty: Option<PtyRequest>,
    pub tag: Option<String>,
    pub stdin: Option<bool>,
}

/// Which process: by pid or by tag.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProcessSelector {
    pub pid: Option<u32>,
    pub tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SelectRequest {
    pub process: ProcessSelector,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct UpdateRequest {
    pub process: ProcessSelector,
    pub pty: Option<PtyRequest>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProcessInput {
    /// Base64.
    pub stdin: Option<String>,
    /// Base64.
    pub pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    /// `SIGNAL_SIGKILL`, `SIGNAL_SIGTERM` (or their numbers).
    pub signal: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// `StartResponse` and `ConnectResponse`: `{ "event": ProcessEvent }`.
#[derive(Debug, Serialize)]
pub struct ProcessEventBody {
    pub event: ProcessEvent,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    Start { pid: u32 },
    Data(DataEvent),
    End(EndEvent),
    Keepalive(Empty),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DataEvent {
    Stdout(String),
    Stderr(String),
    Pty(String),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

// ---- envd: filesystem.Filesystem ----

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PathRequest {
    pub path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ListDirRequest {
    pub path: String,
    pub depth: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    /// `FILE_TYPE_FILE`, `FILE_TYPE_DIRECTORY`, `FILE_TYPE_SYMLINK`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
    /// int64, so a string.
    pub size: String,
    pub mode: u32,
    pub permissions: String,
    pub owner: String,
    pub group: String,
    pub modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct EntryBody {
    pub entry: EntryInfo,
}

#[derive(Debug, Serialize)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

/// What `POST /files` answers for each file written.
#[derive(Debug, Serialize)]
pub struct WriteInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
}

/// `GET`/`POST /files` query.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
}

// ---- control plane: snapshots and forks ----

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SnapshotRequest {
    pub name: Option<String>,
    pub memory: Option<bool>,
}

/// A snapshot, which E2B starts sandboxes from as a template.
#[derive(Debug, Serialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// `GET /snapshots` query.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SnapshotsQuery {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: Option<String>,
    pub name: Option<String>,
    pub limit: Option<u32>,
    pub next_token: Option<String>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ForkRequest {
    /// Seconds.
    pub timeout: Option<i64>,
    pub count: Option<u32>,
}

/// One fork's outcome.
#[derive(Debug, Serialize)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<CreatedSandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiErrorBody>,
}

/// One sample of `GET /sandboxes/{id}/metrics`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}
