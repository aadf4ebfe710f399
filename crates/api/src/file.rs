//! Files inside a sandbox.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// A file's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct FileEntry {
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, e.g. 420 (0o644).
    pub mode: u32,
    pub mtime: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub link_target: Option<String>,
}

/// A directory listing, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct FileList {
    pub path: String,
    pub entries: Vec<FileEntry>,
}

/// `POST .../files/mkdir` (always `mkdir -p`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
}

/// `POST .../files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub overwrite: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Modify,
    Remove,
    Rename,
}

/// One NDJSON line (or WebSocket text frame) of a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct WatchEvent {
    pub kind: WatchKind,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub to: Option<String>,
    #[serde(default)]
    pub is_dir: bool,
    pub ts: i64,
}
