//! Snapshots: a sandbox's filesystem frozen as an immutable layer that new sandboxes start
//! from (Vercel Sandbox's `Snapshot`, with its statuses, expiration and `keepLastSnapshots`
//! retention).

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::{IntoParams, ToSchema};

use crate::limits::{self, Invalid, Validate};

/// The longest expiration a request may set, ms (10 years); `0` means never.
pub const MAX_EXPIRATION_MS: i64 = 10 * 365 * 24 * 3600 * 1000;
/// How long a snapshot lives after its last use when nothing else is said: 30 days.
pub const DEFAULT_EXPIRATION_MS: i64 = 30 * 24 * 3600 * 1000;

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    ToSchema,
    TS,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum SnapshotStatus {
    /// Captured and ready to start sandboxes from.
    Created,
    /// Deleted by a request, by its expiration or by a retention policy.
    Deleted,
    /// The capture did not complete; nothing can start from it.
    Failed,
}

/// A snapshot as every client sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct Snapshot {
    /// `snap_` followed by lowercase letters and digits.
    pub id: String,
    pub status: SnapshotStatus,
    /// Why it failed, for a failed snapshot.
    #[ts(optional)]
    pub status_reason: Option<String>,
    /// The sandbox it was taken of.
    pub source_sandbox_id: String,
    /// The snapshot that sandbox was created from, if any: the previous point on the timeline.
    #[ts(optional)]
    pub parent: Option<String>,
    /// The image below its layers.
    pub image: String,
    /// The id (`sha256:…`) of that image when it is a user's: the one below the layers,
    /// whatever the name has come to name since.
    #[serde(default)]
    #[ts(optional)]
    pub image_id: Option<String>,
    /// Bytes of file content its own layer added (the layers below it are shared).
    pub size_bytes: u64,
    /// Layers a sandbox made from it stacks on the image, this snapshot's own included.
    pub depth: u32,
    pub created_at: i64,
    /// When it expires (30 days after its last use by default); absent when it never does.
    #[ts(optional)]
    pub expires_at: Option<i64>,
    /// For a live snapshot (`keep_running`), how long the sandbox's processes were frozen, ms.
    #[ts(optional)]
    pub frozen_ms: Option<u64>,
    /// For a directory snapshot (Modal's `snapshot_directory`): the directory of the source
    /// sandbox it holds. It is mounted into sandboxes (`mounts`), not started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub path: Option<String>,
}

/// A directory snapshot mounted at a path of a sandbox (Modal's `mount_image`): at create
/// (`mounts`) or into a running one (`POST /v1/sandboxes/{id}/mounts`). The
/// sandbox sees the snapshot's files there, copy-on-write: its writes stay its own and never
/// reach the snapshot. A path that does not exist is created; one that exists is hidden.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct SnapshotMount {
    /// A created directory snapshot (one taken with `path`).
    #[schema(max_length = 128)]
    pub snapshot_id: String,
    /// Absolute path in the sandbox; not `/`, without `.` or `..`.
    #[schema(max_length = 1024)]
    pub path: String,
}

impl Validate for SnapshotMount {
    fn validate(&self) -> Result<(), Invalid> {
        limits::text("snapshot_id", &self.snapshot_id, limits::MAX_NAME)?;
        limits::text("path", &self.path, 1024)
    }
}

/// The directory snapshots mounted in a sandbox (`GET /v1/sandboxes/{id}/mounts`): those
/// given at create and those mounted since (`POST .../mounts`, Modal's `mount_image`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct SandboxMounts {
    pub mounts: Vec<SnapshotMount>,
}

/// `DELETE /v1/sandboxes/{id}/mounts` query (Modal's `unmount_image`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, IntoParams, TS)]
#[into_params(parameter_in = Query)]
pub struct UnmountQuery {
    /// The exact path a snapshot was mounted at. The sandbox's writes under it are
    /// discarded and what the path held before shows again.
    #[param(max_length = 1024)]
    pub path: String,
}

impl Validate for UnmountQuery {
    fn validate(&self) -> Result<(), Invalid> {
        limits::text("path", &self.path, 1024)
    }
}

/// The body of `POST /v1/sandboxes/{id}/snapshots`. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// Keep the sandbox running: its processes are frozen while the layer is captured.
    /// Default `false`: the sandbox stops and its writable layer becomes the snapshot.
    #[serde(default)]
    #[ts(optional)]
    pub keep_running: Option<bool>,
    /// Milliseconds the snapshot lives after its last use; `0` never expires. Default: the
    /// sandbox's `snapshot_expiration_ms`, else 30 days.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    pub expiration_ms: Option<i64>,
    /// Snapshot only this directory of the sandbox, as it looks now (Modal's
    /// `snapshot_directory`); the sandbox keeps running. The snapshot holds the directory's
    /// whole tree (not a change set) and is mounted into other sandboxes with `mounts`.
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_length = 1024)]
    pub path: Option<String>,
}

impl Validate for CreateSnapshot {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range("expiration_ms", self.expiration_ms, 0, MAX_EXPIRATION_MS)
    }
}

/// The body of `PATCH /v1/snapshots/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct UpdateSnapshot {
    /// Milliseconds the snapshot lives from now (and after each later use); `0` never
    /// expires.
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    pub expiration_ms: i64,
}

impl Validate for UpdateSnapshot {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range(
            "expiration_ms",
            Some(self.expiration_ms),
            0,
            MAX_EXPIRATION_MS,
        )
    }
}

/// The body of `POST /v1/sandboxes/{id}/fork`: what the new sandbox changes of the source's
/// configuration. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    #[serde(default)]
    #[ts(optional)]
    #[schema(max_length = 128)]
    pub name: Option<String>,
    /// Replaces the source's tags.
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::tags_schema, nullable)]
    pub tags: Option<std::collections::BTreeMap<String, String>>,
    /// Replaces the source's environment.
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::env_schema, nullable)]
    pub env: Option<std::collections::BTreeMap<String, String>>,
    /// Default: the source's timeout.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 2592000000_i64)]
    pub timeout_ms: Option<i64>,
}

impl Validate for ForkSandbox {
    fn validate(&self) -> Result<(), Invalid> {
        if let Some(name) = &self.name {
            limits::text("name", name, limits::MAX_NAME)?;
        }
        limits::tags("tags", self.tags.as_ref())?;
        limits::env("env", self.env.as_ref())?;
        limits::range("timeout_ms", self.timeout_ms, 1, limits::MAX_TIMEOUT_MS)
    }
}

/// How many of a sandbox's snapshots are kept (Vercel's `keepLastSnapshots`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct KeepLastSnapshots {
    /// Keep the newest `count` (1 to 10) snapshots of the sandbox.
    #[schema(minimum = 1, maximum = 10)]
    pub count: u32,
    /// Expiration of the kept snapshots, ms; `0` never. Default: each keeps its own.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 0, maximum = 315360000000_i64)]
    pub expiration_ms: Option<i64>,
    /// Delete the older ones at once (default `true`); else they stay, no longer counted,
    /// with the expiration they would have without this rule: their own, or where
    /// `expiration_ms` had replaced it, the sandbox's `snapshot_expiration_ms` (else 30 days)
    /// from their eviction.
    #[serde(default)]
    #[ts(optional)]
    pub delete_evicted: Option<bool>,
}

impl Validate for KeepLastSnapshots {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range("keep_last_snapshots.count", Some(self.count), 1, 10)?;
        limits::range(
            "keep_last_snapshots.expiration_ms",
            self.expiration_ms,
            0,
            MAX_EXPIRATION_MS,
        )
    }
}

/// `GET /v1/snapshots` query.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, IntoParams, TS)]
#[into_params(parameter_in = Query)]
pub struct ListSnapshotsQuery {
    /// Only snapshots taken of this sandbox.
    #[serde(default)]
    #[param(max_length = 64)]
    pub sandbox_id: Option<String>,
    /// Only snapshots in this status; default: every status.
    #[serde(default)]
    pub status: Option<SnapshotStatus>,
    /// Created at or after this time (Unix ms).
    #[serde(default)]
    pub since: Option<i64>,
    /// Created before this time (Unix ms).
    #[serde(default)]
    pub until: Option<i64>,
    /// Page size, 1..=200, default 50.
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    #[param(max_length = 256)]
    pub cursor: Option<String>,
}

impl Validate for ListSnapshotsQuery {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range("limit", self.limit, 1, 200)?;
        if let Some(id) = &self.sandbox_id {
            limits::text("sandbox_id", id, 64)?;
        }
        if let Some(cursor) = &self.cursor {
            limits::text("cursor", cursor, 256)?;
        }
        Ok(())
    }
}

/// One page of snapshots, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
    #[ts(optional)]
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_at_the_edge() {
        let keep = |count| KeepLastSnapshots {
            count,
            expiration_ms: None,
            delete_evicted: None,
        };
        assert!(keep(0).validate().is_err());
        assert!(keep(11).validate().is_err());
        assert!(keep(1).validate().is_ok() && keep(10).validate().is_ok());
        let snap = |ms| CreateSnapshot {
            keep_running: None,
            expiration_ms: Some(ms),
            path: None,
        };
        let err = snap(-1).validate().unwrap_err();
        assert_eq!(err.field, "expiration_ms");
        assert!(snap(0).validate().is_ok());
    }
}
