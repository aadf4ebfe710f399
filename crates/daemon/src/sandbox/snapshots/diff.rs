//! `GET /v1/snapshots/{id}/diff`: what changed between two points of the timeline (a snapshot
//! and a later snapshot, a snapshot and a sandbox's current files, or a snapshot and the point
//! it was taken on), read from the layers themselves (see `belljar_namespace::layer::diff`).

use std::path::PathBuf;

use belljar_api::{
    ChangeKind, DiffEntry, EntryKind, FileChange, MAX_DIFF_CHANGES, MAX_TEXT_DIFF_BYTES,
    SandboxStatus, SnapshotDiff, SnapshotStatus,
};
use belljar_namespace::layer::diff::{self, Change, Entry, Kind, Layer};

use crate::sandbox::backend::BackendError;
use crate::sandbox::{SandboxError, Sandboxes};
use crate::store::SnapshotRow;

impl Sandboxes {
    /// The changes from snapshot `id` to `to` (a snapshot or a sandbox), or, without `to`,
    /// from the point `id` was taken on (its parent, or its image) to `id`.
    pub async fn diff_snapshot(
        &self,
        id: &str,
        to: Option<&str>,
    ) -> Result<SnapshotDiff, SandboxError> {
        let a = self.usable_snapshot(id)?;
        let image = self
            .inner
            .images
            .resolve_pinned(&a.snapshot.image, a.snapshot.image_id.as_deref())?
            .rootfs;
        let layers_dir = self.layers_dir();
        let stored = |chain: &[String]| -> Vec<Layer> {
            chain
                .iter()
                .map(|d| Layer::stored(layers_dir.join(d)))
                .chain([Layer::stored(image.clone())])
                .collect()
        };
        // A microVM's writable layer is on a disk only the guest mounts: its current state is
        // captured first (a scratch copy, deleted after the comparison).
        let scratch = match to {
            Some(sbx) if sbx.starts_with("sbx_") => self.current_layer_of_vm(sbx).await?,
            _ => None,
        };
        // Held while reading, so that no layer directory goes from under the comparison.
        let _layers = self.inner.snapshots.layers.lock().await;
        let (from, old, to, new) = match to {
            None => {
                let (label, below) = self.below(&a)?;
                (
                    label,
                    stored(&below),
                    a.snapshot.id.clone(),
                    stored(&a.layers),
                )
            }
            Some(sbx) if sbx.starts_with("sbx_") => {
                let s = self.get(sbx)?;
                same_image(&a.snapshot.image, &s.image)?;
                let held = self.inner.store.sandbox_layers(sbx)?.unwrap_or_default();
                let writable = match &scratch {
                    Some((_, layer)) => Layer::stored(layer.clone()),
                    None => Layer::writable(&self.state_dir(sbx)).map_err(BackendError::Capture)?,
                };
                let mut new = vec![writable];
                new.extend(stored(&held.layers));
                (a.snapshot.id.clone(), stored(&a.layers), s.id, new)
            }
            Some(b) => {
                let b = self.usable_snapshot(b)?;
                same_image(&a.snapshot.image, &b.snapshot.image)?;
                (
                    a.snapshot.id.clone(),
                    stored(&a.layers),
                    b.snapshot.id.clone(),
                    stored(&b.layers),
                )
            }
        };
        let found = tokio::task::spawn_blocking(move || {
            diff::diff(&old, &new, MAX_DIFF_CHANGES, MAX_TEXT_DIFF_BYTES)
        })
        .await
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
        Ok(SnapshotDiff {
            from,
            to,
            changes: found.changes.into_iter().map(change).collect(),
            truncated: found.truncated,
        })
    }

    /// Checks that sandbox `id` runs (or is paused) and, for a microVM, copies its writable
    /// layer as it is now into a scratch directory: frozen while the disk is copied when it
    /// runs, as it stands when paused (pausing flushed the guest). `None` for a namespace
    /// sandbox, whose writable layer the host reads in place.
    async fn current_layer_of_vm(
        &self,
        id: &str,
    ) -> Result<Option<(tempfile::TempDir, PathBuf)>, SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let s = self.get(id)?;
        if !matches!(s.status, SandboxStatus::Running | SandboxStatus::Paused) {
            return Err(SandboxError::NotRunning {
                id: s.id,
                status: s.status.as_str(),
            });
        }
        if s.backend == belljar_api::Backend::Namespace {
            return Ok(None);
        }
        let scratch = tempfile::Builder::new()
            .prefix("diff-")
            .tempdir_in(&self.inner.paths.dirs.data)?;
        let into = scratch.path().to_owned();
        let captured = if s.status == SandboxStatus::Paused {
            let dir = self.state_dir(id);
            self.blocking_backend(&s, move |b| b.capture(&dir, &into))
                .await?
        } else {
            self.while_frozen(&s, move |b, dir| b.capture(dir, &into))
                .await?
                .0?
        };
        let layer = scratch.path().join(&captured.digest);
        Ok(Some((scratch, layer)))
    }

    fn usable_snapshot(&self, id: &str) -> Result<SnapshotRow, SandboxError> {
        let row = self
            .inner
            .store
            .snapshot(id)?
            .ok_or_else(|| SandboxError::SnapshotNotFound(id.to_owned()))?;
        if row.snapshot.status != SnapshotStatus::Created {
            return Err(SandboxError::SnapshotNotUsable {
                id: id.to_owned(),
                status: row.snapshot.status.into(),
            });
        }
        Ok(row)
    }

    /// The point a snapshot was taken on: its parent's label and the chain below its own
    /// layer (a snapshot of an unchanged sandbox has no layer of its own).
    fn below(&self, a: &SnapshotRow) -> Result<(String, Vec<String>), SandboxError> {
        let parent = match &a.snapshot.parent {
            Some(p) => self.inner.store.snapshot(p)?,
            None => None,
        };
        let below_len = parent.as_ref().map_or(0, |p| p.layers.len());
        let own = a.layers.len().saturating_sub(below_len).min(1);
        let label = parent.map_or_else(|| format!("image:{}", a.snapshot.image), |p| p.snapshot.id);
        Ok((label, a.layers[own..].to_vec()))
    }
}

fn same_image(a: &str, b: &str) -> Result<(), SandboxError> {
    if a != b {
        return Err(SandboxError::BadRequest(format!(
            "to: its image is {b}, the snapshot's is {a}; only points on one image compare"
        )));
    }
    Ok(())
}

fn change(c: Change) -> FileChange {
    let kind = match (&c.old, &c.new) {
        (None, _) => ChangeKind::Added,
        (_, None) => ChangeKind::Deleted,
        _ => ChangeKind::Modified,
    };
    FileChange {
        path: format!("/{}", PathBuf::from(&c.path).display()),
        change: kind,
        old: c.old.map(entry),
        new: c.new.map(entry),
        unified_diff: c.unified,
    }
}

fn entry(e: Entry) -> DiffEntry {
    DiffEntry {
        kind: match e.kind {
            Kind::File => EntryKind::File,
            Kind::Dir => EntryKind::Dir,
            Kind::Symlink => EntryKind::Symlink,
            Kind::Other => EntryKind::Other,
        },
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        size_bytes: e.size,
        target: e.target.map(|t| t.display().to_string()),
    }
}
