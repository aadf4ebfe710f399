//! The control socket: JSON lines over a Unix stream socket, one request per line and one
//! response line per request, in order. The daemon uses it to pause, resume, stop and
//! observe a VM.
//!
//! | request | response |
//! |---|---|
//! | `{"cmd":"status"}` | `{"status":{"state":"running","uptime_ms":N,"exit_reason":null}}` |
//! | `{"cmd":"pause"}` | `{"state":"paused"}` |
//! | `{"cmd":"resume"}` | `{"state":"running"}` |
//! | `{"cmd":"stop"}` | `{"state":"stopping"}` (the process then exits 0) |
//! | `{"cmd":"metrics"}` | `{"metrics":{...}}` ([`Metrics`]) |
//! | `{"cmd":"snapshot"}` + two fds | `{"snapshot":{"state_bytes":N,"memory_bytes":N,"elapsed_ms":N}}` |
//! | anything wrong | `{"error":{"code":"bad_request","message":"..."}}` ([`ErrorCode`]) |
//!
//! `snapshot` carries two open files with its line (`SCM_RIGHTS`): the state file, then the
//! memory file, both empty and writable (the client creates them, the VMM under its
//! seccomp filter cannot open files). The VM pauses while they are written and then runs on
//! as before. Restore with `belljar-vmm --restore DIR`, where DIR holds them as
//! [`SNAPSHOT_STATE_FILE`] and [`SNAPSHOT_MEMORY_FILE`] ([`crate::client::ControlClient::snapshot`]
//! lays them out so).
//!
//! A request line is at most [`MAX_REQUEST_LINE`] bytes; the VMM answers a longer one with
//! `bad_request` and closes the connection. A response line is at most
//! [`MAX_RESPONSE_LINE`] bytes.

use std::io::{BufRead, Read};

use serde::{Deserialize, Serialize};

use crate::exit::ExitReason;
use crate::metrics::Metrics;

/// Longest request line the VMM accepts, newline included.
pub const MAX_REQUEST_LINE: usize = 4096;
/// Longest response line a client accepts, newline included (metrics of 32 vCPUs and 20
/// devices need under 8 KiB).
pub const MAX_RESPONSE_LINE: usize = 64 * 1024;

/// A snapshot directory's state file (vCPUs, devices; checked: magic, version, checksum).
pub const SNAPSHOT_STATE_FILE: &str = "vmstate";
/// A snapshot directory's guest memory file (raw RAM, sparse).
pub const SNAPSHOT_MEMORY_FILE: &str = "memory";

/// A request: `{"cmd":"<name>"}` and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", try_from = "RequestLine")]
pub enum Request {
    Status,
    Pause,
    Resume,
    Stop,
    Metrics,
    /// Save the VM into the two files sent with the request.
    Snapshot,
}

impl Request {
    /// The request's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Pause => "pause",
            Request::Resume => "resume",
            Request::Stop => "stop",
            Request::Metrics => "metrics",
            Request::Snapshot => "snapshot",
        }
    }

    /// Every request.
    pub const ALL: [Request; 6] = [
        Request::Status,
        Request::Pause,
        Request::Resume,
        Request::Stop,
        Request::Metrics,
        Request::Snapshot,
    ];

    /// Parses one request line. An unknown `cmd` is `unknown_command`, anything else that
    /// is not a request is `bad_request`.
    pub fn parse(line: &str) -> Result<Request, ControlError> {
        let wire: RequestLine = serde_json::from_str(line.trim())
            .map_err(|e| ControlError::new(ErrorCode::BadRequest, e))?;
        Request::try_from(wire)
    }

    /// The request as one line, newline included.
    pub fn to_line(self) -> String {
        let mut line = serde_json::to_string(&self).expect("requests serialize");
        line.push('\n');
        line
    }
}

/// A request as it is on the wire. (An internally tagged enum would let unknown fields
/// through, so requests are read through this struct.)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestLine {
    cmd: String,
}

impl TryFrom<RequestLine> for Request {
    type Error = ControlError;

    fn try_from(wire: RequestLine) -> Result<Self, Self::Error> {
        Request::ALL
            .into_iter()
            .find(|r| r.name() == wire.cmd)
            .ok_or_else(|| {
                ControlError::new(
                    ErrorCode::UnknownCommand,
                    format!("Unknown command {:?}", wire.cmd),
                )
            })
    }
}

/// Where the VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    Running,
    /// A pause was asked for and not every vCPU has stopped yet.
    Pausing,
    Paused,
    /// A stop was asked for; the process is about to exit.
    Stopping,
    Stopped,
}

/// The answer to `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    pub state: VmState,
    pub uptime_ms: u64,
    /// Why the VM ended, once it has.
    pub exit_reason: Option<ExitReason>,
}

/// The closed set of error codes the VMM answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not a request (bad JSON, unknown field, too long, not UTF-8).
    BadRequest,
    /// The line names a command this VMM does not know.
    UnknownCommand,
    /// The vCPUs did not pause in time.
    PauseFailed,
    /// The snapshot could not be taken (no files sent, a write failed, the VM ended).
    SnapshotFailed,
}

/// The answer to `snapshot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotTaken {
    /// Size of the state file.
    pub state_bytes: u64,
    /// Guest memory bytes written (pages that are not all zero; the file is sparse).
    pub memory_bytes: u64,
    /// From the pause to both files being written and synced.
    pub elapsed_ms: u64,
}

/// An error answer: `{"code": "...", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(deny_unknown_fields)]
#[error("{message} ({code:?})")]
pub struct ControlError {
    pub code: ErrorCode,
    pub message: String,
}

impl ControlError {
    pub fn new(code: ErrorCode, message: impl std::fmt::Display) -> Self {
        Self {
            code,
            message: message.to_string(),
        }
    }
}

/// A response, externally tagged: the key says what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// To `status`.
    Status(Status),
    /// To `pause`, `resume` and `stop`: the state the VM is in (or going to).
    State(VmState),
    /// To `metrics`.
    Metrics(Metrics),
    /// To `snapshot`.
    Snapshot(SnapshotTaken),
    /// To anything that failed.
    Error(ControlError),
}

impl Response {
    /// The response as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("responses serialize");
        line.push('\n');
        line
    }
}

/// Why a line could not be read.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum LineError {
    /// Cannot read from the control socket
    Io(#[from] std::io::Error),
    /// Line longer than {0} bytes
    TooLong(usize),
    /// Line is not UTF-8
    NotUtf8,
}

/// Reads one `\n`-terminated line of at most `max` bytes (newline included) without ever
/// buffering more. `Ok(None)` at end of stream; a last line without a newline counts.
pub fn read_line(reader: &mut impl BufRead, max: usize) -> Result<Option<String>, LineError> {
    let mut buf = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX);
    let n = reader.take(limit).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && n >= max {
        return Err(LineError::TooLong(max));
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| LineError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{DeviceMetrics, VcpuMetrics};

    #[test]
    fn requests_round_trip_with_their_wire_names() {
        for r in Request::ALL {
            let line = r.to_line();
            assert_eq!(line, format!("{{\"cmd\":\"{}\"}}\n", r.name()));
            assert_eq!(Request::parse(&line).unwrap(), r);
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        }
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"stop","x":1}"#).is_err());
    }

    #[test]
    fn bad_requests_get_the_right_code() {
        let e = Request::parse(r#"{"cmd":"fly"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownCommand);
        assert_eq!(e.message, "Unknown command \"fly\"");
        for bad in [
            r#"{"cmd":"stop","force":true}"#,
            r#"{"command":"stop"}"#,
            r#"{"cmd":7}"#,
            "stop",
            "",
        ] {
            let e = Request::parse(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest, "{bad}");
            assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn responses_round_trip() {
        let metrics = Metrics {
            vcpus: vec![VcpuMetrics {
                id: 0,
                exits: 5,
                io_exits: 3,
                halt_exits: 1,
                interrupted_exits: 1,
            }],
            unknown_pio: 1,
            unknown_mmio: 0,
            devices: vec![DeviceMetrics {
                name: "serial".into(),
                bytes_in: 2,
                bytes_out: 0,
                requests: 0,
                errors: 0,
            }],
            rss_bytes: 4096,
            guest_memory_bytes: 1 << 25,
        };
        for r in [
            Response::Status(Status {
                state: VmState::Running,
                uptime_ms: 12,
                exit_reason: None,
            }),
            Response::Status(Status {
                state: VmState::Stopped,
                uptime_ms: 12,
                exit_reason: Some(ExitReason::PowerOff),
            }),
            Response::State(VmState::Paused),
            Response::Metrics(metrics),
            Response::Snapshot(SnapshotTaken {
                state_bytes: 20_000,
                memory_bytes: 1 << 20,
                elapsed_ms: 12,
            }),
            Response::Error(ControlError::new(ErrorCode::SnapshotFailed, "No files")),
            Response::Error(ControlError::new(ErrorCode::PauseFailed, "Timed out")),
        ] {
            let line = r.to_line();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), r);
        }
        assert_eq!(
            Response::State(VmState::Stopping).to_line(),
            "{\"state\":\"stopping\"}\n"
        );
        assert_eq!(
            Response::Error(ControlError::new(ErrorCode::BadRequest, "x")).to_line(),
            "{\"error\":{\"code\":\"bad_request\",\"message\":\"x\"}}\n"
        );
    }

    #[test]
    fn unknown_response_fields_and_codes_are_refused() {
        assert!(serde_json::from_str::<Response>(r#"{"state":"running","ok":true}"#).is_err());
        assert!(serde_json::from_str::<Response>(r#"{"state":"flying"}"#).is_err());
        assert!(
            serde_json::from_str::<Response>(r#"{"error":{"code":"oops","message":"m"}}"#).is_err()
        );
        assert!(
            serde_json::from_str::<Response>(
                r#"{"status":{"state":"running","uptime_ms":1,"exit_reason":null,"x":1}}"#
            )
            .is_err()
        );
    }

    #[test]
    fn long_lines_are_refused() {
        let data = vec![b'x'; MAX_REQUEST_LINE + 10];
        let mut r = std::io::Cursor::new(data);
        assert!(matches!(
            read_line(&mut r, MAX_REQUEST_LINE),
            Err(LineError::TooLong(MAX_REQUEST_LINE))
        ));
        // Exactly at the limit, newline included, is fine.
        let mut line = vec![b'x'; MAX_REQUEST_LINE - 1];
        line.push(b'\n');
        let mut r = std::io::Cursor::new(line);
        assert_eq!(
            read_line(&mut r, MAX_REQUEST_LINE).unwrap().unwrap().len(),
            MAX_REQUEST_LINE
        );
    }

    #[test]
    fn lines_are_split() {
        let mut r = std::io::Cursor::new(b"{\"cmd\":\"a\"}\n{}\n\xff\n".to_vec());
        assert_eq!(read_line(&mut r, 64).unwrap().unwrap(), "{\"cmd\":\"a\"}\n");
        assert_eq!(read_line(&mut r, 64).unwrap().unwrap(), "{}\n");
        assert!(matches!(read_line(&mut r, 64), Err(LineError::NotUtf8)));
        assert!(read_line(&mut r, 64).unwrap().is_none());
    }
}
