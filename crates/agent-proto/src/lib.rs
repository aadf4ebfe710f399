//! The wire contract between `belljard` and `belljar-agent`.
//!
//! The agent serves HTTP/2 (cleartext, prior knowledge) over one stream transport: a Unix
//! socket for the namespace backend, AF_VSOCK port [`AGENT_VSOCK_PORT`] inside a microVM (the
//! host reaches it through the VMM's hybrid vsock socket with `CONNECT 1024\n`). Using HTTP/2
//! keeps the framing standard and lets many commands, file transfers and watches share one
//! connection.
//!
//! Routes (JSON bodies unless noted; every error is an [`ErrorBody`] with a fitting status):
//!
//! | method | path | request | response |
//! |---|---|---|---|
//! | GET | `/v1/health` | | [`AgentInfo`] |
//! | POST | `/v1/commands` | [`StartCommand`] | [`CommandInfo`]; with `?follow=true`, NDJSON of [`Followed`] |
//! | GET | `/v1/commands` | `?fence=N` refuses starts of any other epoch from now on | `Vec<CommandInfo>` |
//! | GET | `/v1/commands/{id}` | `?wait=true` blocks until exit and complete output | [`CommandInfo`] |
//! | GET | `/v1/commands/{id}/output` | `?follow=true&skip=N` | NDJSON of [`OutputLine`] |
//! | POST | `/v1/commands/{id}/stdin` | raw bytes, streamed; `?close=true` closes stdin at body end | 204 |
//! | POST | `/v1/commands/{id}/signal` | [`SignalRequest`] | 204 |
//! | POST | `/v1/commands/{id}/resize` | [`PtySize`] | 204 |
//! | GET | `/v1/files/read` | `?path=` | raw bytes, streamed; `content-length` when known |
//! | PUT | `/v1/files/write` | `?path=&mode=644&user=` raw bytes, streamed | [`FileEntry`] |
//! | POST | `/v1/files/mkdir` | [`MkdirRequest`] | [`FileEntry`] |
//! | GET | `/v1/files/list` | `?path=&limit=&cursor=` | [`FileListPage`], sorted by name |
//! | GET | `/v1/files/stat` | `?path=` | [`FileEntry`] |
//! | POST | `/v1/files/remove` | [`RemoveRequest`] | 204 |
//! | POST | `/v1/files/move` | [`MoveRequest`] | [`FileEntry`] |
//! | GET | `/v1/files/tar` | `?path=` | tar stream (`application/x-tar`) of the tree |
//! | PUT | `/v1/files/tar` | `?path=&user=` tar stream, extracted under `path` | 204 |
//! | GET | `/v1/watch` | `?path=&recursive=true` | NDJSON of [`WatchEvent`] |
//! | GET | `/v1/metrics` | | [`Metrics`] |
//! | POST | `/v1/shutdown` | [`ShutdownRequest`] | 204, then the agent ends the sandbox |
//!
//! Output of a command is kept by the agent on disk (bounded per command) so that a client that
//! connects later, or reconnects after a daemon restart, can read it again from line `skip`.
//! A followed output stream ends when the command has exited and all its output was sent.
//! Files written through the API belong to the command user (`belljar` unless `user=root`).
//!
//! Query parameters are percent-encoded UTF-8 ([`query`] has the helpers both ends use).
//! Paths must be absolute (`invalid_path` otherwise). Starting a program that does not exist or
//! cannot be executed fails with `exec_failed` (HTTP 400); an unknown command id is
//! `command_not_found` (HTTP 404).
//!
//! Signalling or writing stdin to an exited command is `command_finished` (HTTP 409);
//! `stdin?close=true` on a PTY command sends `^D` rather than closing the terminal.
//! `GET /v1/files/read` refuses FIFOs, sockets and devices (`not_a_regular_file`) without
//! opening them for long; a regular file whose size the kernel does not know (`/proc`, `/sys`)
//! is streamed until its end without a `content-length`. `GET /v1/files/list` answers pages of
//! at most `limit` entries ([`LIST_DEFAULT_LIMIT`], at most [`LIST_MAX_LIMIT`]) and at most
//! [`LIST_PAGE_BYTES`] of JSON; `next_cursor`, passed back as `cursor`, continues after the
//! page's last name.
//! `GET /v1/files/tar` carries the contents of a directory (entries relative to it) or a single
//! file under its base name; `PUT /v1/files/tar` skips entries that would land outside `path`.
//! `guest-images/agent/README.md` lists every behaviour the daemon may rely on.
//!
//! With the `client` feature, [`client::AgentClient`] speaks these routes over a Unix socket or
//! the VMM's hybrid vsock socket.

#![forbid(unsafe_code)]

#[cfg(feature = "client")]
pub mod client;
pub mod mounts;
pub mod net;
pub mod query;

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};

/// The vsock port the agent listens on inside a microVM.
pub const AGENT_VSOCK_PORT: u32 = 1024;

/// The x86 I/O port of `belljar-vmm`'s power-off device: the agent, as a microVM's init,
/// writes one byte there to end the VM once its disks are synced (x86 without ACPI has no
/// other power-off path; the kernel would only halt).
pub const POWER_OFF_PORT: u16 = 0x501;

/// The unprivileged user that commands run as unless they ask for root.
pub const DEFAULT_USER: &str = "belljar";

/// The working directory of commands that name none.
pub const DEFAULT_CWD: &str = "/workspace";

/// The body of every error response, the same shape as the daemon's public errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A stable machine-readable code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// One of the `code` constants in [`codes`].
    pub code: String,
    pub message: String,
}

/// Stable error codes. The daemon passes these through to its own clients unchanged.
pub mod codes {
    pub const BAD_REQUEST: &str = "bad_request";
    pub const NOT_FOUND: &str = "not_found";
    pub const NOT_A_DIRECTORY: &str = "not_a_directory";
    pub const IS_A_DIRECTORY: &str = "is_a_directory";
    pub const PERMISSION_DENIED: &str = "permission_denied";
    pub const EXISTS: &str = "exists";
    pub const NOT_EMPTY: &str = "not_empty";
    pub const NO_SPACE: &str = "no_space";
    pub const INVALID_PATH: &str = "invalid_path";
    pub const COMMAND_NOT_FOUND: &str = "command_not_found";
    pub const COMMAND_FINISHED: &str = "command_finished";
    pub const EXEC_FAILED: &str = "exec_failed";
    pub const UNKNOWN_USER: &str = "unknown_user";
    /// A start of another epoch than the agent was last listed with (`StartCommand::epoch`).
    pub const STALE_START: &str = "stale_start";
    /// A FIFO, socket or device where a regular file is needed.
    pub const NOT_A_REGULAR_FILE: &str = "not_a_regular_file";
    /// The file or mount is in use (`EBUSY`, `ETXTBSY`).
    pub const BUSY: &str = "busy";
    /// The file would exceed the filesystem's largest file (`EFBIG`).
    pub const FILE_TOO_LARGE: &str = "file_too_large";
    /// The agent is out of file descriptors or memory for now (`EMFILE`, `ENFILE`, `ENOMEM`).
    pub const TRY_AGAIN: &str = "try_again";
    pub const INTERNAL: &str = "internal";
}

/// Entries in a listing page when the request names no `limit`.
pub const LIST_DEFAULT_LIMIT: usize = 1000;

/// The largest `limit` a listing page may ask for.
pub const LIST_MAX_LIMIT: usize = 5000;

/// The most JSON one listing page carries; a page of long names ends early to stay under it.
pub const LIST_PAGE_BYTES: usize = 4 << 20;

/// The largest HTTP/2 frame either side of the agent's connection takes and sends, and what
/// one stream may have buffered for sending: a file moves in 1 MiB pieces, not 16 KiB ones.
pub const MAX_FRAME: u32 = 1 << 20;

/// What `/v1/health` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub version: String,
    pub hostname: String,
    /// The agent's own pid as it sees it (1 when it is init).
    pub pid: u32,
    /// Unix milliseconds when the agent started.
    pub started_at: i64,
}

/// Rows and columns of a pseudo-terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// Start a command.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StartCommand {
    /// Program and arguments; the program is looked up in `PATH` when it has no slash.
    pub argv: Vec<String>,
    /// Working directory; [`DEFAULT_CWD`] when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Added to (and overriding) the agent's base environment for this user.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `belljar` when absent; `root` for sudo.
    #[serde(default)]
    pub user: Option<String>,
    /// Run on a pseudo-terminal of this size (stdout and stderr merge into `pty`).
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Keep stdin open for `/stdin` writes; otherwise stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// The client's own id for this command (the daemon's `cmd_...`), at most
    /// [`MAX_CLIENT_ID_LEN`] bytes. The agent reports it back in [`CommandInfo`], and a second
    /// start with a client id it already knows returns that command instead of starting
    /// another: a client that lost the answer (or restarted) can ask again safely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The epoch of the daemon that sends the start (one per daemon run). Once listed with
    /// `GET /v1/commands?fence=N`, an agent refuses starts of any other epoch with
    /// `stale_start`: a start that a dead daemon sent and the agent had not yet read cannot
    /// run after the restarted daemon listed the commands. A daemon refused so for its own
    /// epoch (an agent restored from a snapshot keeps the fence of its past) fences again
    /// with its own and asks once more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

/// The header with which an agent that knows fences answers `GET /v1/commands?fence=N`: the
/// only epoch it now accepts starts of. An older agent ignores `fence` and sends no header.
pub const FENCE_HEADER: &str = "belljar-fence";

/// The longest [`StartCommand::client_id`] the agent accepts.
pub const MAX_CLIENT_ID_LEN: usize = 128;

/// Where a command is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandStatus {
    Running,
    Exited,
}

/// A command as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandInfo {
    /// Assigned by the agent; unique within the sandbox's life.
    pub id: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub user: String,
    pub pty: bool,
    pub pid: u32,
    pub status: CommandStatus,
    /// The exit code when the command exited normally.
    pub exit_code: Option<i32>,
    /// The signal number when the command was killed by a signal.
    pub signal: Option<i32>,
    /// Unix milliseconds.
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// Bytes of output dropped because the command exceeded the kept-output bound.
    #[serde(default)]
    pub output_truncated_bytes: u64,
    /// The [`StartCommand::client_id`] it was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

/// Which stream a chunk of output came from. A PTY command's output is all `stdout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One NDJSON line of `POST /v1/commands?follow=true`: the command's start, its output, and
/// its end, so that one request carries a command's whole life. An agent older than this
/// answers such a start with a plain [`CommandInfo`] (`application/json`), and the client
/// then follows the output and waits with their own requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Followed {
    /// First: the command as started (what the start answers without `follow`).
    Started(FollowedStart),
    /// Last: the command once it has exited and its output is complete (`?wait=true`).
    Ended(FollowedEnd),
    /// Between: a line of output, as `/output` sends it.
    Output(OutputLine),
}

/// The first line of a followed start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowedStart {
    pub started: CommandInfo,
}

/// The last line of a followed start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowedEnd {
    pub ended: CommandInfo,
}

/// One NDJSON line of command output.
///
/// `data` holds the chunk when it is valid UTF-8 (the agent never splits a UTF-8 sequence
/// across lines); otherwise `data` is absent and `data_base64` holds the raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLine {
    pub stream: Stream,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Unix milliseconds when the chunk was read.
    pub ts: i64,
}

impl OutputLine {
    /// Builds a line from raw bytes, choosing text or base64.
    pub fn new(stream: Stream, bytes: &[u8], ts: i64) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self {
                stream,
                data: Some(text.to_owned()),
                data_base64: None,
                ts,
            },
            Err(_) => Self {
                stream,
                data: None,
                data_base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                ts,
            },
        }
    }

    /// The raw bytes of this chunk, whichever way they were carried.
    pub fn bytes(&self) -> Vec<u8> {
        if let Some(text) = &self.data {
            return text.as_bytes().to_vec();
        }
        self.data_base64
            .as_deref()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .unwrap_or_default()
    }
}

/// Send a signal to a command's process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    /// A number (`9`) or a name with or without `SIG` (`TERM`, `SIGKILL`).
    pub signal: String,
}

/// The kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// A file's metadata, as `list` and `stat` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The base name (for `stat`, the last path component).
    pub name: String,
    /// The absolute path inside the sandbox.
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
    /// Unix milliseconds.
    pub mtime: i64,
    /// The target, for symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// One page of a directory listing, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileListPage {
    pub entries: Vec<FileEntry>,
    /// Opaque; pass it back as `cursor` for the next page. Absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `mkdir -p` unless `parents` is false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkdirRequest {
    pub path: String,
    #[serde(default = "yes")]
    pub parents: bool,
    /// Permission bits; 0o755 when absent.
    #[serde(default)]
    pub mode: Option<u32>,
    #[serde(default)]
    pub user: Option<String>,
}

fn yes() -> bool {
    true
}

/// Remove a file, or a directory (`recursive` for a non-empty one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// Rename `from` to `to`; refused with `exists` when `to` exists and `overwrite` is false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub overwrite: bool,
}

/// What happened to a watched path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Modify,
    Remove,
    Rename,
}

/// One NDJSON line of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchKind,
    pub path: String,
    /// The new path, for renames whose both ends are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Whether the path is a directory, when known.
    #[serde(default)]
    pub is_dir: bool,
    pub ts: i64,
}

/// Resource use of the whole sandbox, as seen from inside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// CPU time used since boot (or since the sandbox started), microseconds.
    pub cpu_usage_usec: u64,
    pub cpu_count: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Of the filesystem holding `/workspace`.
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
    pub process_count: u32,
    pub uptime_ms: u64,
}

/// How the sandbox should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownAction {
    Poweroff,
    Reboot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownRequest {
    pub action: ShutdownAction,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_line_keeps_text_as_text_and_binary_as_base64() {
        let text = OutputLine::new(Stream::Stdout, "héllo\n".as_bytes(), 1);
        assert_eq!(text.data.as_deref(), Some("héllo\n"));
        assert!(text.data_base64.is_none());
        let json = serde_json::to_string(&text).unwrap();
        assert_eq!(json, r#"{"stream":"stdout","data":"héllo\n","ts":1}"#);

        let raw = [0xff, 0x00, 0xfe];
        let bin = OutputLine::new(Stream::Stderr, &raw, 2);
        assert!(bin.data.is_none());
        let back: OutputLine = serde_json::from_str(&serde_json::to_string(&bin).unwrap()).unwrap();
        assert_eq!(back.bytes(), raw);
    }

    #[test]
    fn start_command_defaults() {
        let cmd: StartCommand = serde_json::from_str(r#"{"argv":["true"]}"#).unwrap();
        assert_eq!(cmd.argv, ["true"]);
        assert!(cmd.pty.is_none() && !cmd.stdin && cmd.user.is_none());
        assert!(cmd.client_id.is_none());
        // An agent that predates client ids still answers in a form the daemon reads.
        let info: CommandInfo = serde_json::from_str(
            r#"{"id":"cmd-1","argv":["true"],"cwd":"/","user":"belljar","pty":false,"pid":2,
                "status":"running","exit_code":null,"signal":null,"started_at":1,"finished_at":null}"#,
        )
        .unwrap();
        assert!(info.client_id.is_none() && info.output_truncated_bytes == 0);
    }
}
