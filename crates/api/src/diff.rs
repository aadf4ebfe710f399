//! What changed between two points of a sandbox's timeline: two snapshots, or a snapshot and
//! a sandbox's current files (`GET /v1/snapshots/{id}/diff`). No cloud product offers it;
//! it is read from the layers themselves (an overlayfs whiteout is a deletion).

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::{IntoParams, ToSchema};

use crate::limits::{self, Invalid, Validate};

/// The most changes one diff lists; past it `truncated` is set.
pub const MAX_DIFF_CHANGES: usize = 10_000;
/// Text files up to this size on both sides get a unified diff.
pub const MAX_TEXT_DIFF_BYTES: u64 = 256 * 1024;

/// `GET /v1/snapshots/{id}/diff` query.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, IntoParams, TS)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// A later snapshot (`snap_...`), or a sandbox (`sbx_...`) whose current files are
    /// compared. Without it: what the snapshot changed on top of its parent (or its image).
    #[serde(default)]
    #[param(max_length = 64)]
    pub to: Option<String>,
}

impl Validate for DiffQuery {
    fn validate(&self) -> Result<(), Invalid> {
        self.to
            .as_deref()
            .map_or(Ok(()), |to| limits::text("to", to, 64))
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

/// One side of a changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct DiffEntry {
    pub kind: EntryKind,
    /// Permission bits (`0o644` is 420).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Bytes, for a file.
    pub size_bytes: u64,
    /// Its target, for a symlink.
    #[ts(optional)]
    pub target: Option<String>,
}

/// A path that differs between the two points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct FileChange {
    /// Absolute path in the sandbox.
    pub path: String,
    pub change: ChangeKind,
    /// Before (absent for an added path).
    #[ts(optional)]
    pub old: Option<DiffEntry>,
    /// After (absent for a deleted path).
    #[ts(optional)]
    pub new: Option<DiffEntry>,
    /// For a text file (UTF-8, at most 256 KiB on both sides): its unified diff.
    #[ts(optional)]
    pub unified_diff: Option<String>,
}

/// `GET /v1/snapshots/{id}/diff`: changes in path order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct SnapshotDiff {
    /// The earlier point: a snapshot, or `image:<name>` for a snapshot without a parent.
    pub from: String,
    /// The later point: a snapshot or a sandbox.
    pub to: String,
    pub changes: Vec<FileChange>,
    /// More than [`MAX_DIFF_CHANGES`] paths changed; the list stops there.
    pub truncated: bool,
}
