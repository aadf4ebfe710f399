//! Layer reference counts and the holds that take them: sandboxes (their whole chain while
//! they exist), a squash in progress (the chain it reads), and the rewrite of snapshot chains
//! when a squash has merged their deepest layers into one.
//!
//! A squash is remembered (`squashes`: the chain and the layer it became) while the merged
//! layer lives: a snapshot of a sandbox made from the chain before its squash stacks the same
//! chain under its own layer, and takes the merged layer instead of a second copy.
//!
//! The rules of `snapshots.rs` hold here too: each count changes in the same transaction as
//! what causes it, so a `kill -9` leaves counts that match the rows.

use std::collections::HashSet;

use belljar_api::SnapshotStatus;
use rusqlite::{OptionalExtension, Transaction, params};

use super::snapshots::{COLUMNS, row_to_snapshot};
use super::{Store, StoreError};

/// The ids of the snapshots a squash moved onto the merged layer, and the layers no one holds
/// any more.
pub type Squashed = (Vec<String>, Vec<String>);

impl Store {
    /// Drops a deleted sandbox's references; returns the layers no one holds any more.
    pub fn release_sandbox_layers(&self, sandbox_id: &str) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let held: Option<(String, Option<String>)> = tx
            .query_row(
                "SELECT layers, mounts FROM sandbox_layers WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((chain, mounts)) = held else {
            return Ok(Vec::new());
        };
        let mut chain: Vec<String> = serde_json::from_str(&chain)?;
        chain.extend(super::mounts::mount_layers(mounts.as_deref())?);
        tx.execute(
            "DELETE FROM sandbox_layers WHERE sandbox_id = ?1",
            [sandbox_id],
        )?;
        let freed = release(&tx, &chain)?;
        tx.commit()?;
        Ok(freed)
    }

    /// Whether a sandbox holds snapshot layers (it was made from a snapshot or mounts one).
    /// Every sandbox has a `sandbox_layers` row (it carries the options of its future
    /// snapshots); one of the image alone holds an empty chain and no mounts.
    pub fn holds_layers(&self, sandbox_id: &str) -> Result<bool, StoreError> {
        let conn = self.conn();
        let held: Option<(String, Option<String>)> = conn
            .query_row(
                "SELECT layers, mounts FROM sandbox_layers WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((chain, mounts)) = held else {
            return Ok(false);
        };
        let chain: Vec<String> = serde_json::from_str(&chain)?;
        Ok(!chain.is_empty() || !super::mounts::mount_layers(mounts.as_deref())?.is_empty())
    }

    /// Sandboxes that hold layers but no longer exist (a crash between deleting a sandbox and
    /// releasing its layers).
    pub fn orphan_sandbox_layers(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT sandbox_id FROM sandbox_layers \
             WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every layer someone holds.
    pub fn live_layers(&self) -> Result<HashSet<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT digest FROM layers WHERE refs > 0")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Holds the chain of a created snapshot for `holder` (a squash reading it), as a sandbox
    /// made from it would; `None` when the snapshot is not created. A holder that is no
    /// sandbox is released at the next start like a deleted sandbox's hold.
    pub fn hold_snapshot_chain(
        &self,
        holder: &str,
        snapshot_id: &str,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1");
        let Some(row) = tx
            .query_row(&sql, [snapshot_id], row_to_snapshot)
            .optional()?
            .filter(|r| r.snapshot.status == SnapshotStatus::Created)
        else {
            return Ok(None);
        };
        for digest in &row.layers {
            retain(&tx, digest, 0)?;
        }
        tx.execute(
            "INSERT INTO sandbox_layers (sandbox_id, snapshot_id, layers) VALUES (?1, NULL, ?2)",
            params![holder, serde_json::to_string(&row.layers)?],
        )?;
        tx.commit()?;
        Ok(Some(row.layers))
    }

    /// Moves every created snapshot whose chain ends with `chain` onto `merged` (a layer of
    /// `size` bytes holding the same files as `chain` stacked): its own layers above stay,
    /// `chain` becomes the one `merged`. Snapshots whose upper layers already list `merged`
    /// keep their chain.
    pub fn squash_chain(
        &self,
        chain: &[String],
        merged: &str,
        size: u64,
    ) -> Result<Squashed, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let rows: Vec<(String, String)> = {
            let mut stmt =
                tx.prepare("SELECT id, layers FROM snapshots WHERE status = 'created'")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut moved = Vec::new();
        let mut freed = Vec::new();
        for (id, layers) in rows {
            let layers: Vec<String> = serde_json::from_str(&layers)?;
            let Some(upper) = layers.strip_suffix(chain) else {
                continue;
            };
            if chain.is_empty() || upper.iter().any(|d| d == merged) {
                continue;
            }
            let mut new = upper.to_vec();
            new.push(merged.to_owned());
            retain(&tx, merged, size)?;
            tx.execute(
                "UPDATE snapshots SET layers = ?2 WHERE id = ?1",
                params![id, serde_json::to_string(&new)?],
            )?;
            freed.extend(release(&tx, chain)?);
            moved.push(id);
        }
        if chain.len() > 1 {
            tx.execute(
                "INSERT OR REPLACE INTO squashes (chain, merged) VALUES (?1, ?2)",
                params![serde_json::to_string(chain)?, merged],
            )?;
        }
        tx.commit()?;
        Ok((moved, freed))
    }

    /// The longest lower part `layers[i..]` (`i >= 1`, at least two layers) that an earlier
    /// squash merged into a layer someone still holds: `(i, merged)`. The top layer is never
    /// part of it, so a new snapshot's own layer stays its own.
    pub fn squashed_suffix(
        &self,
        layers: &[String],
    ) -> Result<Option<(usize, String)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT s.merged FROM squashes s JOIN layers l ON l.digest = s.merged \
             WHERE s.chain = ?1 AND l.refs > 0",
        )?;
        for i in 1..layers.len().saturating_sub(1) {
            let chain = serde_json::to_string(&layers[i..])?;
            let merged: Option<String> = stmt.query_row([chain], |r| r.get(0)).optional()?;
            if let Some(merged) = merged.filter(|m| !layers[..i].contains(m)) {
                return Ok(Some((i, merged)));
            }
        }
        Ok(None)
    }

    /// Created snapshots whose chain is deeper than `depth`, oldest first.
    pub fn deep_snapshots(&self, depth: usize) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, layers FROM snapshots WHERE status = 'created' \
             ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut deep = Vec::new();
        for row in rows {
            let (id, layers) = row?;
            let layers: Vec<String> = serde_json::from_str(&layers)?;
            if layers.len() > depth {
                deep.push(id);
            }
        }
        Ok(deep)
    }
}

pub(super) fn retain(tx: &Transaction<'_>, digest: &str, size: u64) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO layers (digest, size_bytes, refs) VALUES (?1, ?2, 1) \
         ON CONFLICT (digest) DO UPDATE SET refs = refs + 1",
        params![digest, size as i64],
    )?;
    Ok(())
}

/// Drops one reference on each layer; returns (and forgets) those that reach zero.
pub(super) fn release(tx: &Transaction<'_>, chain: &[String]) -> Result<Vec<String>, StoreError> {
    let mut freed = Vec::new();
    for digest in chain {
        tx.execute(
            "UPDATE layers SET refs = refs - 1 WHERE digest = ?1",
            [digest],
        )?;
        let refs: Option<i64> = tx
            .query_row("SELECT refs FROM layers WHERE digest = ?1", [digest], |r| {
                r.get(0)
            })
            .optional()?;
        if refs.is_some_and(|r| r <= 0) {
            tx.execute("DELETE FROM layers WHERE digest = ?1", [digest])?;
            tx.execute("DELETE FROM squashes WHERE merged = ?1", [digest])?;
            freed.push(digest.clone());
        }
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {

    use super::super::SnapshotRow;
    use super::*;

    /// A squash moves exactly the snapshots built on the chain, keeps what a holder reads, and
    /// frees the old layers only when nothing else holds them.
    #[test]
    fn a_squash_moves_the_snapshots_built_on_the_chain() {
        let store = Store::open_in_memory().unwrap();
        store
            .insert_snapshot(&SnapshotRow::fixture("snap_1", &["A"], 1), 1)
            .unwrap();
        store
            .insert_snapshot(&SnapshotRow::fixture("snap_2", &["B", "A"], 2), 1)
            .unwrap();
        store
            .insert_snapshot(&SnapshotRow::fixture("snap_3", &["C", "B", "A"], 3), 1)
            .unwrap();
        store
            .insert_snapshot(&SnapshotRow::fixture("snap_x", &["X", "A"], 4), 1)
            .unwrap();
        assert_eq!(
            store.deep_snapshots(1).unwrap(),
            ["snap_2", "snap_3", "snap_x"]
        );
        let held = store
            .hold_snapshot_chain("squash-snap_2", "snap_2")
            .unwrap();
        assert_eq!(held.unwrap(), ["B", "A"]);
        let chain = ["B".to_string(), "A".to_string()];
        let (moved, freed) = store.squash_chain(&chain, "M", 9).unwrap();
        assert_eq!(moved, ["snap_2", "snap_3"]);
        assert!(freed.is_empty(), "snap_1, snap_x and the hold keep A and B");
        let layers = |id: &str| store.snapshot(id).unwrap().unwrap().layers;
        assert_eq!(layers("snap_2"), ["M"]);
        assert_eq!(layers("snap_3"), ["C", "M"]);
        assert_eq!(layers("snap_x"), ["X", "A"]);
        assert_eq!(store.deep_snapshots(1).unwrap(), ["snap_3", "snap_x"]);
        // The hold's release frees B (only the old snapshot_2 chain had it).
        assert_eq!(
            store.release_sandbox_layers("squash-snap_2").unwrap(),
            ["B"]
        );
        assert!(store.live_layers().unwrap().contains("M"));
        assert_eq!(store.hold_snapshot_chain("h", "snap_zz").unwrap(), None);

        // A snapshot of a sandbox made from snap_2 before the squash stacks [E, B, A]: the
        // squash is remembered, so [B, A] is M again, not a second merge.
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            store.squashed_suffix(&own(&["E", "B", "A"])).unwrap(),
            Some((1, "M".into()))
        );
        assert_eq!(
            store.squashed_suffix(&own(&["F", "E", "B", "A"])).unwrap(),
            Some((2, "M".into()))
        );
        assert_eq!(store.squashed_suffix(&own(&["B", "A"])).unwrap(), None);
        assert_eq!(store.squashed_suffix(&own(&["X", "A"])).unwrap(), None);
        // Once M is gone, so is the memory of it.
        for id in ["snap_2", "snap_3"] {
            store.delete_snapshot(id).unwrap();
        }
        assert!(!store.live_layers().unwrap().contains("M"));
        assert_eq!(store.squashed_suffix(&own(&["E", "B", "A"])).unwrap(), None);
        let rows: i64 = store
            .conn()
            .query_row("SELECT count(*) FROM squashes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0);
    }

    /// Only a sandbox made from a snapshot (or mounting one) holds layers: a delete waits for
    /// the teardown of those alone, so that every other delete answers at once.
    #[test]
    fn a_sandbox_of_the_image_alone_holds_no_layers() {
        let store = Store::open_in_memory().unwrap();
        store
            .insert_snapshot(&SnapshotRow::fixture("snap_1", &["A"], 1), 1)
            .unwrap();
        let holder = |sandbox: &str, snapshot: Option<&str>| super::super::SandboxLayers {
            sandbox_id: sandbox.into(),
            snapshot_id: snapshot.map(str::to_owned),
            layers: Vec::new(),
            snapshot_expiration_ms: None,
            keep_last: None,
        };
        store.use_snapshot(&holder("sbx_plain", None), 1).unwrap();
        store
            .use_snapshot(&holder("sbx_from", Some("snap_1")), 1)
            .unwrap();
        assert!(store.sandbox_layers("sbx_plain").unwrap().is_some());
        assert!(!store.holds_layers("sbx_plain").unwrap());
        assert!(store.holds_layers("sbx_from").unwrap());
        assert!(!store.holds_layers("sbx_none").unwrap());
    }
}
