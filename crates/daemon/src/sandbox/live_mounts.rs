//! Mounting a directory snapshot into a sandbox that runs, and unmounting it (Modal's
//! `mount_image` / `unmount_image`): `POST` and `DELETE /v1/sandboxes/{id}/mounts`.
//!
//! The mount is held like one given at create (the store's `sandbox_layers.mounts`, in the
//! next free slot), so its layers live while it is mounted, a persistent sandbox mounts it
//! again at its next start and a fork carries it. The hold is taken before the backend
//! mounts and dropped again when that fails, so a failed mount holds nothing.
//!
//! A fork carries its source's mounts as the source sees them: each mount's writes are
//! captured (frozen, right after the fork's own live snapshot) as a layer on top of the
//! mounted snapshot's, recorded as a directory snapshot on the source's timeline, and the
//! fork mounts those at the same paths.

use belljar_api::SnapshotStatus;
use belljar_api::{Backend, Sandbox, SandboxMounts, SandboxStatus, Snapshot, SnapshotMount};

use crate::store::SnapshotRow;
use crate::util::{new_id, now_ms};

use super::backend::BackendError;
use super::snapshots::mounts::{mount_path, refused_error};
use super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// The snapshots mounted in a sandbox, in the order they were mounted.
    pub fn mounts(&self, id: &str) -> Result<SandboxMounts, SandboxError> {
        self.get(id)?;
        let mounts = self
            .inner
            .store
            .sandbox_mounts(id)?
            .into_iter()
            .map(Into::into)
            .collect();
        Ok(SandboxMounts { mounts })
    }

    /// Mounts a directory snapshot at `req.path` of a running sandbox (a paused one with
    /// `auto_resume` is resumed first).
    pub async fn mount_snapshot(
        &self,
        id: &str,
        req: SnapshotMount,
    ) -> Result<SnapshotMount, SandboxError> {
        mount_path("path", &req.path)?;
        self.awake(id).await?;
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let sandbox = self.get(id)?;
        if sandbox.status != SandboxStatus::Running {
            return Err(SandboxError::NotRunning {
                id: sandbox.id,
                status: sandbox.status.as_str(),
            });
        }
        if sandbox.backend != Backend::Namespace {
            return Err(BackendError::Unsupported {
                backend: sandbox.backend.into(),
                what: "mount snapshots into a running sandbox",
            }
            .into());
        }
        let held = self
            .inner
            .store
            .add_mount(id, &req.snapshot_id, &req.path)?
            .map_err(refused_error)?;
        let slot = held.slot.unwrap_or_default();
        let spec = self.mount_spec(held, slot);
        let dir = self.state_dir(id);
        let mounted = self
            .blocking_backend(&sandbox, move |b| b.mount_live(&dir, &spec))
            .await;
        if let Err(e) = mounted {
            if let Some((_, freed)) = self.inner.store.remove_mount(id, &req.path)? {
                self.remove_layers(&freed);
            }
            return Err(mount_error(e, &req.path));
        }
        self.touch(id);
        self.announce(id)?;
        tracing::info!(sandbox = %id, snapshot = %req.snapshot_id, path = %req.path, "mounted");
        Ok(req)
    }

    /// Unmounts the snapshot mounted at `path` (given at create or mounted since): what the
    /// path held before shows again, and the sandbox's writes under the mount are gone.
    pub async fn unmount_snapshot(&self, id: &str, path: &str) -> Result<(), SandboxError> {
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let sandbox = self.get(id)?;
        let held = self.inner.store.sandbox_mounts(id)?;
        let slots = crate::store::mount_slots(&held);
        let Some(slot) = held
            .iter()
            .zip(slots)
            .find_map(|(m, slot)| (m.path == path).then_some(slot))
        else {
            return Err(SandboxError::PathNotFound(format!(
                "path: no snapshot is mounted at {path}"
            )));
        };
        let dir = self.state_dir(id);
        let owned = path.to_owned();
        self.blocking_backend(&sandbox, move |b| b.unmount_live(&dir, slot, &owned))
            .await
            .map_err(|e| mount_error(e, path))?;
        if let Some((_, freed)) = self.inner.store.remove_mount(id, path)? {
            self.remove_layers(&freed);
        }
        self.announce(id)?;
        tracing::info!(sandbox = %id, path = %path, "unmounted");
        Ok(())
    }
}

impl Sandboxes {
    /// For a fork of `source`: its mounts as it sees them now (each mounted snapshot with the
    /// source's writes under it on top), as directory snapshots of the source at the same
    /// paths. Empty when it mounts nothing.
    pub(super) async fn fork_mounts(
        &self,
        source: &Sandbox,
    ) -> Result<Vec<SnapshotMount>, SandboxError> {
        let id = &source.id;
        let lock = self.lock_for(id);
        let _guard = lock.lock().await;
        let held = self.inner.store.sandbox_mounts(id)?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let s = self.get(id)?;
        // A paused one (without `auto_resume`) is captured as it stands.
        if !matches!(s.status, SandboxStatus::Running | SandboxStatus::Paused) {
            return Err(SandboxError::NotRunning {
                id: s.id,
                status: s.status.as_str(),
            });
        }
        let slots = crate::store::mount_slots(&held);
        let layers_dir = self.layers_dir();
        let layer_lock = self.inner.snapshots.layers.lock().await;
        let (captured, frozen_ms) = self
            .while_frozen(&s, move |b, dir| b.capture_mounts(dir, &slots, &layers_dir))
            .await?;
        let made = self.record_mount_captures(&s, held, captured?, Some(frozen_ms))?;
        drop(layer_lock);
        self.emit_snapshots(&made)?;
        Ok(made)
    }

    /// Records each captured mount layer (in `held`'s order) as a directory snapshot of the
    /// sandbox: the layer on top of what the mount held, parented by the snapshot it mounted,
    /// at the mount's path. Returns them as mounts at the same paths. The caller holds the
    /// layers lock and emits the snapshots' events once it is released.
    pub(super) fn record_mount_captures(
        &self,
        s: &Sandbox,
        held: Vec<crate::store::HeldMount>,
        captured: Vec<super::backend::CapturedLayer>,
        frozen_ms: Option<u64>,
    ) -> Result<Vec<SnapshotMount>, SandboxError> {
        let expiration_ms = self
            .inner
            .store
            .sandbox_layers(&s.id)?
            .and_then(|h| h.snapshot_expiration_ms)
            .unwrap_or(belljar_api::DEFAULT_EXPIRATION_MS);
        let mut out = Vec::new();
        for (m, layer) in held.into_iter().zip(captured) {
            let now = now_ms();
            let mut layers = vec![layer.digest];
            layers.extend(m.layers);
            let row = SnapshotRow {
                snapshot: Snapshot {
                    id: new_id("snap"),
                    status: SnapshotStatus::Created,
                    status_reason: None,
                    source_sandbox_id: s.id.clone(),
                    parent: Some(m.snapshot_id),
                    image: s.image.clone(),
                    image_id: s.image_id.clone(),
                    size_bytes: layer.size_bytes,
                    depth: SnapshotRow::depth_of(&layers),
                    created_at: now,
                    expires_at: (expiration_ms > 0).then(|| now.saturating_add(expiration_ms)),
                    frozen_ms,
                    path: Some(m.path.clone()),
                },
                layers,
                expiration_ms,
            };
            self.inner.store.insert_snapshot(&row, layer.size_bytes)?;
            out.push(SnapshotMount {
                snapshot_id: row.snapshot.id,
                path: m.path,
            });
        }
        Ok(out)
    }

    /// Emits the snapshot events of mounts' new snapshots.
    pub(super) fn emit_snapshots(&self, made: &[SnapshotMount]) -> Result<(), SandboxError> {
        for m in made {
            self.emit_snapshot(self.get_snapshot(&m.snapshot_id)?);
        }
        Ok(())
    }
}

/// A backend's mount failure as the user's error where it is one.
fn mount_error(e: SandboxError, path: &str) -> SandboxError {
    use belljar_namespace::live_mounts::LiveError;
    use belljar_namespace::snapshot_mounts::PathError;
    let SandboxError::Backend(BackendError::Mount(live)) = e else {
        return e;
    };
    match live {
        LiveError::Path(PathError::Invalid(_)) => SandboxError::InvalidPath(format!(
            "path: {path:?} must be an absolute path below `/`, without `.` or `..`"
        )),
        LiveError::Path(PathError::NotADirectory(..)) | LiveError::NotADirectory(_) => {
            SandboxError::NotADirectory(format!(
                "path: {path} crosses a file or a symbolic link in the sandbox"
            ))
        }
        LiveError::Unusable(_, why) => {
            SandboxError::InvalidPath(format!("path: cannot mount at {path}: {why}"))
        }
        LiveError::NotMounted(_) => {
            SandboxError::PathNotFound(format!("path: nothing is mounted at {path}"))
        }
        LiveError::NotRunning => SandboxError::Conflict(format!(
            "The sandbox stopped while {path} was being mounted"
        )),
        other => BackendError::Mount(other).into(),
    }
}
