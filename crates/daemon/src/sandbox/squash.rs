//! Squashing deep snapshot chains in the background.
//!
//! Each sandbox made from a snapshot (a persistent sandbox's every session, a fork of a fork)
//! stacks one more layer, and overlayfs pays for each lower directory on every lookup and
//! stacks at most 500 of them. When a created snapshot's chain is deeper than the limit
//! ([`Settings::squash_depth`](super::Settings), default [`DEFAULT_SQUASH_DEPTH`]), one
//! background worker merges that whole chain into a single layer and moves every snapshot
//! built on the chain onto it. Snapshot ids, their files and everything the API shows but
//! `depth` stay as they were; sandboxes already running keep the layers they mounted (they
//! hold them until they are deleted). The price is disk: the merged layer is a copy, and the
//! old layers stay while older snapshots or sandboxes still hold them.
//!
//! Crash safety: the squash reads a chain it holds (a `squash-<id>` hold in the store, which
//! the next start releases if the daemon dies), writes under a partial-layer name, renames the
//! result into place and then moves the snapshots in one transaction. A `kill -9` anywhere
//! leaves either the old chains or the new ones, and at most a directory the next start
//! deletes; the worker looks for deep chains again when it starts.

use belljar_api::SnapshotStatus;

use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// The chain depth past which a snapshot is squashed: a lookup through 16 lower directories
/// still costs little, and squashing at most once per 16 sessions keeps the copies rare.
pub const DEFAULT_SQUASH_DEPTH: usize = 16;

/// The squash worker's wake-up: one permit is kept when it is busy, so no request is lost.
#[derive(Default)]
pub(super) struct SquashState {
    wake: tokio::sync::Notify,
}

impl Sandboxes {
    /// Asks the worker to look for chains deeper than the limit.
    pub(super) fn squash_soon(&self) {
        self.inner.snapshots.squash.wake.notify_one();
    }

    /// The worker: squashes every deep chain now (those a stopped daemon left too) and again
    /// each time a snapshot is recorded past the limit, one chain at a time.
    pub fn spawn_squasher(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let depth = this.inner.settings.squash_depth;
                match this.inner.store.deep_snapshots(depth) {
                    Ok(deep) => {
                        for id in deep {
                            if let Err(e) = this.squash_snapshot(&id).await {
                                tracing::warn!(snapshot = %id, error = %e, "cannot squash");
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot look for deep snapshots"),
                }
                this.inner.snapshots.squash.wake.notified().await;
            }
        })
    }

    /// Merges a created snapshot's chain into one layer when it is deeper than the limit;
    /// answers whether it did.
    pub async fn squash_snapshot(&self, id: &str) -> Result<bool, SandboxError> {
        let depth = self.inner.settings.squash_depth;
        match self.inner.store.snapshot(id)? {
            Some(row)
                if row.snapshot.status == SnapshotStatus::Created && row.layers.len() > depth => {}
            _ => return Ok(false),
        }
        let holder = format!("squash-{id}");
        let Some(chain) = self.inner.store.hold_snapshot_chain(&holder, id)? else {
            return Ok(false);
        };
        let result = self.squash_held(&chain).await;
        self.release_layers(&holder).await?;
        let moved = result?;
        tracing::info!(snapshot = %id, from = chain.len(), moved = moved.len(), "squashed");
        for moved in moved {
            if let Ok(s) = self.get_snapshot(&moved) {
                self.emit_snapshot(s);
            }
        }
        Ok(true)
    }

    /// Merges `chain` (held) and moves the snapshots built on it; returns their ids.
    async fn squash_held(&self, chain: &[String]) -> Result<Vec<String>, SandboxError> {
        let layers_dir = self.layers_dir();
        let work = layers_dir.join(format!(".tmp-squash-{}-{}", std::process::id(), now_ms()));
        let paths: Vec<_> = chain.iter().map(|d| layers_dir.join(d)).collect();
        let work2 = work.clone();
        let merged =
            tokio::task::spawn_blocking(move || belljar_namespace::layer::squash(&paths, &work2))
                .await
                .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
        let merged = match merged {
            Ok(m) => m,
            Err(e) => {
                belljar_namespace::layer::remove_tree(&work);
                return Err(SandboxError::Io(std::io::Error::other(e)));
            }
        };
        let _layers = self.inner.snapshots.layers.lock().await;
        let target = layers_dir.join(&merged.digest);
        if !target.exists() {
            std::fs::rename(&merged.path, &target)?;
        }
        belljar_namespace::layer::remove_tree(&work);
        let (moved, freed) =
            self.inner
                .store
                .squash_chain(chain, &merged.digest, merged.size_bytes)?;
        self.remove_layers(&freed);
        // Nothing moved (the snapshots went meanwhile): the merged layer is held by no one.
        self.remove_unheld(std::slice::from_ref(&merged.digest))?;
        Ok(moved)
    }
}
