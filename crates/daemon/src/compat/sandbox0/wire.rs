//! Sandbox0's wire types, as its API description (and so its generated SDKs) write them:
//! requests the layer reads and the `{ "success": true, "data": ... }` answers it writes.
//!
//! Requests ignore fields a newer SDK adds, as Sandbox0's API does. Times are RFC 3339 in
//! UTC. Fields the layer refuses (see `docs/compat.md`) are read only to be named in the
//! refusal.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Every successful answer.
#[derive(Debug, Serialize)]
pub struct Success<T> {
    pub success: bool,
    pub data: T,
}

impl<T> Success<T> {
    pub fn new(data: T) -> Self {
        Self {
            success: true,
            data,
        }
    }
}

/// `POST /api/v1/sandboxes`.
#[derive(Debug, Deserialize)]
pub struct ClaimRequest {
    pub template: String,
    #[serde(default)]
    pub snapshot_id: Option<String>,
    #[serde(default)]
    pub config: Option<SandboxConfig>,
}

/// A sandbox's configuration at its claim.
#[derive(Debug, Default, Deserialize)]
pub struct SandboxConfig {
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub resources: Option<Resources>,
    /// Seconds until the soft limit pauses it; 0 disables it.
    #[serde(default)]
    pub ttl: Option<i64>,
    /// Seconds until it is deleted; 0 disables it.
    #[serde(default)]
    pub hard_ttl: Option<i64>,
    #[serde(default)]
    pub network: Option<NetworkPolicy>,
    #[serde(default)]
    pub webhook: Option<WebhookConfig>,
    #[serde(default)]
    pub auto_resume: Option<bool>,
    #[serde(default)]
    pub services: Option<Vec<Service>>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Resources {
    /// A Kubernetes quantity: `512Mi`, `2Gi`, `1G`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct WebhookConfig {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub watch_dir: Option<String>,
}

/// `PUT /api/v1/sandboxes/{id}`.
#[derive(Debug, Default, Deserialize)]
pub struct UpdateRequest {
    #[serde(default)]
    pub config: Option<UpdateConfig>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UpdateConfig {
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub ttl: Option<i64>,
    #[serde(default)]
    pub hard_ttl: Option<i64>,
    #[serde(default)]
    pub auto_resume: Option<bool>,
    #[serde(default)]
    pub services: Option<Vec<Service>>,
    /// Sandbox0 documents it as updatable here too (its SDKs use `PUT .../network`).
    #[serde(default)]
    pub network: Option<NetworkPolicy>,
    /// Refused: these take effect at the claim only.
    #[serde(default)]
    pub env_vars: Option<serde_json::Value>,
    #[serde(default)]
    pub webhook: Option<serde_json::Value>,
}

/// `POST /api/v1/sandboxes/{id}/refresh`.
#[derive(Debug, Default, Deserialize)]
pub struct RefreshRequest {
    /// Seconds; default the configured TTL.
    #[serde(default)]
    pub duration: Option<i64>,
}

/// `POST .../pause` and `.../resume`.
#[derive(Debug, Default, Deserialize)]
pub struct ExecutionStateRequest {
    /// Keep (pause) or restore (resume) the processes' memory too.
    #[serde(default)]
    pub memory: Option<bool>,
}

/// `GET /api/v1/sandboxes`.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub template_id: Option<String>,
    #[serde(default)]
    pub paused: Option<bool>,
    #[serde(default)]
    pub limit: Option<u32>,
    #[serde(default)]
    pub offset: Option<u32>,
}

/// A sandbox's lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Starting,
    Running,
    Paused,
    Terminating,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Terminating => "terminating",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ClaimResponse {
    pub sandbox_id: String,
    pub status: Status,
    pub runtime_id: String,
    pub template: String,
}

/// `GET /api/v1/sandboxes/{id}`.
#[derive(Debug, Serialize)]
pub struct SandboxView {
    pub id: String,
    pub template_id: String,
    pub team_id: String,
    pub user_id: String,
    pub status: Status,
    pub paused: bool,
    pub auto_resume: bool,
    pub runtime_id: String,
    pub runtime_generation: i64,
    pub claimed_at: String,
    pub created_at: String,
    pub updated_at: String,
    pub services: Vec<Service>,
    pub resources: Resources,
    pub expires_at: Option<String>,
    pub hard_expires_at: Option<String>,
}

/// `GET /api/v1/sandboxes/{id}/status`.
#[derive(Debug, Serialize)]
pub struct StatusView {
    pub sandbox_id: String,
    pub template_id: String,
    pub team_id: String,
    pub user_id: String,
    pub runtime_id: String,
    pub status: Status,
    pub claimed_at: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub hard_expires_at: Option<String>,
}

/// One sandbox of a list.
#[derive(Debug, Serialize)]
pub struct SummaryView {
    pub id: String,
    pub template_id: String,
    pub status: Status,
    pub paused: bool,
    pub runtime_generation: i64,
    pub created_at: String,
    pub updated_at: String,
    pub expires_at: Option<String>,
    pub hard_expires_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ListData {
    pub sandboxes: Vec<SummaryView>,
    /// All matching sandboxes, not only this page's.
    pub count: usize,
    pub has_more: bool,
}

#[derive(Debug, Serialize)]
pub struct MessageData {
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct RefreshData {
    pub sandbox_id: String,
    pub expires_at: Option<String>,
    pub hard_expires_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PauseData {
    pub sandbox_id: String,
    pub paused: bool,
    pub status: Status,
}

#[derive(Debug, Serialize)]
pub struct ResumeData {
    pub sandbox_id: String,
    pub resumed: bool,
}

/// A Sandbox Service: a sandbox port published over HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default)]
    pub ingress: Ingress,
    /// Refused unless `manual`: the layer exposes ports, it does not run their processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<ServiceRuntime>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ingress {
    #[serde(default)]
    pub public: bool,
    /// Routes (auth, CORS, rate limits) are refused: a port is published whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRuntime {
    #[serde(rename = "type")]
    pub kind: String,
}

/// `PUT /api/v1/sandboxes/{id}/services`.
#[derive(Debug, Deserialize)]
pub struct ServicesUpdate {
    pub services: Vec<Service>,
}

/// A service as `GET .../services` shows it.
#[derive(Debug, Serialize)]
pub struct ServiceView {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    pub port: u32,
    pub ingress: Ingress,
    pub publishable: bool,
    /// Where the port is reachable on this machine: `http://127.0.0.1:<host port>/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ServicesData {
    pub sandbox_id: String,
    pub services: Vec<ServiceView>,
}

/// A sandbox's network policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
    /// Refused: credentials go through the daemon's own brokering.
    #[serde(
        default,
        rename = "credentialBindings",
        skip_serializing_if = "Option::is_none"
    )]
    pub credential_bindings: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    #[default]
    AllowAll,
    BlockAll,
}

/// Egress lists: in `allow-all` the `denied*` ones apply, in `block-all` the `allowed*` ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Egress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cidrs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_domains: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_cidrs: Option<Vec<String>>,
    /// The rest are refused (the daemon's firewall has no domain deny-list, ports or
    /// protocol rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_domains: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_ports: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_ports: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_rules: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_rules: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_rules: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<serde_json::Value>,
}

/// `POST .../contexts`.
#[derive(Debug, Default, Deserialize)]
pub struct CreateContextRequest {
    #[serde(default, rename = "type")]
    pub kind: Option<ContextKind>,
    #[serde(default)]
    pub repl: Option<ReplRequest>,
    #[serde(default)]
    pub cmd: Option<CmdRequest>,
    #[serde(default)]
    pub wait_until_done: Option<bool>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub pty_size: Option<PtySize>,
    #[serde(default)]
    pub idle_timeout_sec: Option<i64>,
    #[serde(default)]
    pub ttl_sec: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextKind {
    Cmd,
    Repl,
}

#[derive(Debug, Default, Deserialize)]
pub struct ReplRequest {
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default)]
    pub input: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct CmdRequest {
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct PtySize {
    #[serde(default)]
    pub rows: Option<u16>,
    #[serde(default)]
    pub cols: Option<u16>,
}

/// A context as every context answer shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ContextView {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: ContextKind,
    pub running: bool,
    pub paused: bool,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    pub cwd: String,
    pub env_vars: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_raw: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ContextList {
    pub contexts: Vec<ContextView>,
}

/// `POST .../contexts/{ctx}/exec` and `.../input`.
#[derive(Debug, Deserialize)]
pub struct ContextInput {
    pub data: String,
}

#[derive(Debug, Serialize)]
pub struct ExecData {
    pub output_raw: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ResizeRequest {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Deserialize)]
pub struct SignalRequest {
    pub signal: String,
}

/// The answers of the form `{ "<verb>": true }`.
#[derive(Debug, Default, Serialize)]
pub struct Done {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moved: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resized: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signaled: Option<bool>,
}

/// What a client sends on a context's WebSocket.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WsInput {
    Input {
        #[serde(default)]
        data: String,
        #[serde(default)]
        request_id: Option<String>,
    },
    Resize {
        rows: u16,
        cols: u16,
    },
    Signal {
        signal: String,
    },
}

/// What the layer sends on a context's WebSocket.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WsOutput {
    Output {
        source: &'static str,
        data: String,
    },
    Done {
        #[serde(skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        state: Option<String>,
    },
    Error {
        error: String,
    },
}

/// `?path=` of the file routes, with `mkdir` and `recursive` for `POST .../files`.
#[derive(Debug, Deserialize)]
pub struct PathQuery {
    pub path: String,
    #[serde(default)]
    pub mkdir: Option<bool>,
    #[serde(default)]
    pub recursive: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub size: u64,
    /// Octal permission bits, e.g. `0644`.
    pub mode: String,
    pub mod_time: String,
    pub is_link: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct FileList {
    pub entries: Vec<FileInfo>,
}

#[derive(Debug, Deserialize)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

/// What a client sends on the file watch WebSocket.
#[derive(Debug, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum WatchRequest {
    Subscribe {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    Unsubscribe {
        watch_id: String,
    },
}

/// What the layer sends on the file watch WebSocket.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchMessage {
    Subscribed {
        watch_id: String,
        path: String,
    },
    Unsubscribed {
        watch_id: String,
    },
    Event {
        watch_id: String,
        event: &'static str,
        path: String,
    },
    Error {
        error: String,
    },
}

/// `POST .../snapshots`.
#[derive(Debug, Default, Deserialize)]
pub struct CreateSnapshotRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    pub expires_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SnapshotView {
    pub id: String,
    pub sandbox_id: String,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
    pub count: usize,
}

#[derive(Debug, Deserialize)]
pub struct RestoreRequest {
    pub snapshot_id: String,
}

#[derive(Debug, Serialize)]
pub struct RestoreData {
    pub sandbox_id: String,
    pub snapshot_id: String,
    pub status: Status,
}

#[derive(Debug, Default, Deserialize)]
pub struct ForkRequest {
    #[serde(default)]
    pub memory: Option<bool>,
    #[serde(default)]
    pub config: Option<ForkConfig>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ForkConfig {
    #[serde(default)]
    pub ttl: Option<i64>,
    #[serde(default)]
    pub hard_ttl: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct ForkData {
    pub source_sandbox_id: String,
    pub sandbox: SandboxView,
}

/// `GET .../logs`.
#[derive(Debug, Default, Deserialize)]
pub struct LogsQuery {
    #[serde(default)]
    pub container: Option<String>,
    #[serde(default)]
    pub tail_lines: Option<i64>,
    #[serde(default)]
    pub limit_bytes: Option<i64>,
    #[serde(default)]
    pub follow: Option<bool>,
    #[serde(default)]
    pub previous: Option<bool>,
    #[serde(default)]
    pub timestamps: Option<bool>,
    #[serde(default)]
    pub since_seconds: Option<i64>,
}
