//! The arguments of each MCP tool. Their doc comments become the JSON Schema descriptions an
//! agent reads, so they say what a model needs to call the tool right.

use std::collections::BTreeMap;

use rmcp::ErrorData;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A tool's arguments, or why they do not fit its schema. rmcp's own extractor turns a
/// mismatch into a JSON-RPC protocol error; this one hands it to the tool, which answers a
/// `bad_request` tool error with the API's error body, as for every other bad input. (Named
/// `Parameters` because rmcp's `#[tool]` finds a tool's input schema by that name.)
pub struct Parameters<P>(pub Result<P, BadArguments>);

/// Arguments that do not fit a tool's schema.
#[derive(Debug, thiserror::Error)]
#[error("Invalid arguments: {0}")]
pub struct BadArguments(String);

impl<P: JsonSchema> JsonSchema for Parameters<P> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        P::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        P::json_schema(generator)
    }
}

impl<S, P: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let arguments = context.arguments.take().unwrap_or_default();
        let parsed = serde_json::from_value(serde_json::Value::Object(arguments))
            .map_err(|e| BadArguments(e.to_string()));
        Ok(Self(parsed))
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    /// Image: `base` (Debian, default), `python3.13`, `node24` or `node22`.
    pub image: Option<String>,
    /// Seconds until the sandbox stops by itself (default 300).
    pub timeout_seconds: Option<u64>,
    /// Environment variables of every command in the sandbox.
    pub env: Option<BTreeMap<String, String>>,
    /// Tags (key/value) to find the sandbox by later.
    pub tags: Option<BTreeMap<String, String>>,
    /// A name for the sandbox.
    pub name: Option<String>,
    /// Restore a snapshot: the new sandbox starts with that snapshot's files (`snap_...`).
    pub snapshot_id: Option<String>,
    /// The firewall (see set_network_policy); default "allow-all".
    pub network_policy: Option<serde_json::Value>,
    /// Host folders (absolute paths) and named volumes mounted into the sandbox, two-way and
    /// live; a folder must be one this user may read (and write, unless read_only).
    pub volumes: Option<Vec<VolumeParams>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeParams {
    /// An absolute host path, or a named volume's name.
    pub source: String,
    /// Absolute path in the sandbox.
    pub path: String,
    /// Mount read-only (default false).
    pub read_only: Option<bool>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only sandboxes in this status: pending, running, paused, stopping, stopped or failed.
    pub status: Option<String>,
    /// Only sandboxes carrying this tag, as `key=value`.
    pub tag: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
    /// Program and arguments, e.g. ["ls", "-la"]. For shell syntax (pipes, &&) use
    /// ["bash", "-lc", "your command"].
    pub argv: Vec<String>,
    /// Working directory (default /workspace).
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    pub env: Option<BTreeMap<String, String>>,
    /// Run as root.
    #[serde(default)]
    pub sudo: bool,
    /// Kill the command (SIGKILL) if it runs longer than this many seconds.
    pub timeout_seconds: Option<u64>,
}

/// What `run_command` answers.
#[derive(Debug, Serialize)]
pub struct RunOutput {
    pub command_id: String,
    /// The exit status; absent when a signal ended the command.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Whether the command was killed because it outlived `timeout_seconds`.
    pub timed_out: bool,
    /// Output bytes left out of this answer (`belljar logs` has them all).
    pub output_omitted_bytes: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// What `read_file` answers.
#[derive(Debug, Serialize)]
pub struct FileContent {
    pub path: String,
    pub size: u64,
    /// `utf8` (content is the text) or `base64` (the file is not UTF-8).
    pub encoding: &'static str,
    pub content: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
    /// Absolute path inside the sandbox; missing parent directories are created.
    pub path: String,
    /// The file's new content.
    pub content: String,
    /// `utf8` (default) or `base64` for binary content.
    pub encoding: Option<String>,
    /// Permission bits in octal, e.g. "755".
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
    /// Keep the sandbox running (its processes are frozen while the files are captured);
    /// by default the sandbox stops.
    #[serde(default)]
    pub keep_running: bool,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSnapshotsParams {
    /// Only snapshots taken of this sandbox.
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
    /// "allow-all", "deny-all", or rules: {"allow": ["example.com", "*.example.org"],
    /// "subnets": {"allow": ["10.0.0.0/8"], "deny": ["10.0.0.9"]}} (deny wins; everything
    /// else is denied).
    pub policy: serde_json::Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortParams {
    /// The sandbox's id (`sbx_...`).
    pub sandbox_id: String,
    /// The TCP port a server in the sandbox listens on.
    pub port: u32,
}
