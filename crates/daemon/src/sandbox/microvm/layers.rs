//! Snapshot layers on the microVM backend, in the same format as the namespace backend's (so
//! diff, expiration, squashing and the timeline work unchanged, and a snapshot of either
//! backend starts a sandbox on the other).
//!
//! Capturing: the guest's writable layer is the `upper` directory of an ext4 disk
//! (`layer.ext4`, `/dev/vdb`). Its page cache is flushed first ([`guest_sync`], a `sync` run by
//! the agent), then, with the VM paused or stopped, the disk is copied (sparse, a reflink where
//! the host filesystem can), the copy's journal replayed (`e2fsck -E journal_only`: the guest
//! never unmounted it, so committed metadata may still be in the journal only), mounted
//! read-only through a loop device and its `upper` copied into the layers directory by
//! `belljar_namespace::layer::capture_upper`. The VM runs again as soon as the copy exists.
//!
//! Starting from a snapshot: each layer directory becomes a read-only ext4 disk
//! (`mkfs.ext4 -d`, as images are made from their trees), cached by the layer's digest in
//! `<data>/layer-disks/` and shared by every microVM that stacks it; the agent mounts them and
//! stacks them with overlayfs between its writable layer and the image.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use belljar_agent_proto::client::{AgentClient, ClientError};
use belljar_agent_proto::{CommandStatus, StartCommand};

use crate::sandbox::backend::{BackendError, CapturedLayer};

/// Errors reading a microVM's writable disk on the host and making the disks of its layers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host tool could not be started.
    #[error("Cannot run {tool} (install e2fsprogs and util-linux)")]
    Spawn {
        tool: String,
        #[source]
        source: io::Error,
    },
    /// A host tool failed; `stderr` is what it said.
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: String,
        status: ExitStatus,
        stderr: String,
    },
    /// A host file operation failed.
    #[error("Cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The sandbox's state directory has no `layer.ext4`.
    #[error("The microVM has no writable layer disk")]
    NoLayerDisk,
    /// The microVM's config, which names its disks, could not be read.
    #[error(transparent)]
    Config(belljar_vmm_api::config::Error),
    /// The microVM's config names no root disk.
    #[error("The microVM has no root disk")]
    NoRootDisk,
    /// A snapshot mount without layers.
    #[error("A snapshot mount has no layers")]
    NoLayers,
    /// A path that is not `<layers>/<digest>`.
    #[error("Not a layer directory: {}", .0.display())]
    NotALayer(PathBuf),
    /// Copying the guest's writes into a layer, or squashing layers, failed.
    #[error(transparent)]
    Layer(#[from] belljar_namespace::layer::Error),
    /// The runtime that talks to the guest's agent could not be made.
    #[error("Cannot start a runtime to reach the guest's agent")]
    Runtime(#[source] io::Error),
    /// The guest's agent could not be asked to flush its filesystems.
    #[error("Cannot ask the guest's agent to sync")]
    Agent(#[source] ClientError),
    /// The guest's `sync` did not succeed.
    #[error("The guest's sync ended {status:?} with exit code {code:?}")]
    SyncFailed {
        status: CommandStatus,
        code: Option<i32>,
    },
    /// The guest's `sync` did not end in time.
    #[error("The guest did not sync within {0:?}")]
    SyncTimeout(Duration),
}

/// What [`Error::Io`] holds, for `map_err`.
fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io { what, path, source }
}

/// How long the guest may take to flush its page cache before a pause or stop goes ahead
/// without it (a hung agent must not keep a sandbox from being paused or stopped).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// The most snapshot layers a microVM can stack: one virtio device each, next to its root and
/// writable disks, vsock, rng and network.
pub const MAX_LAYER_DISKS: usize = belljar_vmm_api::MAX_VIRTIO_DEVICES - 5;

/// The most directory snapshots a microVM mounts (one disk each, from the layer disks'
/// share, leaving the sandbox's own chain at least five).
pub const MAX_MOUNTS: usize = MAX_LAYER_DISKS - 5;

/// Asks the agent of the running microVM in `state_dir` to flush every filesystem (`sync` as
/// root), so that the writable layer's disk holds what the guest wrote. Blocks; call it
/// outside the async runtime (the backend's calls run on the blocking pool).
pub fn guest_sync(state_dir: &Path, timeout: Duration) -> Result<(), Error> {
    let socket = state_dir.join("vsock.sock");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    runtime.block_on(async move {
        let run = async {
            let agent =
                AgentClient::connect_hybrid_vsock(&socket, belljar_agent_proto::AGENT_VSOCK_PORT)
                    .await
                    .map_err(Error::Agent)?;
            let start = StartCommand {
                argv: vec!["sync".into()],
                user: Some("root".into()),
                ..Default::default()
            };
            let info = agent.start_command(&start).await.map_err(Error::Agent)?;
            let done = agent.wait_command(&info.id).await.map_err(Error::Agent)?;
            match (done.status, done.exit_code) {
                (CommandStatus::Exited, Some(0)) => Ok(()),
                (status, code) => Err(Error::SyncFailed { status, code }),
            }
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or(Err(Error::SyncTimeout(timeout)))
    })
}

/// Runs a host tool; its stderr is the error.
fn run(cmd: &mut Command, ok: impl Fn(i32) -> bool) -> Result<(), Error> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = match cmd.output() {
        Ok(out) => out,
        Err(source) => return Err(Error::Spawn { tool, source }),
    };
    match out.status.code() {
        Some(code) if ok(code) => Ok(()),
        _ => Err(Error::Tool {
            tool,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }),
    }
}

fn capture_upper(upper: &Path, layers_dir: &Path, limit: u64) -> Result<CapturedLayer, Error> {
    let c = belljar_namespace::layer::capture_upper(upper, layers_dir, Some(limit))?;
    Ok(CapturedLayer {
        digest: c.digest,
        size_bytes: c.size_bytes,
    })
}

/// A copy of the microVM's writable disk, made while the VM is paused or stopped: the part of
/// a capture that must see the disk unchanging. Deleted when dropped.
pub struct DiskCopy {
    dir: tempfile::TempDir,
    /// The guest's disk size: no capture of it holds more file data than that.
    disk_bytes: u64,
}

impl DiskCopy {
    /// Copies `layer.ext4` of `state_dir`.
    pub fn take(state_dir: &Path) -> Result<Self, BackendError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(BackendError::Unsupported {
                backend: "microvm",
                what: "snapshot a sandbox without root (its layer disk is read through a loop mount)",
            });
        }
        Self::copy(state_dir).map_err(BackendError::MicrovmCapture)
    }

    fn copy(state_dir: &Path) -> Result<Self, Error> {
        let disk = state_dir.join("layer.ext4");
        let disk_bytes = match std::fs::symlink_metadata(&disk) {
            Ok(m) if m.is_file() => m.len(),
            _ => return Err(Error::NoLayerDisk),
        };
        let dir = tempfile::Builder::new()
            .prefix("capture-")
            .tempdir_in(state_dir)
            .map_err(io_err("create a directory in", state_dir))?;
        run(
            Command::new("cp")
                .args(["--sparse=always", "--reflink=auto"])
                .arg(&disk)
                .arg(dir.path().join("layer.ext4")),
            |c| c == 0,
        )?;
        Ok(Self { dir, disk_bytes })
    }

    /// Copies the disk's `upper` directory into `layers_dir/<digest>`.
    pub fn capture(self, layers_dir: &Path) -> Result<CapturedLayer, BackendError> {
        self.mount()
            .and_then(|mnt| capture_upper(&mnt.path().join("upper"), layers_dir, self.disk_bytes))
            .map_err(BackendError::MicrovmCapture)
    }

    /// Copies the upper directory of each snapshot mount (`mounts/<slot>/upper`, made by the
    /// agent at boot) into `layers_dir/<digest>`, in the order of `slots`.
    pub fn capture_mounts(
        self,
        slots: &[usize],
        layers_dir: &Path,
    ) -> Result<Vec<CapturedLayer>, BackendError> {
        let mnt = self.mount().map_err(BackendError::MicrovmCapture)?;
        slots
            .iter()
            .map(|slot| {
                let upper = mnt
                    .path()
                    .join("mounts")
                    .join(slot.to_string())
                    .join("upper");
                capture_upper(&upper, layers_dir, self.disk_bytes)
                    .map_err(BackendError::MicrovmCapture)
            })
            .collect()
    }

    /// The copy, its journal replayed, mounted read-only (its `upper` is the guest's writes).
    pub fn mount(&self) -> Result<ReadOnlyMount, Error> {
        let image = self.dir.path().join("layer.ext4");
        // 0: clean, 1: the journal was replayed (or errors corrected).
        run(
            Command::new("e2fsck")
                .args(["-y", "-E", "journal_only"])
                .arg(&image),
            |c| c <= 1,
        )?;
        ReadOnlyMount::ext4(&image, &self.dir.path().join("mnt"), "")
    }

    /// The directory the copy lives in (removed with it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A read-only mount on the host, unmounted when dropped.
pub struct ReadOnlyMount {
    path: PathBuf,
}

impl ReadOnlyMount {
    /// Mounts ext4 image `image` at `at` (made), read-only through a loop device, with
    /// `extra` mount options.
    pub fn ext4(image: &Path, at: &Path, extra: &str) -> Result<Self, Error> {
        std::fs::create_dir_all(at).map_err(io_err("create", at))?;
        run(
            Command::new("mount")
                .args(["-t", "ext4", "-o"])
                .arg(format!("ro,loop,nosuid,nodev,noexec{extra}"))
                .arg(image)
                .arg(at),
            |c| c == 0,
        )?;
        Ok(Self { path: at.into() })
    }

    /// Mounts a read-only overlay of `lowers` (topmost first) at `at` (made).
    pub fn overlay(lowers: &[PathBuf], userxattr: bool, at: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(at).map_err(io_err("create", at))?;
        let dirs: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
        let mut options = format!("ro,nosuid,nodev,noexec,lowerdir={}", dirs.join(":"));
        if userxattr {
            options.push_str(",userxattr");
        }
        run(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(options)
                .arg(at),
            |c| c == 0,
        )?;
        Ok(Self { path: at.into() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).output();
    }
}

/// The read-only ext4 disks of snapshot layer directories (topmost first), made where
/// missing, at most `budget` of them (at least one; a microVM's snapshot mounts take disks of
/// their own). They live next to the layers directory, named by digest; disks whose layer is
/// gone are deleted on the way. A chain deeper than the budget keeps its top layers as their
/// own disks and merges the rest into one (see [`chain_disk`]).
pub fn layer_disks_within(layers: &[PathBuf], budget: usize) -> Result<Vec<PathBuf>, Error> {
    let budget = budget.clamp(1, MAX_LAYER_DISKS);
    let (own, merged) = if layers.len() > budget {
        layers.split_at(budget - 1)
    } else {
        (layers, &[][..])
    };
    let mut disks = Vec::with_capacity(own.len() + 1);
    for layer in own {
        let (layers_dir, digest) = parts(layer)?;
        let cache = disk_cache(layers_dir)?;
        let disk = cache.join(format!("{digest}.ext4"));
        if !disk.is_file() {
            make_disk(layer, &disk)?;
        }
        disks.push(disk);
        prune(&cache, layers_dir);
    }
    if !merged.is_empty() {
        disks.push(chain_disk(merged)?);
    }
    Ok(disks)
}

/// The one read-only disk of a directory snapshot a microVM mounts: its layer's disk, or its
/// layers (topmost first) merged into one.
pub fn mount_disk(layers: &[PathBuf]) -> Result<PathBuf, Error> {
    match layers {
        [] => Err(Error::NoLayers),
        [_] => Ok(layer_disks_within(layers, 1)?.remove(0)),
        _ => chain_disk(layers),
    }
}

/// A layer directory's parent (the layers directory) and name (its digest).
fn parts(layer: &Path) -> Result<(&Path, String), Error> {
    match (layer.parent(), layer.file_name()) {
        (Some(dir), Some(digest)) => Ok((dir, digest.to_string_lossy().into_owned())),
        _ => Err(Error::NotALayer(layer.to_owned())),
    }
}

/// `<data>/layer-disks`, beside `<data>/layers`.
fn disk_cache(layers_dir: &Path) -> Result<PathBuf, Error> {
    let cache = layers_dir.with_file_name("layer-disks");
    std::fs::create_dir_all(&cache).map_err(io_err("create", &cache))?;
    Ok(cache)
}

/// One disk for the bottom of a long chain: the layers squashed into one tree (the rules
/// overlayfs applies when it stacks them, `belljar_namespace::layer::squash`), made into a disk
/// named by a hash of the layers' digests, with a `.layers` file listing them so that the disk
/// is deleted once any of them is.
fn chain_disk(chain: &[PathBuf]) -> Result<PathBuf, Error> {
    use sha2::Digest;
    let (layers_dir, _) = parts(&chain[0])?;
    let cache = disk_cache(layers_dir)?;
    let digests = chain
        .iter()
        .map(|l| parts(l).map(|(_, d)| d))
        .collect::<Result<Vec<_>, _>>()?
        .join("\n");
    let hash = sha2::Sha256::digest(digests.as_bytes());
    let name: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    let disk = cache.join(format!("chain-{name}.ext4"));
    let list = cache.join(format!("chain-{name}.layers"));
    if !disk.is_file() {
        // The list first: a disk is never without the list that lets it be pruned.
        std::fs::write(&list, format!("{digests}\n")).map_err(io_err("write", &list))?;
        let work = tempfile::Builder::new()
            .prefix("chain-")
            .tempdir_in(&cache)
            .map_err(io_err("create a directory in", &cache))?;
        let merged = belljar_namespace::layer::squash(chain, &work.path().join("squash"))?;
        make_disk(&merged.path, &disk)?;
        belljar_namespace::layer::remove_tree(work.path());
    }
    Ok(disk)
}

/// Deletes cached disks whose layer directory (or, for a chain's disk, any of whose layer
/// directories) no longer exists.
fn prune(cache: &Path, layers_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".ext4") else {
            continue;
        };
        let gone = match stem.strip_prefix("chain-") {
            Some(_) => {
                let list = cache.join(format!("{stem}.layers"));
                let layers = std::fs::read_to_string(&list).unwrap_or_default();
                let gone = layers.is_empty()
                    || layers
                        .lines()
                        .any(|digest| !layers_dir.join(digest).exists());
                if gone {
                    let _ = std::fs::remove_file(list);
                }
                gone
            }
            None => !layers_dir.join(stem).exists(),
        };
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// `mkfs.ext4 -d` of one layer directory, under a temporary name until complete; a disk that
/// turns out too small (ext4's own metadata is only estimated) is made again twice as big.
pub(in crate::sandbox) fn make_disk(layer: &Path, disk: &Path) -> Result<(), Error> {
    let (bytes, entries) = tree_size(layer).map_err(io_err("read", layer))?;
    // No journal and no reserved blocks: the disk is never written.
    let mut size = (bytes + bytes / 4 + (8 << 20)).next_multiple_of(1 << 20);
    let inodes = entries * 2 + 256;
    // Unique per call: two launches from one snapshot may make the same disk at once.
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = disk.with_extension(format!("tmp-{}-{n}", std::process::id()));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let made = std::fs::File::create(&tmp)
            .and_then(|f| f.set_len(size))
            .map_err(io_err("create", &tmp))
            .and_then(|()| {
                run(
                    Command::new("mkfs.ext4")
                        .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-b", "4096"])
                        .arg("-N")
                        .arg(inodes.to_string())
                        .arg("-d")
                        .arg(layer)
                        .arg(&tmp),
                    |c| c == 0,
                )
            })
            .and_then(|()| {
                // mkfs makes `lost+found`, which is no part of the layer: a mount's disk would
                // show it in the mounted directory.
                if layer.join("lost+found").symlink_metadata().is_ok() {
                    return Ok(());
                }
                run(
                    Command::new("debugfs")
                        .args(["-w", "-R", "rmdir lost+found"])
                        .arg(&tmp),
                    |c| c == 0,
                )
            });
        match made {
            Ok(()) => {
                let renamed = std::fs::rename(&tmp, disk).map_err(io_err("rename", &tmp));
                if renamed.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                return renamed;
            }
            Err(e) if attempt >= 3 => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
            Err(_) => size *= 2,
        }
    }
}

/// Bytes a tree's files take in 4 KiB blocks, and how many entries it has. A file counts what
/// it stores, not its apparent size: layers keep holes as holes, and so does `mkfs.ext4 -d`,
/// so a sparse file of any size needs a disk for its data only.
fn tree_size(root: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            entries += 1;
            let stored = meta.size().min(meta.blocks() * 512);
            bytes += stored.next_multiple_of(4096) + 4096;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok((bytes, entries))
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
