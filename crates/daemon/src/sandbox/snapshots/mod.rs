//! Snapshots: taking them (Vercel's semantics by default: the sandbox stops and its writable
//! layer becomes the snapshot; or live, with the sandbox frozen while its layer is copied),
//! starting sandboxes from them, listing and deleting them, and the reaper that applies
//! expiration and `keep_last_snapshots`.
//!
//! A snapshot's files are a chain of layers (see `belljar_namespace::layer`): its own, then
//! those of the snapshot its sandbox was made from. Layers live in `<data>/layers/<digest>`
//! and are reference-counted in the store; a layer's directory is deleted once no snapshot in
//! status `created` and no sandbox holds it.
//!
//! Crash safety (`kill -9` of the daemon at any point): a layer directory gets its final name
//! only when complete, and the snapshot row that references it is committed after that; the
//! start-up [`Sandboxes::recover_snapshots`] deletes half-made and unreferenced directories
//! and thaws a sandbox left frozen by a live snapshot (a marker file in its directory says so);
//! a stopping snapshot is finished after a crash (`stopping.rs`).

pub(super) mod diff;
pub(super) mod mounts;
pub(super) mod squash;
pub(super) mod stopping;

use std::path::PathBuf;
use std::time::Duration;

use belljar_api::{
    CreateSnapshot, DEFAULT_EXPIRATION_MS, ListSnapshotsQuery, Sandbox, SandboxStatus, Snapshot,
    SnapshotList, SnapshotStatus, Source,
};

use super::backend::CapturedLayer;
use super::{SandboxError, Sandboxes};
use crate::store::{SandboxLayers, SnapshotRow, StoreError};
use crate::util::{is_id, new_id, now_ms};

/// How often the reaper looks for expired snapshots.
const REAP_INTERVAL: Duration = Duration::from_secs(60);
/// The most layers a running sandbox's snapshot may stack: overlayfs stacks at most 500
/// lower directories. Snapshots deeper than `Settings::squash_depth` are squashed in the
/// background (`squash.rs`), so only a sandbox made from a chain before its squash gets near.
const MAX_DEPTH: usize = 128;
/// Left in a sandbox's directory while a live snapshot holds it frozen.
pub(super) const FROZEN_MARKER: &str = "snapshot-frozen";

/// Snapshot state kept in memory: one lock serialises creating and deleting layer
/// directories, so a capture that finds its content already stored cannot lose the directory
/// to a concurrent deletion of the last snapshot that held it.
#[derive(Default)]
pub(super) struct SnapshotState {
    pub(super) layers: tokio::sync::Mutex<()>,
    pub(super) squash: super::snapshots::squash::SquashState,
}

/// A capture to record as a snapshot ([`Sandboxes::record_snapshot`]).
pub(super) struct Taken {
    /// The snapshot's id, chosen before the capture (a stopping snapshot's intent names it).
    pub id: String,
    pub captured: Result<CapturedLayer, SandboxError>,
    /// How long a live snapshot held the sandbox frozen; `None` for one that stopped it.
    pub frozen_ms: Option<u64>,
    /// As asked (`None`: the sandbox's `snapshot_expiration_ms`, else 30 days).
    pub expiration_ms: Option<i64>,
}

impl Taken {
    /// The capture of a stopped sandbox, as a new snapshot.
    pub(super) fn stopped(
        captured: Result<CapturedLayer, SandboxError>,
        expiration_ms: Option<i64>,
    ) -> Self {
        Self {
            id: new_id("snap"),
            captured,
            frozen_ms: None,
            expiration_ms,
        }
    }
}

/// What a new sandbox made from a snapshot stacks.
pub(super) struct FromSnapshot {
    /// Layer directories, topmost first.
    pub layers: Vec<PathBuf>,
}

impl Sandboxes {
    pub(super) fn layers_dir(&self) -> PathBuf {
        self.inner.paths.dirs.data.join("layers")
    }

    /// Takes a snapshot of a running or paused sandbox. A paused one with `auto_resume` is
    /// resumed first, as for any use; without, a live snapshot captures it as it stands
    /// (already frozen: `frozen_ms` 0) and leaves it paused, and a stopping one stops it as
    /// `stop` does.
    pub async fn snapshot(&self, id: &str, req: CreateSnapshot) -> Result<Snapshot, SandboxError> {
        if req.expiration_ms.is_some_and(|e| e < 0) {
            return Err(SandboxError::BadRequest(
                "expiration_ms: must be 0 (never) or positive".into(),
            ));
        }
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let mut sandbox = self.get(id)?;
        if sandbox.status == SandboxStatus::Paused && sandbox.lifecycle.auto_resume {
            tracing::info!(sandbox = %id, "resuming a paused sandbox to snapshot it");
            sandbox = self.resume_locked(sandbox).await?;
        }
        if !matches!(
            sandbox.status,
            SandboxStatus::Running | SandboxStatus::Paused
        ) {
            return Err(SandboxError::NotRunning {
                id: sandbox.id,
                status: sandbox.status.as_str(),
            });
        }
        if let Some(path) = req.path {
            return self
                .snapshot_directory(&sandbox, path, req.expiration_ms)
                .await;
        }
        let held = self.inner.store.sandbox_layers(id)?.unwrap_or_default();
        if held.layers.len() >= MAX_DEPTH {
            return Err(SandboxError::Conflict(format!(
                "Sandbox {id} already stacks {} layers, the most a snapshot may have",
                held.layers.len()
            )));
        }
        let layer_lock = self.inner.snapshots.layers.lock().await;
        if !req.keep_running.unwrap_or(false) {
            return self
                .stop_and_snapshot(&sandbox, &held, req.expiration_ms, layer_lock)
                .await;
        }
        let layers_dir = self.layers_dir();
        let (captured, frozen_ms) = self
            .while_frozen(&sandbox, move |b, dir| b.capture(dir, &layers_dir))
            .await?;
        let taken = Taken {
            id: new_id("snap"),
            captured: captured.map_err(SandboxError::from),
            frozen_ms: Some(frozen_ms),
            expiration_ms: req.expiration_ms,
        };
        self.record_snapshot(&sandbox, &held, taken, layer_lock)
            .await
    }

    /// Records what a capture of `sandbox` gave: a `created` snapshot on top of the chain it
    /// held, or a `failed` one; then applies its `keep_last_snapshots` and tells subscribers.
    /// `layer_lock` (held since before the capture) is released before evicted snapshots are
    /// deleted.
    pub(super) async fn record_snapshot(
        &self,
        sandbox: &Sandbox,
        held: &SandboxLayers,
        taken: Taken,
        layer_lock: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Snapshot, SandboxError> {
        let Taken {
            id: snapshot_id,
            captured,
            frozen_ms,
            expiration_ms,
        } = taken;
        let id = &sandbox.id;
        let now = now_ms();
        let expiration_ms = expiration_ms
            .or(held.snapshot_expiration_ms)
            .unwrap_or(DEFAULT_EXPIRATION_MS);
        let mut row = SnapshotRow {
            snapshot: Snapshot {
                id: snapshot_id,
                status: SnapshotStatus::Created,
                status_reason: None,
                source_sandbox_id: id.to_owned(),
                parent: held.snapshot_id.clone(),
                image: sandbox.image.clone(),
                image_id: sandbox.image_id.clone(),
                size_bytes: 0,
                depth: 0,
                created_at: now,
                expires_at: (expiration_ms > 0).then(|| now.saturating_add(expiration_ms)),
                frozen_ms,
                path: None,
            },
            layers: Vec::new(),
            expiration_ms,
        };
        let captured = match captured {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "snapshot failed");
                row.snapshot.status = SnapshotStatus::Failed;
                row.snapshot.status_reason = Some(e.to_string());
                row.snapshot.expires_at = None;
                self.inner.store.insert_snapshot(&row, 0)?;
                self.emit_snapshot(row.snapshot);
                return Err(e);
            }
        };
        row.snapshot.size_bytes = captured.size_bytes;
        // A layer already in the chain (an unchanged sandbox's empty layer) adds nothing.
        if !held.layers.contains(&captured.digest) {
            row.layers.push(captured.digest.clone());
        }
        row.layers.extend(held.layers.iter().cloned());
        // A sandbox made from a chain before its squash: its snapshot takes the merged layer
        // (held: `layer_lock` keeps it from going) instead of being squashed into a new copy.
        if let Some((i, merged)) = self.inner.store.squashed_suffix(&row.layers)? {
            row.layers.truncate(i);
            row.layers.push(merged);
        }
        row.snapshot.depth = SnapshotRow::depth_of(&row.layers);
        self.inner
            .store
            .insert_snapshot(&row, captured.size_bytes)?;
        if held.layers.contains(&captured.digest) || row.layers.is_empty() {
            // Nothing else may hold a directory that no row names; one that another chain
            // holds stays.
            self.remove_unheld(&[captured.digest])?;
        }
        drop(layer_lock);
        let snapshot = self
            .inner
            .store
            .snapshot(&row.snapshot.id)?
            .map_or(row.snapshot, |r| r.snapshot);
        self.emit_snapshot(snapshot.clone());
        if row.layers.len() > self.inner.settings.squash_depth {
            self.squash_soon();
        }
        if let Some(keep) = &held.keep_last {
            self.apply_keep_last(id, held.snapshot_expiration_ms, keep, now)
                .await?;
        }
        Ok(self.get_snapshot(&snapshot.id).unwrap_or(snapshot))
    }

    /// Tells event subscribers (the app's timeline) about a snapshot's new state.
    pub(super) fn emit_snapshot(&self, snapshot: Snapshot) {
        self.inner
            .events
            .emit(crate::store::EventBody::Snapshot(Box::new(snapshot)));
    }

    /// A sandbox's snapshot policy: the expiration its snapshots get by default and its
    /// `keep_last_snapshots` (neither, for a sandbox with no layers recorded).
    pub fn snapshot_policy(
        &self,
        id: &str,
    ) -> (Option<i64>, Option<belljar_api::KeepLastSnapshots>) {
        match self.inner.store.sandbox_layers(id) {
            Ok(Some(held)) => (held.snapshot_expiration_ms, held.keep_last),
            Ok(None) => (None, None),
            Err(e) => {
                tracing::warn!(sandbox = id, error = %e, "cannot read the snapshot policy");
                (None, None)
            }
        }
    }

    /// Changes a sandbox's snapshot policy (Vercel's `update` of `snapshotExpiration` and
    /// `keepLastSnapshots`): `Some(x)` replaces a setting (`Some(None)` removes it), `None`
    /// keeps it. A new `keep_last_snapshots` applies at once to the snapshots the sandbox has.
    pub async fn set_snapshot_policy(
        &self,
        id: &str,
        snapshot_expiration_ms: Option<Option<i64>>,
        keep_last: Option<Option<belljar_api::KeepLastSnapshots>>,
    ) -> Result<(), SandboxError> {
        if let Some(Some(ms)) = snapshot_expiration_ms
            && ms < 0
        {
            return Err(SandboxError::BadRequest(
                "snapshot_expiration_ms: must be 0 (never) or positive".into(),
            ));
        }
        if let Some(Some(keep)) = &keep_last {
            belljar_api::Validate::validate(keep)
                .map_err(|e| SandboxError::BadRequest(e.to_string()))?;
        }
        let expiration = {
            let lock = self.lock_for(id);
            let _guard = lock.lock().await;
            self.record(id)?;
            let held = self
                .inner
                .store
                .sandbox_layers(id)?
                .ok_or_else(|| SandboxError::NotFound(id.to_owned()))?;
            let expiration = snapshot_expiration_ms.unwrap_or(held.snapshot_expiration_ms);
            let keep = keep_last.clone().unwrap_or(held.keep_last);
            if !self
                .inner
                .store
                .set_snapshot_policy(id, expiration, keep.as_ref())?
            {
                return Err(SandboxError::NotFound(id.to_owned()));
            }
            expiration
        };
        // As after a new snapshot: without the sandbox's lock, which deleting does not need.
        if let Some(Some(keep)) = &keep_last {
            self.apply_keep_last(id, expiration, keep, now_ms()).await?;
        }
        Ok(())
    }

    /// Applies `keep_last_snapshots` to a sandbox's snapshots after a new one. Evicted ones
    /// that are not deleted are no longer counted, and the one just evicted goes from the kept
    /// ones' expiration back to the sandbox's (`own_expiration_ms`, else 30 days, from now):
    /// the rule that kept it no longer holds it.
    async fn apply_keep_last(
        &self,
        sandbox_id: &str,
        own_expiration_ms: Option<i64>,
        keep: &belljar_api::KeepLastSnapshots,
        now: i64,
    ) -> Result<(), SandboxError> {
        let all = self.inner.store.created_snapshots_of(sandbox_id)?;
        let count = keep.count as usize;
        let expire = |id: &str, ms: i64| {
            let at = (ms > 0).then(|| now.saturating_add(ms));
            self.inner.store.set_snapshot_expiration(id, ms, at)
        };
        if let Some(ms) = keep.expiration_ms {
            for kept in all.iter().take(count) {
                expire(&kept.snapshot.id, ms)?;
            }
        }
        let evicted = all.iter().skip(count);
        if keep.delete_evicted.unwrap_or(true) {
            for row in evicted {
                self.delete_snapshot(&row.snapshot.id).await?;
            }
        } else if let Some(just) = all.get(count)
            && keep.expiration_ms.is_some()
        {
            expire(
                &just.snapshot.id,
                own_expiration_ms.unwrap_or(DEFAULT_EXPIRATION_MS),
            )?;
            self.emit_snapshot(self.get_snapshot(&just.snapshot.id)?);
        }
        Ok(())
    }

    pub fn get_snapshot(&self, id: &str) -> Result<Snapshot, SandboxError> {
        self.inner
            .store
            .snapshot(id)?
            .map(|r| r.snapshot)
            .ok_or_else(|| SandboxError::SnapshotNotFound(id.to_owned()))
    }

    /// Sets how long a created snapshot lives from now (`0`: never expires).
    pub fn set_snapshot_expiration(
        &self,
        id: &str,
        expiration_ms: i64,
    ) -> Result<Snapshot, SandboxError> {
        if expiration_ms < 0 {
            return Err(SandboxError::BadRequest(
                "expiration_ms: must be 0 (never) or positive".into(),
            ));
        }
        let snap = self.get_snapshot(id)?;
        if snap.status != SnapshotStatus::Created {
            return Err(SandboxError::SnapshotNotUsable {
                id: id.to_owned(),
                status: snap.status.into(),
            });
        }
        let at = (expiration_ms > 0).then(|| now_ms().saturating_add(expiration_ms));
        self.inner
            .store
            .set_snapshot_expiration(id, expiration_ms, at)?;
        let snap = self.get_snapshot(id)?;
        self.emit_snapshot(snap.clone());
        Ok(snap)
    }

    pub fn list_snapshots(&self, query: &ListSnapshotsQuery) -> Result<SnapshotList, SandboxError> {
        if query.limit == Some(0) {
            return Err(SandboxError::BadRequest("limit: must be 1..=200".into()));
        }
        let page = self
            .inner
            .store
            .list_snapshots(query)
            .map_err(|e| match e {
                StoreError::BadCursor => {
                    SandboxError::BadRequest("cursor: not a cursor from this daemon".into())
                }
                e => e.into(),
            })?;
        Ok(SnapshotList {
            snapshots: page.snapshots.into_iter().map(|r| r.snapshot).collect(),
            next_cursor: page.next_cursor,
        })
    }

    /// Deletes a snapshot (a no-op on one already deleted); its layers stay while a sandbox
    /// or another snapshot still builds on them. Deleting a failed one frees its row's hold
    /// on the sandbox: a persistent sandbox whose newest snapshot failed starts again from
    /// its last good one once that failed snapshot is deleted.
    pub async fn delete_snapshot(&self, id: &str) -> Result<Snapshot, SandboxError> {
        if !is_id("snap", id) {
            return Err(SandboxError::SnapshotNotFound(id.to_owned()));
        }
        let _layers = self.inner.snapshots.layers.lock().await;
        if let Some(freed) = self.inner.store.delete_snapshot(id)? {
            self.remove_layers(&freed);
            let deleted = self.get_snapshot(id)?;
            self.emit_snapshot(deleted.clone());
            return Ok(deleted);
        }
        self.get_snapshot(id)
    }

    /// Deletes every snapshot whose expiration is at or before `now`; returns their ids.
    pub async fn reap_snapshots(&self, now: i64) -> Result<Vec<String>, SandboxError> {
        let expired = self.inner.store.expired_snapshots(now)?;
        for id in &expired {
            tracing::info!(snapshot = %id, "snapshot expired");
            self.delete_snapshot(id).await?;
        }
        Ok(expired)
    }

    /// The reaper: applies expirations now and then every [`REAP_INTERVAL`]. Expiry times
    /// are in the store, so a restarted daemon catches up on what expired while it was away.
    pub fn spawn_snapshot_reaper(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = this.reap_snapshots(now_ms()).await {
                    tracing::warn!(error = %e, "cannot reap expired snapshots");
                }
                tokio::time::sleep(REAP_INTERVAL).await;
            }
        })
    }

    /// At start: thaws sandboxes a live snapshot left frozen, releases the layers of
    /// sandboxes deleted before their release was recorded, and deletes layer directories
    /// that are half made or held by no one.
    pub async fn recover_snapshots(&self) -> Result<(), SandboxError> {
        let frozen = self
            .inner
            .store
            .sandboxes_with_status(&[SandboxStatus::Running])?;
        for s in frozen {
            let marker = self.inner.paths.sandbox_dir(&s.id).join(FROZEN_MARKER);
            if marker.exists() {
                let dir = self.state_dir(&s.id);
                let thawed = self.blocking_backend(&s, move |b| b.thaw(&dir)).await;
                if let Err(e) = thawed {
                    tracing::warn!(sandbox = %s.id, error = %e, "cannot thaw after a cut snapshot");
                }
                let _ = std::fs::remove_file(&marker);
            }
        }
        for id in self.inner.store.orphan_sandbox_layers()? {
            self.inner.store.release_sandbox_layers(&id)?;
        }
        let live = self.inner.store.live_layers()?;
        let Ok(entries) = std::fs::read_dir(self.layers_dir()) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let partial = belljar_namespace::layer::is_partial(&name);
            if partial || !live.contains(name.to_string_lossy().as_ref()) {
                tracing::info!(layer = ?name, "deleting an unreferenced layer");
                let path = entry.path();
                tokio::task::spawn_blocking(move || belljar_namespace::layer::remove_tree(&path))
                    .await
                    .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
            }
        }
        Ok(())
    }

    /// Resolves `source: {type: "snapshot"}` of a new sandbox: holds the snapshot's layers
    /// for it (recorded before it launches, so a concurrent delete keeps them) and restarts
    /// the snapshot's expiration. Also records the sandbox's snapshot policy.
    pub(super) fn hold_layers(
        &self,
        sandbox: &Sandbox,
        snapshot_expiration_ms: Option<i64>,
        keep_last: Option<belljar_api::KeepLastSnapshots>,
        mounts: &[belljar_api::SnapshotMount],
    ) -> Result<Option<FromSnapshot>, SandboxError> {
        let snapshot_id = match &sandbox.source {
            Some(Source::Snapshot { snapshot_id }) => Some(snapshot_id.clone()),
            _ => None,
        };
        let held = SandboxLayers {
            sandbox_id: sandbox.id.clone(),
            snapshot_id: snapshot_id.clone(),
            layers: Vec::new(),
            snapshot_expiration_ms,
            keep_last,
        };
        let row = match self.inner.store.use_snapshot(&held, now_ms())? {
            None => {
                return Err(SandboxError::SnapshotNotFound(
                    snapshot_id.unwrap_or_default(),
                ));
            }
            Some(Err(status)) => {
                return Err(SandboxError::SnapshotNotUsable {
                    id: snapshot_id.unwrap_or_default(),
                    status: status.into(),
                });
            }
            Some(Ok(row)) => row,
        };
        let mut lowers: Vec<PathBuf> = row
            .layers
            .iter()
            .map(|d| self.layers_dir().join(d))
            .collect();
        lowers.push(
            self.inner
                .images
                .resolve_pinned(&sandbox.image, sandbox.image_id.as_deref())?
                .rootfs,
        );
        if let Err(e) = self.hold_mounts(sandbox, mounts, &lowers) {
            // Nothing of the sandbox runs yet: its hold on its own chain goes with it.
            let freed = self.inner.store.release_sandbox_layers(&sandbox.id)?;
            self.remove_layers(&freed);
            return Err(e);
        }
        Ok(snapshot_id.map(|_| FromSnapshot {
            layers: row
                .layers
                .iter()
                .map(|d| self.layers_dir().join(d))
                .collect(),
        }))
    }

    /// Checks a `source: {type: "snapshot"}` before anything is made for the sandbox; returns
    /// the snapshot's image.
    pub(super) fn snapshot_image(
        &self,
        source: Option<&Source>,
    ) -> Result<Option<(String, Option<String>)>, SandboxError> {
        let Some(Source::Snapshot { snapshot_id }) = source else {
            return Ok(None);
        };
        let row = self
            .inner
            .store
            .snapshot(snapshot_id)?
            .ok_or_else(|| SandboxError::SnapshotNotFound(snapshot_id.clone()))?;
        if row.snapshot.status != SnapshotStatus::Created {
            return Err(SandboxError::SnapshotNotUsable {
                id: snapshot_id.clone(),
                status: row.snapshot.status.into(),
            });
        }
        if row.snapshot.path.is_some() {
            return Err(SandboxError::BadRequest(format!(
                "source: snapshot {snapshot_id} is of a directory; mount it with `mounts`"
            )));
        }
        Ok(Some((row.snapshot.image, row.snapshot.image_id)))
    }

    /// Drops a deleted sandbox's hold on its layers, deleting those no one else holds.
    pub(super) async fn release_layers(&self, sandbox_id: &str) -> Result<(), SandboxError> {
        let _layers = self.inner.snapshots.layers.lock().await;
        let freed = self.inner.store.release_sandbox_layers(sandbox_id)?;
        self.remove_layers(&freed);
        Ok(())
    }

    /// Deletes the directories of layers the store no longer holds.
    pub(super) fn remove_unheld(&self, digests: &[String]) -> Result<(), SandboxError> {
        let live = self.inner.store.live_layers()?;
        let unheld: Vec<String> = digests
            .iter()
            .filter(|d| !live.contains(*d))
            .cloned()
            .collect();
        self.remove_layers(&unheld);
        Ok(())
    }

    pub(super) fn remove_layers(&self, digests: &[String]) {
        for digest in digests {
            // Digests come from the store, which only holds hex names written by a capture.
            if digest.bytes().all(|b| b.is_ascii_hexdigit()) && !digest.is_empty() {
                belljar_namespace::layer::remove_tree(&self.layers_dir().join(digest));
            }
        }
    }
}

#[cfg(test)]
mod tests;
