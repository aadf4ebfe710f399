//! Commands run inside a sandbox, and their output.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::ErrorCode;
use crate::limits::{self, Invalid, Validate};

/// Rows and columns of a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct PtySize {
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: u16,
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: u16,
}

impl Validate for PtySize {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range("rows", Some(self.rows), 1, limits::MAX_PTY_CELLS)?;
        limits::range("cols", Some(self.cols), 1, limits::MAX_PTY_CELLS)
    }
}

/// `POST /v1/sandboxes/{id}/commands`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// Program and arguments. Must not be empty; at most 4096 arguments of up to 32 KiB,
    /// 256 KiB in all.
    #[schema(schema_with = limits::argv_schema)]
    pub argv: Vec<String>,
    /// Default `/workspace`.
    #[serde(default)]
    #[ts(optional)]
    #[schema(min_length = 1, max_length = 4096)]
    pub cwd: Option<String>,
    /// Merged over the sandbox's env (the bounds of `CreateSandbox.env`).
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::env_schema, nullable)]
    pub env: Option<BTreeMap<String, String>>,
    /// Run as root instead of `belljar`.
    #[serde(default)]
    pub sudo: bool,
    /// Return at once with the running command instead of waiting for it to exit.
    #[serde(default)]
    pub detached: bool,
    /// Run on a pseudo-terminal of this size.
    #[serde(default)]
    #[ts(optional)]
    pub pty: Option<PtySize>,
    /// Keep stdin open for `POST .../stdin`.
    #[serde(default)]
    pub stdin: bool,
}

impl Validate for RunCommand {
    fn validate(&self) -> Result<(), Invalid> {
        limits::argv("argv", &self.argv)?;
        if let Some(cwd) = &self.cwd {
            limits::path("cwd", cwd)?;
        }
        limits::env("env", self.env.as_ref())?;
        self.pty.as_ref().map_or(Ok(()), |p| {
            p.validate()
                .map_err(|e| Invalid::new(format!("pty.{}", e.field), e.problem))
        })
    }
}

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
pub enum CommandStatus {
    /// Recorded by the daemon, not yet confirmed started by the sandbox's agent.
    Pending,
    Running,
    Exited,
    /// The sandbox ended while the command ran.
    Lost,
}

/// A command as every client sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct Command {
    /// `cmd_` followed by lowercase letters and digits.
    pub id: String,
    pub sandbox_id: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub user: String,
    pub pty: bool,
    pub status: CommandStatus,
    #[ts(optional)]
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    #[ts(optional)]
    pub signal: Option<i32>,
    pub started_at: i64,
    #[ts(optional)]
    pub finished_at: Option<i64>,
    /// Why a `lost` command is lost, when the daemon knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub status_reason: Option<String>,
    /// Output bytes the sandbox dropped because the command printed more than it keeps
    /// (64 MiB by default); the logs hold the rest. 0 when nothing was dropped.
    #[serde(default)]
    pub output_truncated_bytes: u64,
}

/// The request header that makes `POST /v1/sandboxes/{id}/commands` idempotent: a second
/// request with the same key for the same sandbox returns the command the first one started
/// instead of starting another (and a different command under a used key is a `conflict`).
/// `POST /v1/sandboxes` takes it too: the same key returns the sandbox created with it.
/// 1 to 255 visible ASCII characters.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Whether `key` is a well-formed idempotency key.
pub fn valid_idempotency_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// One page of commands, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct CommandList {
    pub commands: Vec<Command>,
}

/// Which stream a chunk of output came from; a PTY command's output is all `stdout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One NDJSON line of `GET .../commands/{cid}/logs`.
///
/// `data` carries UTF-8 text; a chunk that is not valid UTF-8 comes as `data_base64` instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct LogLine {
    pub stream: Stream,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub data_base64: Option<String>,
    pub ts: i64,
}

/// `POST .../commands/{cid}/kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct KillCommand {
    /// A number or a name (`TERM`, `SIGKILL`); default `TERM`.
    #[serde(default)]
    #[ts(optional)]
    #[schema(min_length = 1, max_length = 16)]
    pub signal: Option<String>,
}

impl Validate for KillCommand {
    fn validate(&self) -> Result<(), Invalid> {
        match &self.signal {
            Some(s) if s.is_empty() => Err(Invalid::new("signal", "must not be empty")),
            Some(s) => limits::text("signal", s, limits::MAX_SIGNAL),
            None => Ok(()),
        }
    }
}

/// A control message on a terminal WebSocket (text frames). Binary frames carry raw terminal
/// bytes in both directions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TerminalMessage {
    /// Client → daemon: the terminal's new size.
    Resize { rows: u16, cols: u16 },
    /// Daemon → client: the shell started; `command_id` names it.
    Started { command_id: String },
    /// Daemon → client: the shell exited.
    Exit {
        #[ts(optional)]
        exit_code: Option<i32>,
        #[ts(optional)]
        signal: Option<i32>,
    },
    /// Daemon → client: something went wrong; the socket closes after it.
    Error { code: ErrorCode, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_short_visible_ascii() {
        assert!(valid_idempotency_key("retry-7f3a"));
        assert!(valid_idempotency_key(&"k".repeat(255)));
        for bad in ["", "with space", "tab\t", "é", &"k".repeat(256)] {
            assert!(!valid_idempotency_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_command_from_an_older_daemon_reads_as_untruncated() {
        let c: Command = serde_json::from_str(
            r#"{"id":"cmd_a","sandbox_id":"sbx_a","argv":["true"],"cwd":"/","user":"u",
                "pty":false,"status":"exited","exit_code":0,"started_at":1}"#,
        )
        .unwrap();
        assert_eq!(c.output_truncated_bytes, 0);
        assert!(c.status_reason.is_none());
    }
}
