//! The event stream the UI follows instead of polling.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::{Command, Sandbox, Snapshot};

/// One line of `GET /v1/events` (NDJSON, or text frames on a WebSocket).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A sandbox was created or changed (status, tags, timeout); carries its new state.
    Sandbox {
        seq: u64,
        ts: i64,
        sandbox: Box<Sandbox>,
    },
    /// A sandbox record was deleted.
    SandboxDeleted {
        seq: u64,
        ts: i64,
        sandbox_id: String,
    },
    /// A snapshot was taken, failed, or was deleted (by a request, its expiration or a
    /// retention policy); carries its new state.
    Snapshot {
        seq: u64,
        ts: i64,
        snapshot: Box<Snapshot>,
    },
    /// A command started or finished.
    Command {
        seq: u64,
        ts: i64,
        command: Box<Command>,
    },
}
