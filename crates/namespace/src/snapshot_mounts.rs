//! Snapshots mounted at a path of a sandbox (Modal's `mount_image`): a directory snapshot's
//! layers become the lower directories of an overlay mounted over that path, so the sandbox
//! sees the snapshot's files there and writes go to its own layer
//! (`state_dir/fs/mounts/<n>/upper`), never back into the shared, immutable snapshot. As in
//! Modal, a path that does not exist is created and one that exists is hidden by the mount.
//!
//! The mount is made by PID 1 before the pivot, when paths still resolve on the host, so the
//! path is checked through the stacked layers first: no component may be a symlink (or any
//! other non-directory) a snapshot left there, which would point the mount at the host.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use crate::child::Step;
use crate::mounts::{self, c};

/// A snapshot's layers mounted at a path of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMount {
    /// Layer directories, topmost first (a directory snapshot has one).
    pub layers: Vec<PathBuf>,
    /// Absolute path in the sandbox; not `/`, no `.` or `..`.
    pub path: PathBuf,
    /// Names its directories (`state_dir/fs/mounts/<slot>`): the same at every start, so a
    /// persistent sandbox finds its writes under the mount again, and unique among the
    /// sandbox's mounts (one unmounted while the sandbox runs leaves a gap).
    pub slot: usize,
}

/// Why a mount path is refused.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// Relative, `/`, or with `.`/`..` components or characters a mount cannot carry.
    #[error("Mount path {0:?} must be absolute, not `/`, without `.` or `..`")]
    Invalid(PathBuf),
    /// A component is a file or symlink in the sandbox's filesystem.
    #[error("Mount path {0:?} crosses {1:?}, which is not a directory")]
    NotADirectory(PathBuf, PathBuf),
    #[error("Cannot look up {}", .0.display())]
    Io(PathBuf, #[source] io::Error),
    /// Under a place the sandbox's own set-up mounts (`/proc`, `/sys`, `/dev`, ...).
    #[error("Mount path {} is under {owner}, which the sandbox's set-up owns", .0.display(), owner = .1)]
    Reserved(PathBuf, &'static str),
}

/// Why a directory-snapshot mount is refused before a launch or a live mount.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("Mount slot {0} is used twice")]
    SlotReused(usize),
    #[error("Mount at {} has no layers", .0.display())]
    NoLayers(PathBuf),
    #[error("Layer {} must be absolute, without , : \\", .0.display())]
    BadLayer(PathBuf),
    #[error("Layer {} is not a directory", .0.display())]
    LayerNotADirectory(PathBuf),
    /// A mount option cannot carry these characters.
    #[error("Mount path {} has , : or \\", .0.display())]
    Unquotable(PathBuf),
    #[error(transparent)]
    Path(#[from] PathError),
}

/// The path's components below `/`, once it is known to be a plain absolute path.
pub(crate) fn components(path: &Path) -> Result<Vec<&OsStr>, PathError> {
    let invalid = || PathError::Invalid(path.to_owned());
    let bytes = path.as_os_str().as_encoded_bytes();
    if !path.is_absolute() || bytes.contains(&0) || bytes.len() > 1024 {
        return Err(invalid());
    }
    let mut out = Vec::new();
    for comp in path.components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(n) => out.push(n),
            _ => return Err(invalid()),
        }
    }
    if out.is_empty() {
        return Err(invalid());
    }
    Ok(out)
}

/// Checks `path` against a sandbox stacked from `lowers` (topmost first, the image last) and
/// an empty writable layer: every component that exists must be a directory. A component a
/// whiteout deleted, and everything below it, is created by the mount.
pub fn check_path(lowers: &[PathBuf], path: &Path) -> Result<(), PathError> {
    let comps = components(path)?;
    let mut live: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
    let mut rel = PathBuf::new();
    for comp in comps {
        rel.push(comp);
        let mut next: Vec<&Path> = Vec::new();
        for lower in &live {
            let here = lower.join(&rel);
            let meta = match fs::symlink_metadata(&here) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(PathError::Io(here, e)),
            };
            if meta.is_dir() {
                next.push(lower);
                if opaque(&here) {
                    break;
                }
                continue;
            }
            let whiteout = meta.file_type().is_char_device() && meta.rdev() == 0;
            if next.is_empty() && !whiteout {
                return Err(PathError::NotADirectory(
                    path.to_owned(),
                    Path::new("/").join(&rel),
                ));
            }
            // A non-directory below a directory: overlayfs never looks further down.
            break;
        }
        if next.is_empty() {
            return Ok(());
        }
        live = next;
    }
    Ok(())
}

fn opaque(dir: &Path) -> bool {
    xattr_is_y(dir, c"user.overlay.opaque") || xattr_is_y(dir, c"trusted.overlay.opaque")
}

fn xattr_is_y(path: &Path, name: &std::ffi::CStr) -> bool {
    let p = mounts::c_path(path);
    let mut buf = [0u8; 2];
    // SAFETY: valid C strings and a buffer of `buf.len()` writable bytes; no symlink is
    // followed.
    let n = unsafe { libc::lgetxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 2) };
    n == 1 && buf[0] == b'y'
}

/// The directories of mount `n` under `state_dir/fs`.
fn dir(n: usize, sub: &str) -> String {
    format!("mounts/{n}/{sub}")
}

/// Names the directories the mounts need under `fs_dir` (owned by sandbox root, the upper
/// directory 0755: it is the mount point's own mode), with each layer's attach point.
pub(crate) fn directories(mounts: &[LayerMount]) -> Vec<(String, u32)> {
    mounts.iter().flat_map(slot_directories).collect()
}

/// The directories of one mount, its slot's first.
pub(crate) fn slot_directories(m: &LayerMount) -> Vec<(String, u32)> {
    let n = m.slot;
    let mut out = vec![
        ("mounts".to_owned(), 0o700),
        (format!("mounts/{n}"), 0o700),
        (dir(n, "upper"), 0o755),
        (dir(n, "work"), 0o700),
    ];
    for i in 0..m.layers.len() {
        out.push((dir(n, &format!("l{i}")), 0o700));
    }
    out
}

/// Idmapped trees of the mounts' layers (root-run sandboxes), which PID 1 attaches.
pub(crate) fn trees(
    mounts: &[LayerMount],
    userns: &OwnedFd,
) -> Result<Vec<Vec<OwnedFd>>, crate::lifecycle::Error> {
    mounts
        .iter()
        .map(|m| {
            m.layers
                .iter()
                .map(|l| mounts::idmapped_tree(l, userns))
                .collect()
        })
        .collect()
}

/// PID 1's steps for the mounts, to run once the root overlay is at `merged` (before the
/// pivot): attach each layer tree, make the missing components of the path, mount.
pub(crate) fn steps(mounts: &[LayerMount], trees: &[Vec<OwnedFd>], durable: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    for (m, trees) in mounts
        .iter()
        .zip(trees.iter().map(Some).chain(std::iter::repeat(None)))
    {
        let n = m.slot;
        let lowers: Vec<String> = match trees {
            Some(trees) => {
                for (i, tree) in trees.iter().enumerate() {
                    steps.push(Step::Attach {
                        fd: tree.as_raw_fd(),
                        target: c(&dir(n, &format!("l{i}"))),
                    });
                }
                (0..trees.len()).map(|i| dir(n, &format!("l{i}"))).collect()
            }
            None => m
                .layers
                .iter()
                .map(|l| l.to_string_lossy().into_owned())
                .collect(),
        };
        let mut target = PathBuf::from("merged");
        for comp in m.path.components().skip(1) {
            target.push(comp);
            steps.push(Step::Mkdir {
                path: c(&target.to_string_lossy()),
                mode: 0o755,
            });
        }
        let data = crate::mounts::overlay_data(
            &lowers.join(":"),
            &dir(n, "upper"),
            &dir(n, "work"),
            durable,
        );
        steps.push(Step::Mount {
            source: Some(c("overlay")),
            target: c(&target.to_string_lossy()),
            fstype: Some(c("overlay")),
            flags: libc::MS_NODEV,
            data: Some(c(&data)),
        });
    }
    steps
}

/// Refuses mounts a launch could not make safely: bad paths, layers that are not
/// directories or whose paths a mount option cannot carry, paths through non-directories.
pub(crate) fn validate(
    mounts: &[LayerMount],
    rootfs: &Path,
    layers: &[PathBuf],
) -> Result<(), MountError> {
    let mut lowers = layers.to_vec();
    lowers.push(rootfs.to_owned());
    let mut slots = std::collections::HashSet::new();
    for m in mounts {
        if !slots.insert(m.slot) {
            return Err(MountError::SlotReused(m.slot));
        }
        check_layers(m)?;
        check_path(&lowers, &m.path)?;
    }
    Ok(())
}

/// Refuses a mount without layers, with layers that are not absolute directories a mount
/// option can carry, or a path with characters a mount option cannot carry (a persistent
/// sandbox mounts it again at its next start).
pub(crate) fn check_layers(m: &LayerMount) -> Result<(), MountError> {
    if m.layers.is_empty() {
        return Err(MountError::NoLayers(m.path.clone()));
    }
    for l in &m.layers {
        let bytes = l.as_os_str().as_encoded_bytes();
        if !l.is_absolute() || bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\' | 0)) {
            return Err(MountError::BadLayer(l.clone()));
        }
        if !l.is_dir() {
            return Err(MountError::LayerNotADirectory(l.clone()));
        }
    }
    let bytes = m.path.as_os_str().as_encoded_bytes();
    if bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\')) {
        return Err(MountError::Unquotable(m.path.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_through_the_layers() {
        let tmp = tempfile::tempdir().unwrap();
        let (top, image) = (tmp.path().join("top"), tmp.path().join("image"));
        fs::create_dir_all(image.join("srv/data")).unwrap();
        fs::create_dir_all(image.join("etc")).unwrap();
        fs::write(image.join("etc/passwd"), b"").unwrap();
        fs::create_dir_all(&top).unwrap();
        std::os::unix::fs::symlink("/etc", top.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", image.join("was-link")).unwrap();
        fs::create_dir_all(top.join("was-link")).unwrap();
        let lowers = [top, image];
        for ok in ["/srv/data", "/srv/new/deep", "/new", "/was-link/x"] {
            check_path(&lowers, Path::new(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["relative", "/", "/srv/../etc", "/.."] {
            assert!(
                matches!(
                    check_path(&lowers, Path::new(bad)),
                    Err(PathError::Invalid(_))
                ),
                "{bad}"
            );
        }
        for bad in ["/link", "/link/x", "/etc/passwd", "/etc/passwd/x"] {
            assert!(
                matches!(
                    check_path(&lowers, Path::new(bad)),
                    Err(PathError::NotADirectory(..))
                ),
                "{bad}"
            );
        }
    }
}
