//! Files inside a sandbox.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::limits::{self, Invalid, Validate};

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

/// One page of a directory listing, sorted by name. `GET .../files/list?path=&limit=&cursor=`
/// answers at most `limit` entries ([`LIST_DEFAULT_LIMIT`] when absent, at most
/// [`LIST_MAX_LIMIT`]); pass `next_cursor` back as `cursor` for the next page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct FileList {
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// Opaque; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub next_cursor: Option<String>,
}

/// Entries in a listing page when the request names no `limit`.
pub const LIST_DEFAULT_LIMIT: u32 = 1000;

/// The largest `limit` a listing page may ask for.
pub const LIST_MAX_LIMIT: u32 = 5000;

/// `POST .../files/mkdir` (always `mkdir -p`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    #[schema(min_length = 1, max_length = 4096, pattern = "^/")]
    pub path: String,
}

impl Validate for MkdirRequest {
    fn validate(&self) -> Result<(), Invalid> {
        limits::sandbox_path("path", &self.path)
    }
}

/// `POST .../files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    #[schema(min_length = 1, max_length = 4096, pattern = "^/")]
    pub from: String,
    #[schema(min_length = 1, max_length = 4096, pattern = "^/")]
    pub to: String,
    #[serde(default)]
    pub overwrite: bool,
}

impl Validate for MoveRequest {
    fn validate(&self) -> Result<(), Invalid> {
        limits::sandbox_path("from", &self.from)?;
        limits::sandbox_path("to", &self.to)
    }
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
