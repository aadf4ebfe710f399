//! `belljar mcp`: a Model Context Protocol server over stdio, so that agents (coding
//! assistants, MCP clients) can create local sandboxes, run commands and move files in them,
//! and take and restore snapshots.
//!
//! It is a client of the daemon's API like the rest of the CLI (through `belljar-client`),
//! never a second path into sandboxes. Tools answer the API's JSON; a failure is a tool result
//! marked as an error whose structured content is the API's own
//! `{"error":{"code","message"}}`, so an agent sees the same stable code a script would.
//! Standard output carries only the protocol; nothing else may print there.

mod params;
mod tools;

use belljar_client::{Client, ClientError};
use rmcp::ServiceExt;
use rmcp::model::CallToolResult;
use serde::Serialize;

pub use tools::Belljar;

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The MCP session failed to start (a malformed handshake, a closed stdin).
    #[error("MCP session failed to start: {0}")]
    Start(String),
    /// The MCP session ended with an error.
    #[error("MCP session failed: {0}")]
    Session(String),
}

impl McpError {
    pub fn code(&self) -> &'static str {
        "mcp_error"
    }
}

/// Serves MCP on stdin/stdout until the client closes the session.
pub async fn serve(client: Client) -> Result<(), McpError> {
    let service = Belljar::new(client)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Start(e.to_string()))?;
    service
        .waiting()
        .await
        .map_err(|e| McpError::Session(e.to_string()))?;
    Ok(())
}

/// A failure of one tool call, with the stable code an agent can match.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The daemon refused or could not do it; carries the API's code.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// An argument the tool rejects before asking the daemon.
    #[error("{0}")]
    BadRequest(String),
    /// Arguments that do not fit the tool's schema.
    #[error(transparent)]
    Arguments(#[from] params::BadArguments),
    /// A file too big to hand to a model in one answer.
    #[error(
        "{path} is {size} bytes; read_file answers at most {max} (copy it out with `belljar cp`)"
    )]
    TooLarge { path: String, size: u64, max: u64 },
}

impl ToolError {
    pub fn code(&self) -> &str {
        match self {
            Self::Client(e) => e.code(),
            Self::BadRequest(_) | Self::Arguments(_) => "bad_request",
            Self::TooLarge { .. } => "payload_too_large",
        }
    }
}

/// A tool's answer: the value as structured content, or the error as the API's error body.
pub(crate) fn answer<T: Serialize>(result: Result<T, ToolError>) -> CallToolResult {
    match result.map(|v| serde_json::to_value(v)) {
        Ok(Ok(value)) => CallToolResult::structured(value),
        Ok(Err(e)) => error_result("internal", &e.to_string()),
        Err(e) => error_result(e.code(), &e.to_string()),
    }
}

fn error_result(code: &str, message: &str) -> CallToolResult {
    CallToolResult::structured_error(serde_json::json!({
        "error": { "code": code, "message": message }
    }))
}
