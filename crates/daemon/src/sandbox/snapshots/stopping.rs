//! The stopping snapshot (Vercel's semantics, the default of `POST
//! /v1/sandboxes/{id}/snapshots`): the sandbox stops and its writable layer becomes the
//! snapshot.
//!
//! Crash safety: once the sandbox has stopped, that layer is its only copy of its files, and
//! a sandbox that is not persistent can never start again to take another snapshot. So before
//! it stops, an intent is written to its directory ([`STOPPING_MARKER`]: the snapshot's id,
//! chosen in advance, and its expiration), and removed once the snapshot is recorded. A daemon
//! killed in between finds the intent at its next start ([`Sandboxes::finish_stopping_snapshots`],
//! after adoption has stopped a sandbox left `stopping`): a sandbox that never began to stop
//! is left running, without the snapshot; one that stopped has its layer (still on disk)
//! captured and recorded under the intended id; one whose snapshot was already recorded is
//! left as it is. Either the snapshot exists complete or not at all, and no files are lost.

use serde::{Deserialize, Serialize};

use belljar_api::{Sandbox, SandboxStatus, Snapshot};

use crate::sandbox::snapshots::Taken;
use crate::sandbox::{SandboxError, Sandboxes};
use crate::store::SandboxLayers;
use crate::util::new_id;

/// In a sandbox's directory from before a stopping snapshot stops it until it is recorded.
const STOPPING_MARKER: &str = "snapshot-stopping";

/// What [`STOPPING_MARKER`] holds: enough to record the snapshot after a crash.
#[derive(Serialize, Deserialize)]
struct Intent {
    snapshot_id: String,
    expiration_ms: Option<i64>,
}

impl Sandboxes {
    /// Stops `sandbox` (its lock held by the caller, like `layer_lock`) and records its
    /// writable layer as a new snapshot.
    pub(in crate::sandbox) async fn stop_and_snapshot(
        &self,
        sandbox: &Sandbox,
        held: &SandboxLayers,
        expiration_ms: Option<i64>,
        layer_lock: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Snapshot, SandboxError> {
        let id = &sandbox.id;
        let intent = Intent {
            snapshot_id: new_id("snap"),
            expiration_ms,
        };
        let marker = self.inner.paths.sandbox_dir(id).join(STOPPING_MARKER);
        // Whole or absent: written aside, then renamed into place.
        let aside = marker.with_extension("new");
        let json = serde_json::to_vec(&intent).map_err(std::io::Error::other)?;
        std::fs::write(&aside, json)?;
        std::fs::rename(&aside, &marker)?;
        if let Err(e) = self
            .stop_locked(id, SandboxStatus::Stopped, "snapshotted", false)
            .await
        {
            // Not stopped by this request: nothing to finish after a crash.
            let _ = std::fs::remove_file(&marker);
            return Err(e);
        }
        let (dir, layers_dir) = (self.state_dir(id), self.layers_dir());
        let captured = self
            .blocking_backend(sandbox, move |b| b.capture(&dir, &layers_dir))
            .await;
        let taken = Taken {
            id: intent.snapshot_id,
            captured,
            frozen_ms: None,
            expiration_ms,
        };
        let recorded = self.record_snapshot(sandbox, held, taken, layer_lock).await;
        let _ = std::fs::remove_file(&marker);
        recorded
    }

    /// Whether a stopping snapshot of sandbox `id` was under way when the daemon died (so
    /// adoption stops it without a persistent sandbox's own snapshot: this one is taken).
    pub(in crate::sandbox) fn stopping_snapshot_pending(&self, id: &str) -> bool {
        self.inner
            .paths
            .sandbox_dir(id)
            .join(STOPPING_MARKER)
            .exists()
    }

    /// At start, after adoption: finishes the stopping snapshots a killed daemon left (see the
    /// module's comment).
    pub async fn finish_stopping_snapshots(&self) -> Result<(), SandboxError> {
        let all = self.inner.store.sandboxes_with_status(&[
            SandboxStatus::Running,
            SandboxStatus::Paused,
            SandboxStatus::Stopped,
            SandboxStatus::Failed,
        ])?;
        for s in all {
            let marker = self.inner.paths.sandbox_dir(&s.id).join(STOPPING_MARKER);
            let Ok(text) = std::fs::read(&marker) else {
                continue;
            };
            let lock = self.lock_for(&s.id);
            let _guard = lock.lock().await;
            match serde_json::from_slice::<Intent>(&text) {
                Ok(intent) => self.finish_stopping_snapshot(&s, intent).await?,
                Err(e) => {
                    tracing::warn!(sandbox = %s.id, error = %e, "unreadable snapshot intent")
                }
            }
            if let Err(e) = std::fs::remove_file(&marker) {
                // Harmless when it stays: the next start finds the snapshot recorded.
                tracing::warn!(sandbox = %s.id, error = %e, "cannot remove a snapshot intent");
            }
        }
        Ok(())
    }

    async fn finish_stopping_snapshot(
        &self,
        s: &Sandbox,
        intent: Intent,
    ) -> Result<(), SandboxError> {
        if self.inner.store.snapshot(&intent.snapshot_id)?.is_some() {
            return Ok(());
        }
        if !s.status.is_final() {
            tracing::info!(sandbox = %s.id, "a stopping snapshot was cut before the sandbox stopped");
            return Ok(());
        }
        tracing::info!(sandbox = %s.id, snapshot = %intent.snapshot_id, "finishing a stopping snapshot cut by a restart");
        let layer_lock = self.inner.snapshots.layers.lock().await;
        let held = self.inner.store.sandbox_layers(&s.id)?.unwrap_or_default();
        let (dir, layers_dir) = (self.state_dir(&s.id), self.layers_dir());
        let captured = self
            .blocking_backend(s, move |b| b.capture(&dir, &layers_dir))
            .await;
        let taken = Taken {
            id: intent.snapshot_id,
            captured,
            frozen_ms: None,
            expiration_ms: intent.expiration_ms,
        };
        // A failed capture is recorded as a `failed` snapshot, as it would have been.
        if let Err(e) = self.record_snapshot(s, &held, taken, layer_lock).await {
            tracing::warn!(sandbox = %s.id, error = %e, "cannot finish a stopping snapshot");
        }
        Ok(())
    }
}
