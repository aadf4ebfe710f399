//! The directory snapshots a sandbox mounts (`mounts` at create): their layers are held by the
//! sandbox like its own chain (`sandbox_layers.mounts`), so deleting the snapshot keeps them
//! while the sandbox exists, and a persistent sandbox mounts them again at each start.
//! Mounts added while the sandbox runs (`POST .../mounts`) join the list with the next free
//! slot; unmounting one drops it and releases its layers.

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
    /// Names the mount's directories in the sandbox's state; absent in rows written before
    /// mounts could be added to a running sandbox, whose slot is their position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<usize>,
}

impl From<HeldMount> for belljar_api::SnapshotMount {
    fn from(m: HeldMount) -> Self {
        Self {
            snapshot_id: m.snapshot_id,
            path: m.path,
        }
    }
}

/// The slots of a sandbox's mounts, in order.
pub fn slots(held: &[HeldMount]) -> Vec<usize> {
    held.iter()
        .enumerate()
        .map(|(i, m)| m.slot.unwrap_or(i))
        .collect()
}

/// Why a mount's snapshot cannot be held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRefused {
    NotFound(String),
    NotUsable(String, SnapshotStatus),
    /// A snapshot of a whole sandbox, not of a directory.
    NotADirectorySnapshot(String),
    /// Something is mounted at the path already.
    PathInUse(String),
    /// The sandbox has as many mounts as it may.
    TooMany(usize),
}

/// The most mounts a sandbox may hold (as at create).
pub const MAX_MOUNTS: usize = 16;

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
        for (slot, (snapshot_id, path)) in mounts.iter().enumerate() {
            let layers = match mount_layers_of(&tx, snapshot_id)? {
                Ok(layers) => layers,
                Err(refused) => return Ok(Err(refused)),
            };
            held.push(HeldMount {
                snapshot_id: snapshot_id.clone(),
                path: path.clone(),
                layers,
                slot: Some(slot),
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

    /// Holds the layers of `snapshot_id` for a mount at `path` added to the sandbox, in the
    /// next free slot.
    pub fn add_mount(
        &self,
        sandbox_id: &str,
        snapshot_id: &str,
        path: &str,
    ) -> Result<Result<HeldMount, MountRefused>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut held = held_in(&tx, sandbox_id)?;
        if held.iter().any(|m| m.path == path) {
            return Ok(Err(MountRefused::PathInUse(path.to_owned())));
        }
        if held.len() >= MAX_MOUNTS {
            return Ok(Err(MountRefused::TooMany(MAX_MOUNTS)));
        }
        let layers = match mount_layers_of(&tx, snapshot_id)? {
            Ok(layers) => layers,
            Err(refused) => return Ok(Err(refused)),
        };
        let slot = slots(&held).into_iter().max().map_or(0, |s| s + 1);
        let mount = HeldMount {
            snapshot_id: snapshot_id.to_owned(),
            path: path.to_owned(),
            layers,
            slot: Some(slot),
        };
        held.push(mount.clone());
        write_held(&tx, sandbox_id, &held)?;
        tx.commit()?;
        Ok(Ok(mount))
    }

    /// Drops the sandbox's mount at `path`; returns it and the layers no one holds any more,
    /// or `None` when nothing is mounted there.
    pub fn remove_mount(
        &self,
        sandbox_id: &str,
        path: &str,
    ) -> Result<Option<(HeldMount, Vec<String>)>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut held = held_in(&tx, sandbox_id)?;
        let Some(at) = held.iter().position(|m| m.path == path) else {
            return Ok(None);
        };
        let mount = held.remove(at);
        write_held(&tx, sandbox_id, &held)?;
        let freed = super::layers::release(&tx, &mount.layers)?;
        tx.commit()?;
        Ok(Some((mount, freed)))
    }

    /// Moves each of the sandbox's mounts named by its slot onto another directory snapshot
    /// (one that holds the mount's writes on top of what it mounted, for a persistent sandbox's
    /// next start), at the same path and slot; returns the layers no one holds any more.
    pub fn replace_mounts(
        &self,
        sandbox_id: &str,
        replacements: &[(usize, String)],
    ) -> Result<Result<Vec<String>, MountRefused>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut held = held_in(&tx, sandbox_id)?;
        let mut freed = Vec::new();
        for (slot, snapshot_id) in replacements {
            let Some(m) = held.iter_mut().find(|m| m.slot == Some(*slot)) else {
                continue;
            };
            let layers = match mount_layers_of(&tx, snapshot_id)? {
                Ok(layers) => layers,
                Err(refused) => return Ok(Err(refused)),
            };
            let old = std::mem::replace(&mut m.layers, layers);
            m.snapshot_id = snapshot_id.clone();
            freed.extend(super::layers::release(&tx, &old)?);
        }
        write_held(&tx, sandbox_id, &held)?;
        tx.commit()?;
        Ok(Ok(freed))
    }

    /// The mounts a sandbox holds, in the order they are mounted.
    pub fn sandbox_mounts(&self, sandbox_id: &str) -> Result<Vec<HeldMount>, StoreError> {
        held_in(&self.conn(), sandbox_id)
    }
}

/// The layers of a created directory snapshot, retained for one more holder.
fn mount_layers_of(
    tx: &rusqlite::Transaction<'_>,
    snapshot_id: &str,
) -> Result<Result<Vec<String>, MountRefused>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1");
    let Some(row) = tx
        .query_row(&sql, [snapshot_id], row_to_snapshot)
        .optional()?
    else {
        return Ok(Err(MountRefused::NotFound(snapshot_id.to_owned())));
    };
    if row.snapshot.status != SnapshotStatus::Created {
        return Ok(Err(MountRefused::NotUsable(
            snapshot_id.to_owned(),
            row.snapshot.status,
        )));
    }
    if row.snapshot.path.is_none() {
        return Ok(Err(MountRefused::NotADirectorySnapshot(
            snapshot_id.to_owned(),
        )));
    }
    for digest in &row.layers {
        retain(tx, digest, 0)?;
    }
    Ok(Ok(row.layers))
}

/// The sandbox's mounts, each with its slot (rows written before slots keep their positions
/// as slots).
fn held_in(conn: &rusqlite::Connection, sandbox_id: &str) -> Result<Vec<HeldMount>, StoreError> {
    let json: Option<Option<String>> = conn
        .query_row(
            "SELECT mounts FROM sandbox_layers WHERE sandbox_id = ?1",
            [sandbox_id],
            |r| r.get(0),
        )
        .optional()?;
    let mut held: Vec<HeldMount> = match json.flatten() {
        Some(json) => serde_json::from_str(&json)?,
        None => Vec::new(),
    };
    for (i, m) in held.iter_mut().enumerate() {
        m.slot.get_or_insert(i);
    }
    Ok(held)
}

/// Writes a sandbox's mounts (making its layers row when it has none yet).
fn write_held(
    tx: &rusqlite::Transaction<'_>,
    sandbox_id: &str,
    held: &[HeldMount],
) -> Result<(), StoreError> {
    let json = (!held.is_empty())
        .then(|| serde_json::to_string(held))
        .transpose()?;
    tx.execute(
        "INSERT INTO sandbox_layers (sandbox_id, snapshot_id, layers, mounts) \
         VALUES (?1, NULL, '[]', ?2) ON CONFLICT (sandbox_id) DO UPDATE SET mounts = ?2",
        params![sandbox_id, json],
    )?;
    Ok(())
}

/// The layer digests held by a `sandbox_layers.mounts` value.
pub(super) fn mount_layers(json: Option<&str>) -> Result<Vec<String>, StoreError> {
    let Some(json) = json else {
        return Ok(Vec::new());
    };
    let held: Vec<HeldMount> = serde_json::from_str(json)?;
    Ok(held.into_iter().flat_map(|m| m.layers).collect())
}
