//! Snapshot layers: a sandbox's writable layer (the overlay's `upper`) captured as an
//! immutable directory tree that later sandboxes stack as an overlay lower directory between
//! their own writable layer and the image.
//!
//! Capturing copies only what the sandbox changed (the upper directory holds nothing else):
//! files, directories, symlinks, devices, overlayfs whiteouts (character devices 0:0) and
//! opaque-directory marks (`user.overlay.opaque`), with modes, owners, extended attributes and
//! modification times. Owners are stored relative to the sandbox's id block (sandbox uid N is
//! stored as uid N, like the image's files), so any sandbox sees the layer through the same
//! idmapped mount as the image, whatever its own id block.
//!
//! A layer is content-addressed: its name is the SHA-256 of a canonical listing of every entry
//! (path, type, mode, owner, times, attributes and content hash), so two identical captures
//! share one directory. The copy is made under a temporary name and renamed into place, so a
//! layer directory that has its final name is always complete.
//!
//! The upper directory is written by the sandbox and therefore hostile: the walk never follows
//! a symlink, opens nothing but regular files (with `O_NOFOLLOW`), and keeps its own stack, so
//! a deep tree cannot overflow the daemon's. It must run while the sandbox is frozen or
//! stopped, so that nothing changes under it.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::state::State;
use crate::{disk, mounts};

pub mod diff;
mod dir;
pub mod guest_view;
mod reuse;
mod sparse;
mod squash;
mod trash;
pub(crate) mod xattr;

pub use dir::{DirError, capture_dir, capture_dir_of_tree};
pub use reuse::forget as forget_captures;
pub use squash::squash;
pub use trash::wait_empty as wait_trash_empty;

use xattr::{get_xattr, list_xattrs, set_times, set_xattr};

/// How many ids a sandbox's block spans (sandbox uid 0..65535).
const ID_BLOCK: u32 = 65536;
/// The owner a file gets when its host owner lies outside the sandbox's block.
const NOBODY: u32 = 65534;

/// Errors capturing a layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sandbox has no state (it was never launched, or was destroyed).
    #[error("The sandbox has no writable layer")]
    NoLayer,
    /// Reading the sandbox's state failed.
    #[error(transparent)]
    State(#[from] crate::state::Error),
    /// The sandbox's disk could not be mounted to read its writable layer.
    #[error(transparent)]
    Disk(#[from] disk::Error),
    /// Reading the writable layer or writing the snapshot layer failed.
    #[error("Cannot copy {}", path.display())]
    Copy {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The capture would write more file data than the sandbox's disk holds, which no
    /// sandbox's own writes can (holes are not written): the layer is not made.
    #[error(
        "The snapshot would hold more than {limit} bytes of file data, the sandbox's disk size"
    )]
    TooLarge { limit: u64 },
    /// A directory capture met an entry the sandbox's own root could not read (the path is
    /// relative to the captured directory).
    #[error("The sandbox cannot read {}", .0.display())]
    Unreadable(PathBuf),
    /// A directory capture met a pseudo-filesystem mounted below the captured directory.
    #[error("{} is a pseudo-filesystem", .0.display())]
    Pseudo(PathBuf),
}

/// A captured layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Hex SHA-256 of the layer's canonical listing; also its directory name.
    pub digest: String,
    /// Bytes of regular-file data the layer stores (each hard-linked file once; holes and
    /// blocks of zeros, which the layer keeps as holes, not counted).
    pub size_bytes: u64,
    /// The layer's directory: `layers_dir/<digest>`.
    pub path: PathBuf,
}

/// Copies the writable layer of the sandbox in `state_dir` into `layers_dir/<digest>` (which
/// is kept as it is when another capture already made it). The sandbox must be frozen or
/// stopped. A stopped sandbox's disk is mounted for the copy and unmounted after it. A sandbox
/// with a disk cannot make the copy write more file data than the disk's size.
pub fn capture(state_dir: &Path, layers_dir: &Path) -> Result<Captured, Error> {
    capture_in(state_dir, "upper", layers_dir)
}

/// Copies the writable layer of the sandbox's snapshot mount `slot` (its writes under the
/// mount, see [`crate::snapshot_mounts`]) as [`capture`] does the sandbox's own.
pub fn capture_mount(state_dir: &Path, slot: usize, layers_dir: &Path) -> Result<Captured, Error> {
    capture_in(state_dir, &format!("mounts/{slot}/upper"), layers_dir)
}

fn capture_in(state_dir: &Path, upper: &str, layers_dir: &Path) -> Result<Captured, Error> {
    let st = State::load(state_dir)?.ok_or(Error::NoLayer)?;
    let shift = if st.rootless {
        Shift::Rootless(st.root_uid)
    } else {
        Shift::Block(st.root_uid)
    };
    let fs_dir = state_dir.join("fs");
    let disk_bytes = disk::size(state_dir);
    let mounted_here = disk_bytes.is_some() && !disk::is_mount_point(&fs_dir);
    if mounted_here {
        disk::mount(state_dir, &fs_dir, disk::MIN_DISK_BYTES)?;
    }
    let result = capture_tree_with(&fs_dir.join(upper), layers_dir, shift, disk_bytes, true);
    if mounted_here {
        disk::unmount(&fs_dir);
    }
    result
}

/// Copies an overlay upper directory that is no namespace sandbox's (a microVM's writable
/// layer, read from its disk on the host) into `layers_dir/<digest>`. Owners stay as they
/// are: the guest's ids are the sandbox's. The guest's overlay marks (`trusted.overlay.*`,
/// as root's overlay in the guest writes them) become the `user.overlay.*` marks every layer
/// carries, so the layer is the same whichever backend made it. At most `limit` bytes of
/// file data are written (the guest's disk size).
pub fn capture_upper(
    upper: &Path,
    layers_dir: &Path,
    limit: Option<u64>,
) -> Result<Captured, Error> {
    capture_tree_with(upper, layers_dir, Shift::Keep, limit, false)
}

/// How host owners in the writable layer become the layer's stored owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shift {
    /// Root-run sandboxes: host ids `base..base+65536` are sandbox ids 0..65536.
    Block(u32),
    /// Rootless: only the invoking user (sandbox root) is known; it becomes 0.
    Rootless(u32),
    /// Keep owners as they are: the tree is already canonical (squashed layers).
    Keep,
}

impl Shift {
    fn apply(self, id: u32) -> u32 {
        match self {
            Shift::Block(base) => match id.checked_sub(base) {
                Some(n) if n < ID_BLOCK => n,
                _ => NOBODY,
            },
            Shift::Rootless(me) if id == me => 0,
            Shift::Rootless(_) => id,
            Shift::Keep => id,
        }
    }
}

/// Copies the tree at `upper` into `layers_dir/<digest>` through a temporary directory,
/// writing at most `limit` bytes of file data.
pub(crate) fn capture_tree(
    upper: &Path,
    layers_dir: &Path,
    shift: Shift,
    limit: Option<u64>,
) -> Result<Captured, Error> {
    capture_tree_with(upper, layers_dir, shift, limit, false)
}

/// [`capture_tree`] of a running sandbox's view, reading only what its root could
/// ([`guest_view`]).
pub(crate) fn capture_view(
    root: &Path,
    layers_dir: &Path,
    view: guest_view::GuestView,
    shift: Shift,
) -> Result<Captured, Error> {
    capture_tree_inner(root, layers_dir, shift, None, false, Some(view))
}

/// [`capture_tree`]; with `incremental`, the files unchanged since this process last captured
/// `upper` are linked from that layer instead of copied (see [`reuse`]).
fn capture_tree_with(
    upper: &Path,
    layers_dir: &Path,
    shift: Shift,
    limit: Option<u64>,
    incremental: bool,
) -> Result<Captured, Error> {
    capture_tree_inner(upper, layers_dir, shift, limit, incremental, None)
}

fn capture_tree_inner(
    upper: &Path,
    layers_dir: &Path,
    shift: Shift,
    limit: Option<u64>,
    incremental: bool,
    view: Option<guest_view::GuestView>,
) -> Result<Captured, Error> {
    let fail = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Copy { path, source }
    };
    fs::create_dir_all(layers_dir).map_err(fail(layers_dir))?;
    let tmp = layers_dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    let mut copier = Copier::new(shift, limit);
    copier.view = view;
    if incremental {
        copier.previous = reuse::previous(upper);
        copier.taken = Some(reuse::Files::default());
    }
    let copied = copier.run(upper, &tmp);
    let (digest, size_bytes, taken) = match copied {
        Ok(v) => v,
        Err(e) => {
            remove_tree(&tmp);
            return Err(e);
        }
    };
    let path = layers_dir.join(&digest);
    if path.exists() {
        // The same content was captured before: share that directory. The copy is deleted
        // off this clock (a live snapshot's sandbox is frozen until this returns).
        trash::remove_later(&tmp);
    } else {
        fs::rename(&tmp, &path).map_err(fail(&path))?;
    }
    if let Some(taken) = taken {
        reuse::remember(upper, path.clone(), taken);
    }
    Ok(Captured {
        digest,
        size_bytes,
        path,
    })
}

/// Deletes a layer directory (or a half-made one); the overlay's `work` leftovers may have
/// mode 000, which root ignores.
pub fn remove_tree(path: &Path) {
    let _ = fs::remove_dir_all(path);
}

/// Whether `name` in a layers directory is a half-made copy left by a capture that was cut
/// short (a daemon killed mid-snapshot), or a copy that was waiting to be deleted; such
/// directories can be deleted at start.
pub fn is_partial(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b".tmp-") || name.as_bytes().starts_with(trash::PREFIX)
}

struct Copier {
    shift: Shift,
    hasher: Sha256,
    size: u64,
    /// Hard links: (dev, ino) of the source → the first copy's relative path.
    links: HashMap<(u64, u64), PathBuf>,
    buf: Vec<u8>,
    /// What the copy may still write.
    budget: sparse::Budget,
    /// For a running sandbox's view: what its root may read.
    view: Option<guest_view::GuestView>,
    /// The last capture of the same writable layer, whose unchanged files are linked.
    previous: Option<std::sync::Arc<reuse::Previous>>,
    /// The regular files taken, for the next capture of the same writable layer.
    taken: Option<reuse::Files>,
}

enum Work {
    Visit(PathBuf),
    /// Set a directory's mode, owner and times once its children exist (a read-only
    /// directory would refuse them, and adding them would change its mtime).
    Finish(PathBuf, fs::Metadata),
}

impl Copier {
    fn new(shift: Shift, limit: Option<u64>) -> Self {
        Self {
            shift,
            hasher: Sha256::new(),
            size: 0,
            links: HashMap::new(),
            buf: vec![0; 1 << 20],
            budget: sparse::Budget::new(limit),
            view: None,
            previous: None,
            taken: None,
        }
    }

    /// Copies the tree; returns its digest, its bytes of file content and, when asked for, the
    /// regular files it took.
    fn run(
        mut self,
        src_root: &Path,
        dst_root: &Path,
    ) -> Result<(String, u64, Option<reuse::Files>), Error> {
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Copy { path, source }
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dst_root)
            .map_err(fail(dst_root))?;
        let mut stack = vec![Work::Visit(PathBuf::new())];
        while let Some(work) = stack.pop() {
            match work {
                Work::Visit(rel) => {
                    let src = src_root.join(&rel);
                    let dst = dst_root.join(&rel);
                    let meta = fs::symlink_metadata(&src).map_err(fail(&src))?;
                    if let Some(view) = &mut self.view {
                        view.check(&src, &meta).map_err(|r| match r {
                            guest_view::Refusal::Unreadable => Error::Unreadable(rel.clone()),
                            guest_view::Refusal::Pseudo => Error::Pseudo(rel.clone()),
                            guest_view::Refusal::Statfs(source) => Error::Copy {
                                path: src.clone(),
                                source,
                            },
                        })?;
                    }
                    if meta.is_dir() {
                        if !rel.as_os_str().is_empty() {
                            fs::DirBuilder::new()
                                .mode(0o700)
                                .create(&dst)
                                .map_err(fail(&dst))?;
                        }
                        self.record(&rel, &meta, b"dir", &[]);
                        self.xattrs(&src, Some(&dst))?;
                        stack.push(Work::Finish(rel.clone(), meta));
                        let mut names: Vec<OsString> = fs::read_dir(&src)
                            .map_err(fail(&src))?
                            .map(|e| e.map(|e| e.file_name()))
                            .collect::<Result<_, _>>()
                            .map_err(fail(&src))?;
                        // Visited in name order (the stack pops the last pushed first), so
                        // the listing, and the digest, do not depend on directory order.
                        names.sort_unstable_by(|a, b| b.cmp(a));
                        stack.extend(names.into_iter().map(|n| Work::Visit(rel.join(n))));
                    } else {
                        self.copy_entry(&src, &dst, &rel, &meta)?;
                    }
                }
                Work::Finish(rel, meta) => {
                    let dst = dst_root.join(&rel);
                    let (uid, gid) = if rel.as_os_str().is_empty() {
                        // The layer's own root is never seen (the upper directory's is).
                        (0, 0)
                    } else {
                        (self.shift.apply(meta.uid()), self.shift.apply(meta.gid()))
                    };
                    std::os::unix::fs::lchown(&dst, Some(uid), Some(gid)).map_err(fail(&dst))?;
                    let mode = if rel.as_os_str().is_empty() {
                        0o755
                    } else {
                        meta.mode() & 0o7777
                    };
                    fs::set_permissions(&dst, fs::Permissions::from_mode(mode))
                        .map_err(fail(&dst))?;
                    set_times(&dst, &meta).map_err(fail(&dst))?;
                }
            }
        }
        let digest = hex::encode(self.hasher.finalize());
        Ok((digest, self.size, self.taken))
    }

    /// Adds one entry to the canonical listing the digest is taken over.
    fn record(&mut self, rel: &Path, meta: &fs::Metadata, kind: &[u8], extra: &[u8]) {
        let h = &mut self.hasher;
        h.update((rel.as_os_str().len() as u64).to_le_bytes());
        h.update(rel.as_os_str().as_bytes());
        h.update(kind);
        h.update(meta.mode().to_le_bytes());
        h.update(self.shift.apply(meta.uid()).to_le_bytes());
        h.update(self.shift.apply(meta.gid()).to_le_bytes());
        h.update(meta.mtime().to_le_bytes());
        h.update(meta.mtime_nsec().to_le_bytes());
        h.update((extra.len() as u64).to_le_bytes());
        h.update(extra);
    }

    fn copy_entry(
        &mut self,
        src: &Path,
        dst: &Path,
        rel: &Path,
        meta: &fs::Metadata,
    ) -> Result<(), Error> {
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Copy { path, source }
        };
        let ft = meta.file_type();
        if ft.is_file() && meta.nlink() > 1 {
            if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                let first = first.clone();
                let target = dst
                    .ancestors()
                    .nth(rel.components().count())
                    .map(|root| root.join(&first))
                    .unwrap_or_default();
                fs::hard_link(&target, dst).map_err(fail(dst))?;
                self.record(rel, meta, b"link", first.as_os_str().as_bytes());
                return Ok(());
            }
            self.links
                .insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        if ft.is_file() {
            let linked = self.previous.as_ref().and_then(|p| p.link(rel, meta, dst));
            let copied = match linked {
                Some(copied) => copied,
                None => self.copy_file(src, dst)?,
            };
            self.size += copied.stored;
            if let Some(taken) = &mut self.taken {
                taken.note(rel, meta, copied);
            }
            self.record(rel, meta, b"file", &copied.content);
            if linked.is_some() {
                // The linked inode is the earlier layer's, whose owner, mode, times and
                // attributes are this file's already (its change time says none changed);
                // a chown would clear its set-id bits under the sandboxes that read it.
                return self.xattrs(src, None);
            }
        } else if ft.is_symlink() {
            let target = fs::read_link(src).map_err(fail(src))?;
            std::os::unix::fs::symlink(&target, dst).map_err(fail(dst))?;
            self.record(rel, meta, b"symlink", target.as_os_str().as_bytes());
        } else {
            // Devices (whiteouts are character devices 0:0), FIFOs and sockets.
            let path = mounts::c_path(dst);
            // SAFETY: mknod with a valid C path; the mode carries the file type from lstat.
            let ret = unsafe {
                libc::mknod(
                    path.as_ptr(),
                    meta.mode() & (libc::S_IFMT | 0o7777),
                    meta.rdev(),
                )
            };
            if ret != 0 {
                return Err(Error::Copy {
                    path: dst.to_owned(),
                    source: io::Error::last_os_error(),
                });
            }
            self.record(rel, meta, b"node", &meta.rdev().to_le_bytes());
        }
        self.xattrs(src, Some(dst))?;
        std::os::unix::fs::lchown(
            dst,
            Some(self.shift.apply(meta.uid())),
            Some(self.shift.apply(meta.gid())),
        )
        .map_err(fail(dst))?;
        if !ft.is_symlink() {
            // After the chown, which clears set-id bits.
            fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(fail(dst))?;
        }
        set_times(dst, meta).map_err(fail(dst))
    }

    /// Copies a regular file's content, sparsely ([`sparse`]); returns its content hash.
    fn copy_file(&mut self, src: &Path, dst: &Path) -> Result<sparse::Copied, Error> {
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Copy { path, source }
        };
        let input = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(src)
            .map_err(fail(src))?;
        let meta = input.metadata().map_err(fail(src))?;
        if !meta.is_file() {
            return Err(Error::Copy {
                path: src.to_owned(),
                source: io::Error::other("changed while it was copied"),
            });
        }
        let output = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dst)
            .map_err(fail(dst))?;
        sparse::copy(&input, &output, meta.len(), &mut self.buf, &mut self.budget).map_err(|e| {
            match e {
                sparse::CopyError::Read(source) => Error::Copy {
                    path: src.to_owned(),
                    source,
                },
                sparse::CopyError::Write(source) => Error::Copy {
                    path: dst.to_owned(),
                    source,
                },
                sparse::CopyError::OverBudget => Error::TooLarge {
                    limit: self.budget.limit,
                },
            }
        })
    }

    /// Copies extended attributes (to `dst`, if given) and lists them, except overlayfs's own
    /// bookkeeping of the upper layer (`origin`, `impure`, ...), which refers to the old lower
    /// layers; the opaque-directory mark is kept: it is what hides the image's directory below.
    fn xattrs(&mut self, src: &Path, dst: Option<&Path>) -> Result<(), Error> {
        let fail = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Copy { path, source }
        };
        let mut names = list_xattrs(src).map_err(fail(src))?;
        names.sort();
        for source_name in names {
            // A guest overlay's marks (a microVM's upper) in the form layers keep.
            let name = match source_name.as_bytes().strip_prefix(b"trusted.overlay.") {
                Some(rest) => OsStr::from_bytes(&[b"user.overlay.", rest].concat()).to_owned(),
                None => source_name.clone(),
            };
            let bytes = name.as_bytes();
            if bytes.starts_with(b"user.overlay.")
                && !matches!(
                    bytes,
                    b"user.overlay.opaque" | b"user.overlay.whiteout" | b"user.overlay.whiteouts"
                )
            {
                continue;
            }
            let Some(value) = get_xattr(src, &source_name).map_err(fail(src))? else {
                continue;
            };
            if let Some(dst) = dst {
                set_xattr(dst, &name, &value).map_err(fail(dst))?;
            }
            self.hasher.update((bytes.len() as u64).to_le_bytes());
            self.hasher.update(bytes);
            self.hasher.update((value.len() as u64).to_le_bytes());
            self.hasher.update(&value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
