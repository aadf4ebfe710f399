//! The MCP tools themselves: each takes its parameters, makes the API calls through the typed
//! client, and answers the API's JSON (or its error body).

use std::time::Duration;

use base64::Engine;
use belljar_api::{
    AddPort, CreateSandbox, CreateSnapshot, ListSandboxesQuery, ListSnapshotsQuery, NetworkPolicy,
    RunCommand, SandboxStatus, Source, Stream,
};
use belljar_client::{Client, full, log_bytes};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};

use super::params::{
    CreateParams, FileContent, ListParams, ListSnapshotsParams, Parameters, PathParams,
    PolicyParams, PortParams, RunOutput, RunParams, SandboxParams, SnapshotParams, WriteParams,
};
use super::{ToolError, answer};

/// The largest file `read_file` hands to a model in one answer.
const MAX_READ: u64 = 4 << 20;

/// The most output of each stream `run_command` answers; the logs keep the rest.
const MAX_OUTPUT: usize = 1 << 20;

/// The MCP server: one daemon client and the tool table.
#[derive(Clone)]
pub struct Belljar {
    client: Client,
    tool_router: ToolRouter<Self>,
}

impl Belljar {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            tool_router: Self::tool_router(),
        }
    }
}

#[tool_router]
impl Belljar {
    #[tool(
        description = "Create a local Linux sandbox (optionally from a snapshot) and return it once it runs."
    )]
    async fn create_sandbox(&self, Parameters(p): Parameters<CreateParams>) -> CallToolResult {
        answer(async { self.create(p?).await }.await)
    }

    #[tool(description = "List sandboxes, newest first.")]
    async fn list_sandboxes(&self, Parameters(p): Parameters<ListParams>) -> CallToolResult {
        answer(async { self.list(p?).await }.await)
    }

    #[tool(description = "Show one sandbox.")]
    async fn get_sandbox(&self, Parameters(p): Parameters<SandboxParams>) -> CallToolResult {
        answer(async { Ok(self.client.sandbox(&p?.sandbox_id).await?) }.await)
    }

    #[tool(description = "Stop a sandbox; its files and logs stay until it is deleted.")]
    async fn stop_sandbox(&self, Parameters(p): Parameters<SandboxParams>) -> CallToolResult {
        answer(async { Ok(self.client.stop_sandbox(&p?.sandbox_id).await?) }.await)
    }

    #[tool(description = "Delete a sandbox, stopping it first.")]
    async fn delete_sandbox(&self, Parameters(p): Parameters<SandboxParams>) -> CallToolResult {
        answer(
            async {
                let id = p?.sandbox_id;
                self.client.delete_sandbox(&id).await?;
                Ok(serde_json::json!({ "deleted": id }))
            }
            .await,
        )
    }

    #[tool(
        description = "Run a command in a sandbox and wait for it; returns exit code, stdout and stderr."
    )]
    async fn run_command(&self, Parameters(p): Parameters<RunParams>) -> CallToolResult {
        answer(async { self.run(p?).await }.await)
    }

    #[tool(description = "Read a file from a sandbox (UTF-8 text, else base64).")]
    async fn read_file(&self, Parameters(p): Parameters<PathParams>) -> CallToolResult {
        answer(async { self.read(p?).await }.await)
    }

    #[tool(description = "Write a file in a sandbox, creating missing parent directories.")]
    async fn write_file(&self, Parameters(p): Parameters<WriteParams>) -> CallToolResult {
        answer(async { self.write(p?).await }.await)
    }

    #[tool(description = "List a directory in a sandbox.")]
    async fn list_files(&self, Parameters(p): Parameters<PathParams>) -> CallToolResult {
        answer(
            async {
                let p = p?;
                Ok(self
                    .client
                    .list_files(&p.sandbox_id, &p.path, None, None)
                    .await?)
            }
            .await,
        )
    }

    #[tool(
        description = "Snapshot a sandbox's files. The sandbox stops unless keep_running; restore with create_sandbox's snapshot_id."
    )]
    async fn snapshot_sandbox(&self, Parameters(p): Parameters<SnapshotParams>) -> CallToolResult {
        answer(
            async {
                let p = p?;
                let req = CreateSnapshot {
                    keep_running: Some(p.keep_running),
                    expiration_ms: None,
                    path: None,
                };
                Ok(self.client.snapshot_sandbox(&p.sandbox_id, &req).await?)
            }
            .await,
        )
    }

    #[tool(
        description = "Replace a sandbox's firewall while it runs; returns its network (policy, ports, bytes)."
    )]
    async fn set_network_policy(&self, Parameters(p): Parameters<PolicyParams>) -> CallToolResult {
        answer(
            async {
                let p = p?;
                let policy = policy_of(p.policy)?;
                self.client
                    .set_network_policy(&p.sandbox_id, &policy)
                    .await?;
                Ok(self.client.network(&p.sandbox_id).await?)
            }
            .await,
        )
    }

    #[tool(
        description = "Expose a TCP port of a sandbox on this machine's 127.0.0.1; returns the URL to reach it."
    )]
    async fn expose_port(&self, Parameters(p): Parameters<PortParams>) -> CallToolResult {
        answer(
            async {
                let p = p?;
                let req = AddPort {
                    port: p.port,
                    host_port: None,
                };
                Ok(self.client.add_port(&p.sandbox_id, &req).await?)
            }
            .await,
        )
    }

    #[tool(description = "List snapshots, newest first.")]
    async fn list_snapshots(
        &self,
        Parameters(p): Parameters<ListSnapshotsParams>,
    ) -> CallToolResult {
        answer(
            async {
                let q = ListSnapshotsQuery {
                    sandbox_id: p?.sandbox_id,
                    ..Default::default()
                };
                Ok(self.client.list_snapshots(&q).await?)
            }
            .await,
        )
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Belljar {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder().enable_tools().build();
        ServerConfig::new(caps)
            .with_server_info(Implementation::new("belljar", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Belljar runs disposable Linux sandboxes on this machine. Create one, run commands \
             and move files in it, snapshot it and start new sandboxes from the snapshot, and \
             stop or delete it when done. Errors carry the daemon's stable code.",
            )
    }
}

impl Belljar {
    async fn create(&self, p: CreateParams) -> Result<belljar_api::Sandbox, ToolError> {
        let timeout_ms = match p.timeout_seconds {
            Some(s) => Some(
                i64::try_from(s)
                    .ok()
                    .and_then(|s| s.checked_mul(1000))
                    .ok_or_else(|| ToolError::BadRequest("timeout_seconds is too large".into()))?,
            ),
            None => None,
        };
        let req = CreateSandbox {
            image: p.image,
            timeout_ms,
            env: p.env,
            tags: p.tags,
            name: p.name,
            source: p
                .snapshot_id
                .map(|snapshot_id| Source::Snapshot { snapshot_id }),
            network_policy: p.network_policy.map(policy_of).transpose()?,
            volumes: p.volumes.map(|v| {
                v.into_iter()
                    .map(|v| belljar_api::VolumeMount {
                        source: v.source,
                        path: v.path,
                        read_only: v.read_only,
                    })
                    .collect()
            }),
            ..Default::default()
        };
        Ok(self.client.create_sandbox(&req).await?)
    }

    /// Every matching sandbox (all pages), as `{"sandboxes": [...]}`: MCP's structured
    /// content must be an object.
    async fn list(&self, p: ListParams) -> Result<serde_json::Value, ToolError> {
        let status = match p.status {
            Some(s) => Some(s.parse::<SandboxStatus>().map_err(|_| {
                ToolError::BadRequest(format!(
                    "status {s:?}: expected pending, running, paused, stopping, stopped or failed"
                ))
            })?),
            None => None,
        };
        let q = ListSandboxesQuery {
            status,
            tag: p.tag,
            ..Default::default()
        };
        let all = self.client.all_sandboxes(&q).await?;
        Ok(serde_json::json!({ "sandboxes": all }))
    }

    async fn run(&self, p: RunParams) -> Result<RunOutput, ToolError> {
        let id = p.sandbox_id;
        let req = RunCommand {
            argv: p.argv,
            cwd: p.cwd,
            env: p.env,
            sudo: p.sudo,
            detached: true,
            ..Default::default()
        };
        let started = self.client.run_command(&id, &req).await?;
        let wait = self.client.wait_command(&id, &started.id);
        let (done, timed_out) = match p.timeout_seconds {
            None => (wait.await?, false),
            Some(secs) => match tokio::time::timeout(Duration::from_secs(secs), wait).await {
                Ok(done) => (done?, false),
                Err(_) => {
                    self.client
                        .kill_command(&id, &started.id, Some("KILL"))
                        .await?;
                    (self.client.wait_command(&id, &started.id).await?, true)
                }
            },
        };
        let mut out = (Vec::new(), Vec::new());
        let mut omitted = 0u64;
        let mut logs = self.client.command_logs(&id, &started.id, false).await?;
        while let Some(line) = logs
            .next()
            .await
            .map_err(belljar_client::ClientError::from)?
        {
            let buf = match line.stream {
                Stream::Stdout => &mut out.0,
                Stream::Stderr => &mut out.1,
            };
            let bytes = log_bytes(&line);
            let room = MAX_OUTPUT.saturating_sub(buf.len()).min(bytes.len());
            buf.extend_from_slice(&bytes[..room]);
            omitted += (bytes.len() - room) as u64;
        }
        Ok(RunOutput {
            command_id: done.id,
            exit_code: done.exit_code,
            signal: done.signal,
            stdout: String::from_utf8_lossy(&out.0).into_owned(),
            stderr: String::from_utf8_lossy(&out.1).into_owned(),
            timed_out,
            output_omitted_bytes: omitted + done.output_truncated_bytes,
        })
    }

    async fn read(&self, p: PathParams) -> Result<FileContent, ToolError> {
        let entry = self.client.stat(&p.sandbox_id, &p.path).await?;
        if entry.size > MAX_READ {
            return Err(ToolError::TooLarge {
                path: p.path,
                size: entry.size,
                max: MAX_READ,
            });
        }
        let bytes = self.client.read_file_bytes(&p.sandbox_id, &p.path).await?;
        let (encoding, content) = match String::from_utf8(bytes.to_vec()) {
            Ok(text) => ("utf8", text),
            Err(_) => (
                "base64",
                base64::engine::general_purpose::STANDARD.encode(&bytes),
            ),
        };
        Ok(FileContent {
            path: entry.path,
            size: bytes.len() as u64,
            encoding,
            content,
        })
    }

    async fn write(&self, p: WriteParams) -> Result<belljar_api::FileEntry, ToolError> {
        let data = match p.encoding.as_deref() {
            None | Some("utf8") => p.content.into_bytes(),
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(p.content.as_bytes())
                .map_err(|e| ToolError::BadRequest(format!("content is not base64: {e}")))?,
            Some(other) => {
                return Err(ToolError::BadRequest(format!(
                    "encoding {other:?}: expected utf8 or base64"
                )));
            }
        };
        let mode = match p.mode.as_deref() {
            None => None,
            Some(m) => Some(u32::from_str_radix(m, 8).map_err(|_| {
                ToolError::BadRequest(format!("mode {m:?}: expected octal bits such as 644"))
            })?),
        };
        let written = self
            .client
            .write_file(&p.sandbox_id, &p.path, mode, full(data))
            .await?;
        Ok(written)
    }
}

/// A policy from an agent's JSON; the daemon checks the rest (patterns, CIDRs).
fn policy_of(value: serde_json::Value) -> Result<NetworkPolicy, ToolError> {
    serde_json::from_value(value).map_err(|e| {
        ToolError::BadRequest(format!(
            "network_policy: expected \"allow-all\", \"deny-all\" or {{allow, subnets}}: {e}"
        ))
    })
}
