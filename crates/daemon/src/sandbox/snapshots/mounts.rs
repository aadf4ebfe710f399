//! Modal's directory snapshots: `snapshot_directory` (one directory of a running sandbox
//! captured as a layer, `POST /v1/sandboxes/{id}/snapshots` with `path`) and `mount_image`
//! at create (`mounts: [{snapshot_id, path}]`), on the namespace backend.
//!
//! A directory snapshot is a snapshot whose single layer is the directory's whole tree (what
//! the sandbox saw there, not a change set) and whose `path` says so. It is not a root
//! filesystem, so no sandbox starts from it; it is mounted copy-on-write (the mounting
//! sandbox's writes go to its own layer) and held by each sandbox that mounts it, like a
//! sandbox's own chain, so deleting it keeps its files while they are mounted.

use std::path::{Component, Path, PathBuf};

use belljar_api::{Backend, Sandbox, Snapshot, SnapshotMount, SnapshotStatus};

use crate::sandbox::backend::{BackendError, MountSpec};
use crate::sandbox::{SandboxError, Sandboxes};
use crate::store::{HeldMount, MountRefused, SnapshotRow};
use crate::util::{new_id, now_ms};

/// Checks that `path` is absolute, below `/`, without `.` or `..`.
fn plain_path(field: &str, path: &str) -> Result<(), SandboxError> {
    let p = Path::new(path);
    let plain = p.is_absolute()
        && !path.contains('\0')
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && p.components().count() > 1;
    if plain {
        Ok(())
    } else {
        Err(SandboxError::InvalidPath(format!(
            "{field}: {path:?} must be an absolute path below `/`, without `.` or `..`"
        )))
    }
}

impl Sandboxes {
    /// Snapshots directory `path` of a running sandbox (its lock held): frozen while it is
    /// copied, running again after.
    pub(in crate::sandbox) async fn snapshot_directory(
        &self,
        sandbox: &Sandbox,
        path: String,
        expiration_ms: Option<i64>,
    ) -> Result<Snapshot, SandboxError> {
        plain_path("path", &path)?;
        let layers_dir = self.layers_dir();
        let layer_lock = self.inner.snapshots.layers.lock().await;
        let inner_path = path.clone();
        let (captured, frozen_ms) = self
            .while_frozen(sandbox, move |b, dir| {
                b.capture_dir(dir, &inner_path, &layers_dir)
            })
            .await?;
        let captured = captured.map_err(|e| dir_error(e, &path))?;
        let held = self
            .inner
            .store
            .sandbox_layers(&sandbox.id)?
            .unwrap_or_default();
        let expiration_ms = expiration_ms
            .or(held.snapshot_expiration_ms)
            .unwrap_or(belljar_api::DEFAULT_EXPIRATION_MS);
        let now = now_ms();
        let row = SnapshotRow {
            snapshot: Snapshot {
                id: new_id("snap"),
                status: SnapshotStatus::Created,
                status_reason: None,
                source_sandbox_id: sandbox.id.clone(),
                parent: None,
                image: sandbox.image.clone(),
                image_id: sandbox.image_id.clone(),
                size_bytes: captured.size_bytes,
                depth: 1,
                created_at: now,
                expires_at: (expiration_ms > 0).then(|| now.saturating_add(expiration_ms)),
                frozen_ms: Some(frozen_ms),
                path: Some(path),
            },
            layers: vec![captured.digest],
            expiration_ms,
        };
        self.inner
            .store
            .insert_snapshot(&row, captured.size_bytes)?;
        drop(layer_lock);
        let snapshot = self.get_snapshot(&row.snapshot.id)?;
        self.emit_snapshot(snapshot.clone());
        Ok(snapshot)
    }

    /// Holds the layers of a new sandbox's `mounts` (after its own chain, `lowers` being
    /// that chain's directories, topmost first, and the image's tree last), once each path
    /// is checked against them. On an error nothing of the mounts is held.
    pub(in crate::sandbox) fn hold_mounts(
        &self,
        sandbox: &Sandbox,
        mounts: &[SnapshotMount],
        lowers: &[PathBuf],
    ) -> Result<(), SandboxError> {
        if mounts.is_empty() {
            return Ok(());
        }
        let most = crate::sandbox::microvm::layers::MAX_MOUNTS;
        if sandbox.backend == Backend::Microvm && mounts.len() > most {
            // Each takes one of the microVM's few virtio devices.
            return Err(SandboxError::BadRequest(format!(
                "mounts: a microVM sandbox mounts at most {most} snapshots"
            )));
        }
        for (i, m) in mounts.iter().enumerate() {
            mount_path(&format!("mounts[{i}].path"), &m.path)?;
            use belljar_namespace::snapshot_mounts::{PathError, check_path};
            check_path(lowers, Path::new(&m.path)).map_err(|e| match e {
                PathError::NotADirectory(..) => SandboxError::NotADirectory(e.to_string()),
                PathError::Invalid(_) | PathError::Reserved(..) => {
                    SandboxError::InvalidPath(e.to_string())
                }
                PathError::Io(..) => SandboxError::Io(std::io::Error::other(e.to_string())),
            })?;
        }
        let pairs: Vec<(String, String)> = mounts
            .iter()
            .map(|m| (m.snapshot_id.clone(), m.path.clone()))
            .collect();
        match self.inner.store.hold_mounts(&sandbox.id, &pairs)? {
            Ok(_) => Ok(()),
            Err(refused) => Err(refused_error(refused)),
        }
    }

    /// What a sandbox mounts at launch: its held mounts' layer directories and paths.
    pub(in crate::sandbox) fn launch_mounts(
        &self,
        sandbox_id: &str,
    ) -> Result<Vec<MountSpec>, SandboxError> {
        let held: Vec<HeldMount> = self.inner.store.sandbox_mounts(sandbox_id)?;
        let slots = crate::store::mount_slots(&held);
        Ok(held
            .into_iter()
            .zip(slots)
            .map(|(m, slot)| self.mount_spec(m, slot))
            .collect())
    }

    /// A held mount as the backend mounts it.
    pub(in crate::sandbox) fn mount_spec(&self, m: HeldMount, slot: usize) -> MountSpec {
        MountSpec {
            layers: m.layers.iter().map(|d| self.layers_dir().join(d)).collect(),
            path: m.path,
            slot,
        }
    }
}

/// Checks a mount's path as [`plain_path`] does, and refuses characters a mount option
/// cannot carry (a persistent sandbox mounts it again at each start).
pub(in crate::sandbox) fn mount_path(field: &str, path: &str) -> Result<(), SandboxError> {
    plain_path(field, path)?;
    if path.bytes().any(|b| matches!(b, b',' | b':' | b'\\')) {
        return Err(SandboxError::InvalidPath(format!(
            "{field}: {path:?} has , : or \\"
        )));
    }
    Ok(())
}

/// A mount the store refused, as the user's error.
pub(in crate::sandbox) fn refused_error(refused: MountRefused) -> SandboxError {
    match refused {
        MountRefused::NotFound(id) => SandboxError::SnapshotNotFound(id),
        MountRefused::NotUsable(id, status) => SandboxError::SnapshotNotUsable {
            id,
            status: status.into(),
        },
        MountRefused::NotADirectorySnapshot(id) => SandboxError::BadRequest(format!(
            "mounts: snapshot {id} is of a whole sandbox; only a directory snapshot (taken \
             with `path`) can be mounted"
        )),
        MountRefused::PathInUse(path) => {
            SandboxError::Conflict(format!("A snapshot is mounted at {path} already"))
        }
        MountRefused::TooMany(n) => {
            SandboxError::Conflict(format!("The sandbox has {n} mounts, the most it may have"))
        }
    }
}

/// A directory capture's failure as the user's error where it is one.
fn dir_error(e: BackendError, path: &str) -> SandboxError {
    use belljar_namespace::layer::DirError;
    match e {
        BackendError::Directory(DirError::Invalid(_)) => {
            SandboxError::InvalidPath(format!("path: {path:?} is not a plain absolute path"))
        }
        BackendError::Directory(DirError::NotFound(_)) => {
            SandboxError::PathNotFound(format!("path: no directory {path} in the sandbox"))
        }
        BackendError::Directory(DirError::NotADirectory(_)) => {
            SandboxError::NotADirectory(format!("path: {path} is not a directory"))
        }
        BackendError::Directory(e @ DirError::Pseudo(_)) => {
            SandboxError::InvalidPath(format!("path: {e}; a snapshot holds files"))
        }
        BackendError::Directory(e @ DirError::Unreadable(_)) => {
            SandboxError::PermissionDenied(format!("path: {e}"))
        }
        e => e.into(),
    }
}
