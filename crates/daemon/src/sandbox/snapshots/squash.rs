//! Squashing deep snapshot chains in the background.
//!
//! Each sandbox made from a snapshot (a persistent sandbox's every session, a fork of a fork)
//! stacks one more layer, and overlayfs pays for each lower directory on every lookup and
//! stacks at most 500 of them. When a created snapshot's chain is deeper than the limit
//! ([`Settings::squash_depth`](crate::sandbox::Settings), default [`DEFAULT_SQUASH_DEPTH`]), one
//! background worker merges that whole chain into a single layer and moves every snapshot
//! built on the chain onto it. Snapshot ids, their files and everything the API shows but
//! `depth` stay as they were; sandboxes already running keep the layers they mounted (they
//! hold them until they are deleted). The price is disk: the merged layer is a copy, and the
//! old layers stay while older snapshots or sandboxes still hold them.
//!
//! A chain is copied once: the store remembers what each squash merged, so a snapshot that
//! stacks an already squashed chain under its own layers (one of a sandbox made from the
//! chain before its squash) takes the merged layer, when it is recorded or at its squash.
//!
//! Crash safety: the squash reads a chain it holds (a `squash-<id>` hold in the store, which
//! the next start releases if the daemon dies), writes under a partial-layer name, renames the
//! result into place and then moves the snapshots in one transaction. A `kill -9` anywhere
//! leaves either the old chains or the new ones, and at most a directory the next start
//! deletes; the worker looks for deep chains again when it starts.

use belljar_api::SnapshotStatus;

use crate::sandbox::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// The chain depth past which a snapshot is squashed: a lookup through 16 lower directories
/// still costs little, and squashing at most once per 16 sessions keeps the copies rare.
pub const DEFAULT_SQUASH_DEPTH: usize = 16;

/// The squash worker's wake-up: one permit is kept when it is busy, so no request is lost.
#[derive(Default)]
pub(in crate::sandbox) struct SquashState {
    wake: tokio::sync::Notify,
}

impl Sandboxes {
    /// Asks the worker to look for chains deeper than the limit.
    pub(in crate::sandbox) fn squash_soon(&self) {
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
        if self.reuse_squash(id).await? {
            match self.inner.store.snapshot(id)? {
                Some(row) if row.layers.len() > depth => {}
                _ => return Ok(true),
            }
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

    /// Moves a snapshot (and the others built on the same chain) onto the layer an earlier
    /// squash made of the lower part of its chain, copying nothing; answers whether it did.
    async fn reuse_squash(&self, id: &str) -> Result<bool, SandboxError> {
        let _layers = self.inner.snapshots.layers.lock().await;
        let Some(row) = self.inner.store.snapshot(id)? else {
            return Ok(false);
        };
        let Some((i, merged)) = self.inner.store.squashed_suffix(&row.layers)? else {
            return Ok(false);
        };
        let (moved, freed) = self
            .inner
            .store
            .squash_chain(&row.layers[i..], &merged, 0)?;
        self.remove_layers(&freed);
        tracing::info!(snapshot = %id, merged = %merged, moved = moved.len(), "reused a squash");
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::events::Events;
    use crate::images::Images;
    use crate::paths::Paths;
    use crate::sandbox::Settings;
    use crate::sandbox::backend::Backends;
    use crate::store::{SnapshotRow, Store};

    fn manager(home: &std::path::Path, squash_depth: usize) -> Sandboxes {
        let paths = Paths::resolve(Some(home), Some(&home.join("cache"))).unwrap();
        paths.create().unwrap();
        let store = Store::open(&paths.database()).unwrap();
        let events = Arc::new(Events::new(store.clone()));
        let images = Images::new(paths.clone(), home.join("guest-images"), store.clone());
        let settings = Settings {
            squash_depth,
            ..Settings::default()
        };
        Sandboxes::new(
            store,
            events,
            paths,
            Backends::new(Vec::new()),
            images,
            settings,
        )
    }

    fn layer_names(m: &Sandboxes) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(m.layers_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A snapshot of a sandbox made from a chain before its squash (its chain: its own layer
    /// over the old one) is moved onto the layer that squash made: no second merged copy.
    /// Before, it was merged again, which copies every file of the chain once more.
    #[tokio::test]
    async fn a_chain_squashed_once_is_not_copied_again() {
        let home = tempfile::tempdir().unwrap();
        let m = manager(home.path(), 2);
        let layers = m.layers_dir();
        for (i, dir) in ["a1", "b2", "c3", "e4"].iter().enumerate() {
            std::fs::create_dir_all(layers.join(dir)).unwrap();
            std::fs::write(layers.join(dir).join(format!("f{i}")), b"x").unwrap();
        }
        let store = m.store();
        store
            .insert_snapshot(&SnapshotRow::fixture("snap_c", &["c3", "b2", "a1"], 1), 1)
            .unwrap();
        // The sandbox made from snap_c before its squash holds the old chain.
        assert!(
            store
                .hold_snapshot_chain("sbx_early", "snap_c")
                .unwrap()
                .is_some()
        );
        assert!(m.squash_snapshot("snap_c").await.unwrap());
        let merged = store.snapshot("snap_c").unwrap().unwrap().layers;
        assert_eq!(merged.len(), 1);
        let after_first = layer_names(&m);
        assert_eq!(after_first.len(), 5, "{after_first:?}");

        // Its snapshot, recorded as it was before the reuse at record time.
        store
            .insert_snapshot(
                &SnapshotRow::fixture("snap_e", &["e4", "c3", "b2", "a1"], 2),
                1,
            )
            .unwrap();
        assert!(m.squash_snapshot("snap_e").await.unwrap());
        assert_eq!(
            store.snapshot("snap_e").unwrap().unwrap().layers,
            ["e4".to_string(), merged[0].clone()]
        );
        assert_eq!(layer_names(&m), after_first, "nothing was copied");
    }
}
