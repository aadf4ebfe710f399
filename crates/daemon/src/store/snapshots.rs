//! Snapshot rows, the layers they stack, and the reference counts that decide when a layer's
//! directory may go.
//!
//! A layer is held by every snapshot in status `created` whose chain lists it and by every
//! sandbox made from such a snapshot (`sandbox_layers`). Each change of a count happens in the
//! same transaction as the change that causes it, so a `kill -9` of the daemon leaves counts
//! that match the rows. Directories are created before their first reference is committed and
//! deleted after their last one is: what a crash can leave is a directory no row holds, which
//! the daemon deletes at its next start.

use belljar_api::{KeepLastSnapshots, ListSnapshotsQuery, Snapshot, SnapshotStatus};
use rusqlite::{OptionalExtension, Row, params};

use super::layers::{release, retain};
use super::{Store, StoreError, enum_col, enum_to_sql, json_col};

pub(super) const COLUMNS: &str = "id, status, status_reason, source_sandbox_id, parent_id, image, layers, \
    size_bytes, created_at, expiration_ms, expires_at, frozen_ms, path, image_id";

/// A snapshot with what the API does not show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub snapshot: Snapshot,
    /// Layer digests, topmost (this snapshot's own) first.
    pub layers: Vec<String>,
    /// Lifetime after the last use, ms; 0 never expires.
    pub expiration_ms: i64,
}

impl SnapshotRow {
    /// The depth a chain of `layers` shows: its length, saturating (chains stop at 128
    /// layers, so it never does).
    pub fn depth_of<T>(layers: &[T]) -> u32 {
        u32::try_from(layers.len()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
impl SnapshotRow {
    /// The unit tests' snapshot: created from `sbx_a` on `base` at `created_at`, with `layers`
    /// (topmost first), never expiring.
    pub fn fixture(id: &str, layers: &[&str], created_at: i64) -> Self {
        Self {
            snapshot: Snapshot {
                id: id.into(),
                status: SnapshotStatus::Created,
                status_reason: None,
                source_sandbox_id: "sbx_a".into(),
                parent: None,
                image: "base".into(),
                size_bytes: 1,
                depth: SnapshotRow::depth_of(layers),
                created_at,
                expires_at: None,
                frozen_ms: None,
                path: None,
                image_id: None,
            },
            layers: layers.iter().map(|s| s.to_string()).collect(),
            expiration_ms: 0,
        }
    }
}

/// What a sandbox stacks and how its snapshots are kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxLayers {
    pub sandbox_id: String,
    /// The snapshot the sandbox was made from.
    pub snapshot_id: Option<String>,
    /// Layer digests, topmost first.
    pub layers: Vec<String>,
    pub snapshot_expiration_ms: Option<i64>,
    pub keep_last: Option<KeepLastSnapshots>,
}

/// What [`Store::restack_sandbox`] did: the sandbox's new chain of layers (topmost first) and
/// the layers no one holds any more.
pub type Restacked = (Vec<String>, Vec<String>);

/// One page of a listing and the cursor of the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotPage {
    pub snapshots: Vec<SnapshotRow>,
    pub next_cursor: Option<String>,
}

impl Store {
    /// Records a snapshot and takes a reference on each layer of its chain (a new layer is
    /// added with `new_layer_size` bytes).
    pub fn insert_snapshot(
        &self,
        row: &SnapshotRow,
        new_layer_size: u64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let s = &row.snapshot;
        tx.execute(
            &format!(
                "INSERT INTO snapshots ({COLUMNS}) VALUES \
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
            ),
            params![
                s.id,
                enum_to_sql(&s.status),
                s.status_reason,
                s.source_sandbox_id,
                s.parent,
                s.image,
                serde_json::to_string(&row.layers)?,
                s.size_bytes as i64,
                s.created_at,
                row.expiration_ms,
                s.expires_at,
                s.frozen_ms.map(|f| f as i64),
                s.path,
                s.image_id,
            ],
        )?;
        if s.status == SnapshotStatus::Created {
            for (i, digest) in row.layers.iter().enumerate() {
                let size = if i == 0 { new_layer_size } else { 0 };
                retain(&tx, digest, size)?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1");
        Ok(self
            .conn()
            .query_row(&sql, [id], row_to_snapshot)
            .optional()?)
    }

    /// Marks a created or failed snapshot deleted and drops its references; returns the
    /// layers that no one holds any more (their directories may go), or `None` when it was
    /// already deleted.
    pub fn delete_snapshot(&self, id: &str) -> Result<Option<Vec<String>>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1");
        let Some(row) = tx.query_row(&sql, [id], row_to_snapshot).optional()? else {
            return Ok(None);
        };
        let held = match row.snapshot.status {
            SnapshotStatus::Created => row.layers.as_slice(),
            // A failed capture took no reference: deleting it only marks it, which is how a
            // persistent sandbox's unsaved session is discarded (see `persist.rs`).
            SnapshotStatus::Failed => &[],
            SnapshotStatus::Deleted => return Ok(None),
        };
        tx.execute(
            "UPDATE snapshots SET status = 'deleted', expires_at = NULL WHERE id = ?1",
            [id],
        )?;
        let freed = release(&tx, held)?;
        tx.commit()?;
        Ok(Some(freed))
    }

    /// Records what a new sandbox stacks: the chain of `layers.snapshot_id`, if any (taking a
    /// reference on each layer, and restarting the snapshot's expiration from `now`), and its
    /// snapshot policy. Answers `None` when the snapshot does not exist, `Some(Err(status))`
    /// when it is not `created` (nothing is recorded then), else the snapshot's row (an empty
    /// one for a sandbox made from the image alone).
    pub fn use_snapshot(
        &self,
        layers: &SandboxLayers,
        now: i64,
    ) -> Result<Option<Result<SnapshotRow, SnapshotStatus>>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut chain = Vec::new();
        let mut used = None;
        if let Some(id) = &layers.snapshot_id {
            let sql = format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1");
            let Some(row) = tx.query_row(&sql, [id], row_to_snapshot).optional()? else {
                return Ok(None);
            };
            if row.snapshot.status != SnapshotStatus::Created {
                return Ok(Some(Err(row.snapshot.status)));
            }
            if row.expiration_ms > 0 {
                tx.execute(
                    "UPDATE snapshots SET expires_at = ?2 WHERE id = ?1",
                    params![id, now.saturating_add(row.expiration_ms)],
                )?;
            }
            chain = row.layers.clone();
            used = Some(row);
        }
        for digest in &chain {
            retain(&tx, digest, 0)?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO sandbox_layers \
             (sandbox_id, snapshot_id, layers, snapshot_expiration_ms, keep_last) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                layers.sandbox_id,
                layers.snapshot_id,
                serde_json::to_string(&chain)?,
                layers.snapshot_expiration_ms,
                layers
                    .keep_last
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()?,
            ],
        )?;
        tx.commit()?;
        Ok(Some(Ok(used.unwrap_or_else(|| SnapshotRow {
            snapshot: empty_snapshot(),
            layers: Vec::new(),
            expiration_ms: 0,
        }))))
    }

    /// Replaces a sandbox's snapshot policy: the expiration its snapshots get by default and
    /// its `keep_last_snapshots` (`None` removes each). `Ok(false)` when the sandbox has no
    /// layers recorded.
    pub fn set_snapshot_policy(
        &self,
        sandbox_id: &str,
        snapshot_expiration_ms: Option<i64>,
        keep_last: Option<&KeepLastSnapshots>,
    ) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "UPDATE sandbox_layers SET snapshot_expiration_ms = ?2, keep_last = ?3 \
             WHERE sandbox_id = ?1",
            params![
                sandbox_id,
                snapshot_expiration_ms,
                keep_last.map(serde_json::to_string).transpose()?,
            ],
        )?;
        Ok(n == 1)
    }

    pub fn sandbox_layers(&self, sandbox_id: &str) -> Result<Option<SandboxLayers>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT sandbox_id, snapshot_id, layers, snapshot_expiration_ms, keep_last \
                 FROM sandbox_layers WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| {
                    let keep: Option<String> = r.get(4)?;
                    Ok(SandboxLayers {
                        sandbox_id: r.get(0)?,
                        snapshot_id: r.get(1)?,
                        layers: json_col(2, &r.get::<_, String>(2)?)?,
                        snapshot_expiration_ms: r.get(3)?,
                        keep_last: keep.map(|k| json_col(4, &k)).transpose()?,
                    })
                },
            )
            .optional()?)
    }

    /// Moves a sandbox onto the chain of `snapshot_id` (a persistent sandbox starting again
    /// from its latest snapshot) in one transaction: references are taken on the new chain
    /// before those on the old one are dropped, and the snapshot's expiration restarts. The
    /// sandbox's snapshot policy stays. Returns the new chain and the layers no one holds any
    /// more, or `None` (changing nothing) when the snapshot is not `created`.
    pub fn restack_sandbox(
        &self,
        sandbox_id: &str,
        snapshot_id: &str,
        now: i64,
    ) -> Result<Option<Restacked>, StoreError> {
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
        if row.expiration_ms > 0 {
            tx.execute(
                "UPDATE snapshots SET expires_at = ?2 WHERE id = ?1",
                params![snapshot_id, now.saturating_add(row.expiration_ms)],
            )?;
        }
        for digest in &row.layers {
            retain(&tx, digest, 0)?;
        }
        let old: Option<String> = tx
            .query_row(
                "SELECT layers FROM sandbox_layers WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| r.get(0),
            )
            .optional()?;
        let old: Vec<String> = old
            .map(|o| serde_json::from_str(&o))
            .transpose()?
            .unwrap_or_default();
        tx.execute(
            "INSERT INTO sandbox_layers (sandbox_id, snapshot_id, layers) VALUES (?1, ?2, ?3) \
             ON CONFLICT (sandbox_id) DO UPDATE SET snapshot_id = ?2, layers = ?3",
            params![sandbox_id, snapshot_id, serde_json::to_string(&row.layers)?],
        )?;
        let freed = release(&tx, &old)?;
        tx.commit()?;
        Ok(Some((row.layers, freed)))
    }

    /// Created snapshots whose expiration is at or before `now`.
    pub fn expired_snapshots(&self, now: i64) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id FROM snapshots WHERE status = 'created' \
             AND expires_at IS NOT NULL AND expires_at <= ?1 ORDER BY expires_at",
        )?;
        let rows = stmt.query_map([now], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The created snapshots of a sandbox, newest first.
    pub fn created_snapshots_of(&self, sandbox_id: &str) -> Result<Vec<SnapshotRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE source_sandbox_id = ?1 \
             AND status = 'created' AND path IS NULL ORDER BY created_at DESC, id DESC"
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([sandbox_id], row_to_snapshot)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Sets a created snapshot's lifetime and its expiry time.
    pub fn set_snapshot_expiration(
        &self,
        id: &str,
        expiration_ms: i64,
        expires_at: Option<i64>,
    ) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE snapshots SET expiration_ms = ?2, expires_at = ?3 \
             WHERE id = ?1 AND status = 'created'",
            params![id, expiration_ms, expires_at],
        )?;
        Ok(())
    }

    /// A page of snapshots, newest first, filtered as `query` asks.
    pub fn list_snapshots(&self, query: &ListSnapshotsQuery) -> Result<SnapshotPage, StoreError> {
        let limit = query.limit.unwrap_or(50).clamp(1, 200) as i64;
        let status = query.status.as_ref().map(enum_to_sql);
        let (cur_created, cur_id) = match query.cursor.as_deref() {
            Some(c) => {
                let (t, id) = c.split_once('_').ok_or(StoreError::BadCursor)?;
                (
                    Some(t.parse::<i64>().map_err(|_| StoreError::BadCursor)?),
                    Some(id.to_owned()),
                )
            }
            None => (None, None),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM snapshots WHERE \
             (?1 IS NULL OR status = ?1) \
             AND (?2 IS NULL OR source_sandbox_id = ?2) \
             AND (?3 IS NULL OR created_at >= ?3) \
             AND (?4 IS NULL OR created_at < ?4) \
             AND (?5 IS NULL OR created_at < ?5 OR (created_at = ?5 AND id < ?6)) \
             ORDER BY created_at DESC, id DESC LIMIT ?7"
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(
            params![
                status,
                query.sandbox_id,
                query.since,
                query.until,
                cur_created,
                cur_id,
                limit + 1
            ],
            row_to_snapshot,
        )?;
        let mut snapshots: Vec<SnapshotRow> = rows.collect::<Result<_, _>>()?;
        let next_cursor = if snapshots.len() as i64 > limit {
            snapshots.truncate(limit as usize);
            snapshots
                .last()
                .map(|s| format!("{}_{}", s.snapshot.created_at, s.snapshot.id))
        } else {
            None
        };
        Ok(SnapshotPage {
            snapshots,
            next_cursor,
        })
    }
}

fn empty_snapshot() -> Snapshot {
    Snapshot {
        id: String::new(),
        status: SnapshotStatus::Created,
        status_reason: None,
        source_sandbox_id: String::new(),
        parent: None,
        image: String::new(),
        size_bytes: 0,
        depth: 0,
        created_at: 0,
        expires_at: None,
        frozen_ms: None,
        path: None,
        image_id: None,
    }
}

pub(super) fn row_to_snapshot(r: &Row<'_>) -> rusqlite::Result<SnapshotRow> {
    let layers: Vec<String> = json_col(6, &r.get::<_, String>(6)?)?;
    Ok(SnapshotRow {
        snapshot: Snapshot {
            id: r.get(0)?,
            status: enum_col(1, &r.get::<_, String>(1)?)?,
            status_reason: r.get(2)?,
            source_sandbox_id: r.get(3)?,
            parent: r.get(4)?,
            image: r.get(5)?,
            size_bytes: r.get::<_, i64>(7)? as u64,
            depth: SnapshotRow::depth_of(&layers),
            created_at: r.get(8)?,
            expires_at: r.get(10)?,
            frozen_ms: r.get::<_, Option<i64>>(11)?.map(|f| f as u64),
            path: r.get(12)?,
            image_id: r.get(13)?,
        },
        layers,
        expiration_ms: r.get(9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, sandbox: &str, layers: &[&str], created_at: i64) -> SnapshotRow {
        SnapshotRow {
            snapshot: Snapshot {
                id: id.into(),
                source_sandbox_id: sandbox.into(),
                image: "base".into(),
                created_at,
                expires_at: Some(created_at + 1000),
                depth: SnapshotRow::depth_of(layers),
                ..empty_snapshot()
            },
            layers: layers.iter().map(|s| s.to_string()).collect(),
            expiration_ms: 1000,
        }
    }

    /// A layer lives while a snapshot or a sandbox holds it, and no longer.
    #[test]
    fn layers_are_freed_with_their_last_holder() {
        let store = Store::open_in_memory().unwrap();
        store
            .insert_snapshot(&row("snap_a", "sbx_1", &["A"], 1), 10)
            .unwrap();
        store
            .insert_snapshot(&row("snap_b", "sbx_2", &["B", "A"], 2), 20)
            .unwrap();
        let from_b = SandboxLayers {
            sandbox_id: "sbx_3".into(),
            snapshot_id: Some("snap_b".into()),
            ..Default::default()
        };
        let used = store.use_snapshot(&from_b, 500).unwrap().unwrap().unwrap();
        assert_eq!(used.layers, ["B", "A"]);
        assert_eq!(
            store
                .snapshot("snap_b")
                .unwrap()
                .unwrap()
                .snapshot
                .expires_at,
            Some(1500)
        );
        // Deleting both snapshots frees nothing: sbx_3 still builds on both layers.
        assert_eq!(store.delete_snapshot("snap_a").unwrap(), Some(vec![]));
        assert_eq!(store.delete_snapshot("snap_b").unwrap(), Some(vec![]));
        assert_eq!(
            store.delete_snapshot("snap_b").unwrap(),
            None,
            "deleted once"
        );
        assert_eq!(store.live_layers().unwrap().len(), 2);
        // A deleted snapshot cannot be used again.
        let again = SandboxLayers {
            sandbox_id: "sbx_4".into(),
            snapshot_id: Some("snap_b".into()),
            ..Default::default()
        };
        assert_eq!(
            store.use_snapshot(&again, 0).unwrap(),
            Some(Err(SnapshotStatus::Deleted))
        );
        let unknown = SandboxLayers {
            snapshot_id: Some("snap_zz".into()),
            ..again
        };
        assert_eq!(store.use_snapshot(&unknown, 0).unwrap(), None);
        // sbx_3 is gone (and never existed in `sandboxes`): its release frees both.
        assert_eq!(store.orphan_sandbox_layers().unwrap(), ["sbx_3"]);
        let mut freed = store.release_sandbox_layers("sbx_3").unwrap();
        freed.sort();
        assert_eq!(freed, ["A", "B"]);
        assert!(store.live_layers().unwrap().is_empty());
    }

    /// Restacking takes the new chain before dropping the old one, so a layer both hold
    /// survives, and a layer only the old chain held is freed.
    #[test]
    fn restacking_moves_a_sandbox_onto_a_newer_chain() {
        let store = Store::open_in_memory().unwrap();
        store
            .insert_snapshot(&row("snap_a", "sbx_1", &["A"], 1), 1)
            .unwrap();
        let from_a = SandboxLayers {
            sandbox_id: "sbx_1".into(),
            snapshot_id: Some("snap_a".into()),
            snapshot_expiration_ms: Some(7),
            ..Default::default()
        };
        store.use_snapshot(&from_a, 0).unwrap().unwrap().unwrap();
        store
            .insert_snapshot(&row("snap_b", "sbx_1", &["B", "A"], 2), 1)
            .unwrap();
        assert_eq!(store.delete_snapshot("snap_a").unwrap(), Some(vec![]));
        let (chain, freed) = store
            .restack_sandbox("sbx_1", "snap_b", 5)
            .unwrap()
            .unwrap();
        assert_eq!((chain, freed), (vec!["B".into(), "A".into()], vec![]));
        let held = store.sandbox_layers("sbx_1").unwrap().unwrap();
        assert_eq!(held.snapshot_id.as_deref(), Some("snap_b"));
        assert_eq!(held.snapshot_expiration_ms, Some(7), "the policy stays");
        assert_eq!(store.restack_sandbox("sbx_1", "snap_a", 5).unwrap(), None);
        assert_eq!(store.delete_snapshot("snap_b").unwrap(), Some(vec![]));
        let mut freed = store.release_sandbox_layers("sbx_1").unwrap();
        freed.sort();
        assert_eq!(freed, ["A", "B"]);
    }

    #[test]
    fn expiry_and_listing_follow_the_clock_and_the_cursor() {
        let store = Store::open_in_memory().unwrap();
        for i in 0..5 {
            store
                .insert_snapshot(&row(&format!("snap_{i}"), "sbx_1", &["L"], i * 100), 1)
                .unwrap();
        }
        assert_eq!(store.expired_snapshots(1099).unwrap(), ["snap_0"]);
        assert_eq!(store.expired_snapshots(1200).unwrap().len(), 3);
        let mut q = ListSnapshotsQuery {
            limit: Some(2),
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = store.list_snapshots(&q).unwrap();
            seen.extend(page.snapshots.into_iter().map(|s| s.snapshot.id));
            match page.next_cursor {
                Some(c) => q.cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, ["snap_4", "snap_3", "snap_2", "snap_1", "snap_0"]);
        let q = ListSnapshotsQuery {
            since: Some(100),
            until: Some(300),
            ..Default::default()
        };
        let page = store.list_snapshots(&q).unwrap();
        assert_eq!(page.snapshots.len(), 2);
        assert_eq!(store.created_snapshots_of("sbx_1").unwrap().len(), 5);
    }
}
