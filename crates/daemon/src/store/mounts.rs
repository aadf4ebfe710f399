//! The directory snapshots a sandbox mounts (`mounts` at create): their layers are held by the
//! sandbox like its own chain (`sandbox_layers.mounts`), so deleting the snapshot keeps them
//! while the sandbox exists, and a persistent sandbox mounts them again at each start.

use belljar_api::SnapshotStatus;
use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::layers::retain;
use super::snapshots::{COLUMNS, row_to_snapshot};
use super::{Store, StoreError};

/// A mount a sandbox holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldMount {
    pub snapshot_id: String,
    pub path: String,
    /// Layer digests, topmost first.
    pub layers: Vec<String>,
}

/// Why a mount's snapshot cannot be held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRefused {
    NotFound(String),
    NotUsable(String, SnapshotStatus),
    /// A snapshot of a whole sandbox, not of a directory.
    NotADirectorySnapshot(String),
}

impl Store {
    /// Holds the layers of each `(snapshot_id, path)` for the sandbox (whose layers row
    /// [`Store::use_snapshot`] made); nothing is held when one is refused.
    pub fn hold_mounts(
        &self,
        sandbox_id: &str,
        mounts: &[(String, String)],
    ) -> Result<Result<Vec<HeldMount>, MountRefused>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut held = Vec::new();
        for (snapshot_id, path) in mounts {
            let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1");
            let Some(row) = tx
                .query_row(&sql, [snapshot_id], row_to_snapshot)
                .optional()?
            else {
                return Ok(Err(MountRefused::NotFound(snapshot_id.clone())));
            };
            if row.snapshot.status != SnapshotStatus::Created {
                return Ok(Err(MountRefused::NotUsable(
                    snapshot_id.clone(),
                    row.snapshot.status,
                )));
            }
            if row.snapshot.path.is_none() {
                return Ok(Err(MountRefused::NotADirectorySnapshot(
                    snapshot_id.clone(),
                )));
            }
            for digest in &row.layers {
                retain(&tx, digest, 0)?;
            }
            held.push(HeldMount {
                snapshot_id: snapshot_id.clone(),
                path: path.clone(),
                layers: row.layers,
            });
        }
        if !held.is_empty() {
            tx.execute(
                "UPDATE sandbox_layers SET mounts = ?2 WHERE sandbox_id = ?1",
                params![sandbox_id, serde_json::to_string(&held)?],
            )?;
        }
        tx.commit()?;
        Ok(Ok(held))
    }

    /// The mounts a sandbox holds, in the order they are mounted.
    pub fn sandbox_mounts(&self, sandbox_id: &str) -> Result<Vec<HeldMount>, StoreError> {
        let mounts: Option<Option<String>> = self
            .conn()
            .query_row(
                "SELECT mounts FROM sandbox_layers WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(match mounts.flatten() {
            Some(json) => serde_json::from_str(&json)?,
            None => Vec::new(),
        })
    }
}

/// The layer digests held by a `sandbox_layers.mounts` value.
pub(super) fn mount_layers(json: Option<&str>) -> Result<Vec<String>, StoreError> {
    let Some(json) = json else {
        return Ok(Vec::new());
    };
    let held: Vec<HeldMount> = serde_json::from_str(json)?;
    Ok(held.into_iter().flat_map(|m| m.layers).collect())
}
