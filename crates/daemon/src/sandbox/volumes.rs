//! Host folders and named volumes mounted into sandboxes (`volumes: [{source, path,
//! read_only}]`), and the named volumes themselves.
//!
//! Who may mount what: over the Unix socket a host folder is opened with the permissions of
//! the connecting process's uid (`SO_PEERCRED`), so a caller mounts only what it may read
//! (and write, unless `read_only`); over TCP (the browser, SDKs) only folders under a root
//! the daemon's owner allowed (`belljard --allow-mount-root`). The uid is recorded with the
//! sandbox, and every later start (a persistent sandbox's, a fork's) opens the folders as it
//! again. The opening itself, and the mount, are `belljar_namespace::host_mounts`'.
//!
//! A volume is a directory of the daemon's (`<data>/volumes/<name>/data`) or, with a size, an
//! ext4 file mounted at `<data>/volumes/<name>/mnt` the first time a sandbox mounts it and
//! shared by all that do. Its files keep the sandbox's ids, the same in every sandbox.

use std::path::{Path, PathBuf};

use belljar_api::{Backend, CreateVolume, Validate, Volume, VolumeList, VolumeMount};
use belljar_namespace::host_mounts::{self, BindMount, OpenError, Opener};

use super::backend::BackendError;
use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

/// Whose permissions a sandbox's host folders are opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountAuthority {
    /// A Unix-socket caller's uid (`SO_PEERCRED`).
    Uid(u32),
    /// A TCP caller: only folders under the daemon's allowed mount roots.
    Tcp,
}

impl MountAuthority {
    /// The uid recorded with the sandbox's mounts (`None`: a TCP caller's).
    pub(super) fn uid(self) -> Option<u32> {
        match self {
            Self::Uid(u) => Some(u),
            Self::Tcp => None,
        }
    }
}

fn denied(e: OpenError) -> SandboxError {
    match e {
        OpenError::NotFound(_) | OpenError::NotADirectory(_) | OpenError::Symlink(_) => {
            SandboxError::BadRequest(format!("volumes: {e}"))
        }
        e if e.is_denied() => SandboxError::MountDenied(e.to_string()),
        e => SandboxError::Io(std::io::Error::other(crate::util::error_chain(&e))),
    }
}

impl Sandboxes {
    /// Checks a create's mounts before anything is made: plain paths, each used once, a
    /// backend that can mount them, host folders the caller may open, volumes that exist.
    pub(super) fn check_volumes(
        &self,
        volumes: &[VolumeMount],
        backend: Backend,
        who: MountAuthority,
    ) -> Result<(), SandboxError> {
        if volumes.is_empty() {
            return Ok(());
        }
        if backend == Backend::Microvm {
            return Err(BackendError::Unsupported {
                backend: "microvm",
                what: "mount host folders or volumes (that needs virtio-fs, which microVMs \
                       do not have yet; use the namespace backend)",
            }
            .into());
        }
        if !nix::unistd::Uid::effective().is_root() {
            return Err(BackendError::Unsupported {
                backend: "namespace",
                what: "mount host folders or volumes when the daemon is not root (id-mapped \
                       mounts need root)",
            }
            .into());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, v) in volumes.iter().enumerate() {
            v.validate().map_err(|e| {
                SandboxError::BadRequest(format!("volumes[{i}].{}: {}", e.field, e.problem))
            })?;
            host_mounts::check_path(Path::new(&v.path))
                .map_err(|e| SandboxError::InvalidPath(format!("volumes[{i}].path: {e}")))?;
            if !seen.insert(v.path.trim_end_matches('/').to_owned()) {
                return Err(SandboxError::BadRequest(format!(
                    "volumes[{i}].path: {} is mounted twice",
                    v.path
                )));
            }
            self.open_one(v, who)?;
        }
        Ok(())
    }

    /// A sandbox made from a snapshot mounts what the snapshot's sandbox mounted (its
    /// definitions, never a copy of the contents), unless the request names its own
    /// `volumes` (`[]` for none); they are checked as this request's caller. A snapshot whose
    /// sandbox was deleted has none to give.
    pub(super) fn inherit_volumes(
        &self,
        mut req: belljar_api::CreateSandbox,
    ) -> Result<belljar_api::CreateSandbox, SandboxError> {
        if req.volumes.is_some() {
            return Ok(req);
        }
        let Some(belljar_api::Source::Snapshot { snapshot_id }) = &req.source else {
            return Ok(req);
        };
        let Some(row) = self.inner.store.snapshot(snapshot_id)? else {
            return Ok(req);
        };
        if let Some(source) = self.inner.store.sandbox(&row.snapshot.source_sandbox_id)? {
            req.volumes = source.volumes;
        }
        Ok(req)
    }

    /// The sandbox's mounts, opened for a launch (as the uid recorded at its create).
    pub(super) fn open_binds(
        &self,
        sandbox: &belljar_api::Sandbox,
    ) -> Result<Vec<BindMount>, SandboxError> {
        let volumes = sandbox.volumes.as_deref().unwrap_or_default();
        if volumes.is_empty() {
            return Ok(Vec::new());
        }
        let who = match self.inner.store.mounts_as(&sandbox.id)? {
            Some(uid) => MountAuthority::Uid(uid),
            None => MountAuthority::Tcp,
        };
        volumes.iter().map(|v| self.open_one(v, who)).collect()
    }

    /// Whose permissions the sandbox's host folders were checked with.
    pub(super) fn mount_authority(&self, id: &str) -> Result<MountAuthority, SandboxError> {
        Ok(match self.inner.store.mounts_as(id)? {
            Some(uid) => MountAuthority::Uid(uid),
            None => MountAuthority::Tcp,
        })
    }

    fn open_one(&self, v: &VolumeMount, who: MountAuthority) -> Result<BindMount, SandboxError> {
        let path = PathBuf::from(&v.path);
        if !v.is_host_folder() {
            let source = self.volume_root(&v.source)?;
            let fd = host_mounts::open_dir(&source, None, None, false, &[]).map_err(denied)?;
            return Ok(BindMount {
                source: fd.into(),
                path,
                read_only: v.read_only(),
                owner: None,
            });
        }
        let folder = Path::new(&v.source);
        let forbidden = self.daemon_dirs();
        let fd = match who {
            MountAuthority::Uid(uid) => {
                let opener = (uid != 0).then(|| Opener::for_uid(uid));
                host_mounts::open_dir(folder, opener.as_ref(), None, !v.read_only(), &forbidden)
            }
            MountAuthority::Tcp => {
                let roots = &self.inner.settings.allow_mount_roots;
                let root = roots
                    .iter()
                    .find(|r| folder.starts_with(r))
                    .ok_or_else(|| {
                        SandboxError::MountDenied(format!(
                            "{} is under no mount root this daemon allows over TCP (belljard \
                         --allow-mount-root); the CLI, over the Unix socket, may mount what \
                         its user may read",
                            folder.display()
                        ))
                    })?;
                host_mounts::open_dir(folder, None, Some(root), false, &forbidden)
            }
        }
        .map_err(denied)?;
        // fstat works on an O_PATH descriptor.
        let file = std::fs::File::from(fd);
        let meta = file.metadata()?;
        use std::os::unix::fs::MetadataExt;
        Ok(BindMount {
            source: std::sync::Arc::new(file.into()),
            path,
            read_only: v.read_only(),
            owner: Some((meta.uid(), meta.gid())),
        })
    }

    /// The daemon's own directories, which no sandbox may mount, nor a folder holding them.
    fn daemon_dirs(&self) -> Vec<PathBuf> {
        let p = &self.inner.paths;
        [&p.dirs.data, &p.dirs.config, &p.dirs.runtime, &p.cache]
            .into_iter()
            .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()))
            .collect()
    }

    fn volumes_dir(&self) -> PathBuf {
        self.inner.paths.dirs.data.join("volumes")
    }

    /// The directory a volume's mounts show, its filesystem mounted first when it has a size.
    fn volume_root(&self, name: &str) -> Result<PathBuf, SandboxError> {
        let v = self
            .inner
            .store
            .volume(name)?
            .ok_or_else(|| SandboxError::VolumeNotFound(name.to_owned()))?;
        let dir = self.volumes_dir().join(name);
        let root = match v.size_mib {
            Some(mib) => {
                let mnt = dir.join("mnt");
                host_mounts::mount_volume_disk(&dir.join("volume.ext4"), &mnt, mib << 20).map_err(
                    |e| SandboxError::Io(std::io::Error::other(crate::util::error_chain(&e))),
                )?;
                mnt
            }
            None => dir.join("data"),
        };
        prepare_root(&root)?;
        Ok(root)
    }

    /// Creates a named volume (its directory, and its filesystem when it has a size).
    pub async fn create_volume(&self, req: CreateVolume) -> Result<Volume, SandboxError> {
        req.validate()
            .map_err(|e| SandboxError::BadRequest(e.to_string()))?;
        if !self
            .inner
            .store
            .insert_volume(&req.name, req.size_mib, now_ms())?
        {
            return Err(SandboxError::Conflict(format!(
                "A volume named {} exists",
                req.name
            )));
        }
        let this = self.clone();
        let name = req.name.clone();
        let made = tokio::task::spawn_blocking(move || {
            let dir = this.volumes_dir().join(&name);
            std::fs::create_dir_all(&dir)?;
            if req.size_mib.is_none() {
                std::fs::create_dir_all(dir.join("data"))?;
                prepare_root(&dir.join("data"))?;
            } else {
                // Formats it now, so that a size the host cannot give fails here.
                this.volume_root(&name)?;
            }
            Ok::<_, SandboxError>(())
        })
        .await
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
        if let Err(e) = made {
            let _ = self.inner.store.delete_unused_volume(&req.name);
            let _ = std::fs::remove_dir_all(self.volumes_dir().join(&req.name));
            return Err(e);
        }
        self.volume(&req.name)
    }

    pub fn volume(&self, name: &str) -> Result<Volume, SandboxError> {
        self.inner
            .store
            .volume(name)?
            .ok_or_else(|| SandboxError::VolumeNotFound(name.to_owned()))
    }

    pub fn list_volumes(&self) -> Result<VolumeList, SandboxError> {
        Ok(VolumeList {
            volumes: self.inner.store.volumes()?,
        })
    }

    /// Removes a volume and its files; refused while any sandbox mounts it.
    pub async fn remove_volume(&self, name: &str) -> Result<(), SandboxError> {
        let v = self.volume(name)?;
        if !self.inner.store.delete_unused_volume(name)? {
            let users = self.inner.store.volume_users(name)?;
            return Err(SandboxError::VolumeInUse(format!(
                "Volume {} is mounted by {}; delete those sandboxes first",
                v.name,
                users.join(", ")
            )));
        }
        let dir = self.volumes_dir().join(name);
        tokio::task::spawn_blocking(move || {
            host_mounts::unmount_volume_disk(&dir.join("mnt"));
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        })
        .await
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))??;
        Ok(())
    }
}

impl Sandboxes {
    /// Unmounts the disks of sized volumes that no sandbox mounts (the daemon is stopping), so
    /// that a stopped daemon leaves no loop device or mount behind for them.
    pub fn release_idle_volumes(&self) {
        let volumes = match self.inner.store.volumes() {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the volumes to unmount the idle ones");
                return;
            }
        };
        for v in volumes {
            if v.size_mib.is_some() && v.used_by.is_empty() {
                host_mounts::unmount_volume_disk(&self.volumes_dir().join(&v.name).join("mnt"));
            }
        }
    }
}

/// A volume's root belongs to the sandbox's user (its files keep sandbox ids).
fn prepare_root(root: &Path) -> Result<(), SandboxError> {
    let meta = std::fs::symlink_metadata(root)?;
    use std::os::unix::fs::MetadataExt;
    if meta.uid() == 0 && meta.gid() == 0 {
        let id = host_mounts::SANDBOX_USER;
        std::os::unix::fs::lchown(root, Some(id), Some(id))?;
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    Ok(())
}
