//! Persistent sandboxes (Vercel's persistent sandboxes): stopping one, by request or by its
//! timeout, first snapshots its writable layer, and `start` brings the same sandbox (same id,
//! name, tags, environment, limits and snapshot policy) back on its latest snapshot. Each
//! session adds one snapshot to its timeline; `keep_last_snapshots` bounds how many it keeps.
//!
//! Crash safety: the snapshot is taken while the sandbox is `stopping`, and the daemon settles
//! a sandbox it finds `stopping` at start by stopping it again, which snapshots it then; a
//! start moves the sandbox onto its new chain of layers in one store transaction before its
//! old state directory is of any use again. A stop whose snapshot failed leaves the sandbox's
//! last session only in that state directory, so `start` takes the snapshot again first, and
//! refuses to start from an older one while that keeps failing. Deleting the newest failed
//! snapshot (`DELETE /v1/snapshots/{id}`) is the explicit way to discard that session: the
//! next start resumes from the last created snapshot.

use belljar_api::{Sandbox, SandboxStatus, SnapshotMount};

use super::snapshots::Taken;
use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

impl Sandboxes {
    /// Snapshots a persistent sandbox whose processes have just ended (its lock held). A
    /// failed capture is recorded as a `failed` snapshot and logged; the stop goes on.
    pub(super) async fn persist_stopped(&self, s: &Sandbox) {
        let held = match self.inner.store.sandbox_layers(&s.id) {
            Ok(held) => held.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(sandbox = %s.id, error = %e, "cannot snapshot a persistent sandbox");
                return;
            }
        };
        let dir = self.state_dir(&s.id);
        let layers_dir = self.layers_dir();
        let layer_lock = self.inner.snapshots.layers.lock().await;
        // The mounts first: should the daemon die before the sandbox's own snapshot, the next
        // stop captures them again from the same writable layers, which changes nothing.
        let mounts = self.persist_mounts(s).await;
        let captured = self
            .blocking_backend(s, move |b| b.capture(&dir, &layers_dir))
            .await;
        match self
            .record_snapshot(s, &held, Taken::stopped(captured, None), layer_lock)
            .await
        {
            Ok(snap) => tracing::info!(sandbox = %s.id, snapshot = %snap.id, "persisted"),
            Err(e) => tracing::warn!(sandbox = %s.id, error = %e, "persistent snapshot failed"),
        }
        if let Err(e) = self.emit_snapshots(&mounts) {
            tracing::warn!(sandbox = %s.id, error = %e, "cannot announce a mount's snapshot");
        }
    }

    /// Keeps what a stopped persistent sandbox wrote under its snapshot mounts: each mount's
    /// writable layer becomes a directory snapshot of the sandbox on top of what it mounted,
    /// and the mount moves onto it, so the next start mounts it with those writes. Where the
    /// capture fails (a microVM's disk is read through a loop mount, which needs root), the
    /// mounts stay as they were and a warning says their writes are lost. Called with the layers lock held; returns the snapshots
    /// made, for their events.
    async fn persist_mounts(&self, s: &Sandbox) -> Vec<SnapshotMount> {
        let kept = async {
            let held = self.inner.store.sandbox_mounts(&s.id)?;
            if held.is_empty() {
                return Ok(Vec::new());
            }
            let slots = crate::store::mount_slots(&held);
            let (dir, layers_dir, each) = (self.state_dir(&s.id), self.layers_dir(), slots.clone());
            let captured = self
                .blocking_backend(s, move |b| b.capture_mounts(&dir, &each, &layers_dir))
                .await?;
            let made = self.record_mount_captures(s, held, captured, None)?;
            let moves: Vec<(usize, String)> = slots
                .into_iter()
                .zip(made.iter().map(|m| m.snapshot_id.clone()))
                .collect();
            let freed = self
                .inner
                .store
                .replace_mounts(&s.id, &moves)?
                .map_err(super::snapshots::mounts::refused_error)?;
            self.remove_layers(&freed);
            Ok::<_, SandboxError>(made)
        };
        kept.await.unwrap_or_else(|e| {
            tracing::warn!(sandbox = %s.id, error = %e, "the writes under the sandbox's snapshot mounts are not kept");
            Vec::new()
        })
    }

    /// Starts a stopped persistent sandbox again from its latest snapshot (a no-op on a
    /// running one; a paused one is resumed).
    pub async fn start(&self, id: &str) -> Result<Sandbox, SandboxError> {
        let lock = self.lock_for(id);
        let guard = lock.lock().await;
        let mut s = self.get(id)?;
        match s.status {
            SandboxStatus::Running => return Ok(s),
            SandboxStatus::Paused => {
                drop(guard);
                return self.resume(id).await;
            }
            SandboxStatus::Pending | SandboxStatus::Stopping => {
                return Err(SandboxError::Conflict(format!(
                    "Sandbox {id} is {}; start it once it has settled",
                    s.status
                )));
            }
            SandboxStatus::Stopped | SandboxStatus::Failed => {}
        }
        if !s.lifecycle.persistent {
            return Err(SandboxError::Conflict(format!(
                "Sandbox {id} is not persistent: only a sandbox created with `persistent: true` \
                 starts again (make a new one from one of its snapshots instead)"
            )));
        }
        let image = self
            .inner
            .images
            .resolve_pinned(&s.image, s.image_id.as_deref())?;
        let agent = self.agent_binary(&image)?;
        {
            let _admission = self.inner.admission.lock().await;
            self.admit(s.memory_mib, 0)?;
            s.status = SandboxStatus::Pending;
            s.status_reason = Some("starting from its latest snapshot".into());
            s.stopped_at = None;
            self.save(&s)?;
        }
        if self.last_capture_failed(id)?.is_some() {
            self.persist_stopped(&s).await;
            if let Some(failed) = self.last_capture_failed(id)? {
                let e = SandboxError::Conflict(format!(
                    "Sandbox {id}'s last session could not be snapshotted (snapshot {failed} \
                     failed); it does not start from an older one unless you delete {failed}, \
                     which discards that session"
                ));
                return self.fail_start(s, e).await;
            }
        }
        let layers = match self.restack(&s).await {
            Ok(layers) => layers,
            Err(e) => return self.fail_start(s, e).await,
        };
        let old = self.state_dir(id);
        let destroyed = self.blocking_backend(&s, move |b| b.destroy(&old)).await;
        if let Err(e) = destroyed {
            return self.fail_start(s, e).await;
        }
        if let Err(e) = self.boot(&mut s, image.dir.clone(), agent, layers).await {
            return self.fail_start(s, e).await;
        }
        let now = now_ms();
        // A new session: its idle clock starts now, not at the last session's last use.
        self.touch(id);
        s.status = SandboxStatus::Running;
        s.status_reason = None;
        s.started_at = Some(now);
        s.expires_at = Some(now.saturating_add(s.timeout_ms));
        self.save(&s)?;
        Ok(s)
    }

    /// The sandbox's newest snapshot if it failed: its stop did not capture its last
    /// session, which is then only in its state directory. Once the user deletes that
    /// snapshot, the newest one is `deleted` and the start goes on from the last created one.
    fn last_capture_failed(&self, id: &str) -> Result<Option<String>, SandboxError> {
        let newest = self
            .inner
            .store
            .list_snapshots(&belljar_api::ListSnapshotsQuery {
                sandbox_id: Some(id.to_owned()),
                limit: Some(1),
                ..Default::default()
            })?;
        Ok(newest
            .snapshots
            .into_iter()
            .next()
            .filter(|r| r.snapshot.status == belljar_api::SnapshotStatus::Failed)
            .map(|r| r.snapshot.id))
    }

    /// Moves the sandbox onto its newest `created` snapshot's chain; returns the layer
    /// directories to stack, topmost first. Without any snapshot it keeps what it held.
    async fn restack(&self, s: &Sandbox) -> Result<Vec<std::path::PathBuf>, SandboxError> {
        let _layers = self.inner.snapshots.layers.lock().await;
        let latest = self
            .inner
            .store
            .created_snapshots_of(&s.id)?
            .into_iter()
            .next();
        let chain = match latest {
            Some(row) => {
                let (chain, freed) = self
                    .inner
                    .store
                    .restack_sandbox(&s.id, &row.snapshot.id, now_ms())?
                    .ok_or_else(|| SandboxError::SnapshotNotUsable {
                        id: row.snapshot.id.clone(),
                        status: "deleted",
                    })?;
                self.remove_layers(&freed);
                chain
            }
            None => self
                .inner
                .store
                .sandbox_layers(&s.id)?
                .map(|h| h.layers)
                .unwrap_or_default(),
        };
        Ok(chain.iter().map(|d| self.layers_dir().join(d)).collect())
    }

    async fn fail_start(&self, mut s: Sandbox, e: SandboxError) -> Result<Sandbox, SandboxError> {
        tracing::warn!(sandbox = %s.id, error = %e, "sandbox failed to start again");
        self.stop_failed_start(&s).await;
        self.forget_agent(&s.id);
        s.status = SandboxStatus::Failed;
        s.status_reason = Some(match &e {
            SandboxError::Backend(b) => crate::util::error_chain(b),
            e => e.to_string(),
        });
        s.stopped_at = Some(now_ms());
        self.save(&s)?;
        Err(e)
    }
}
