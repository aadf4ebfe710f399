//! Directory snapshots (Modal's `snapshot_directory`): one directory of a running sandbox, as
//! the sandbox sees it (image, snapshot layers and its own writes merged), copied into a
//! layer whose root is that directory, so that it can be mounted at a path of another
//! sandbox.
//!
//! The copy reads the sandbox's own view through `/proc/<pid>/root`. The path is resolved
//! with `openat2(RESOLVE_IN_ROOT)`, so a symlink the sandbox planted resolves inside the
//! sandbox, never on the host; the walk below it never follows a symlink (the capture's own
//! rule) and runs while the sandbox is frozen, so nothing is swapped under it.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use super::guest_view::{self, GuestView};
use super::{Captured, Shift, capture_tree, capture_view};
use crate::state::State;

/// Why a directory cannot be captured.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// Relative, `/`, or with `.`/`..` components.
    #[error("Path {0:?} must be absolute, not `/`, without `.` or `..`")]
    Invalid(String),
    /// `/proc`, `/sys`, `/dev` or below, or a directory on a pseudo-filesystem.
    #[error("{0} is a pseudo-filesystem of the host's kernel, not files of the sandbox's")]
    Pseudo(String),
    /// The sandbox's own root could not read this directory or an entry below it.
    #[error("The sandbox cannot read {0}")]
    Unreadable(String),
    /// Nothing at the path in the sandbox.
    #[error("No such directory in the sandbox: {0}")]
    NotFound(String),
    /// Something other than a directory at the path.
    #[error("{0} is not a directory in the sandbox")]
    NotADirectory(String),
    /// The sandbox does not run.
    #[error("The sandbox does not run")]
    NotRunning,
    #[error(transparent)]
    State(#[from] crate::state::Error),
    #[error("Cannot open {1} in the sandbox")]
    Open(#[source] io::Error, String),
    #[error(transparent)]
    Capture(#[from] super::Error),
}

/// Copies directory `path` of the running sandbox in `state_dir` into `layers_dir/<digest>`.
/// The sandbox must be frozen.
pub fn capture_dir(state_dir: &Path, path: &str, layers_dir: &Path) -> Result<Captured, DirError> {
    relative(path)?;
    let st = State::load(state_dir)?.ok_or(DirError::NotRunning)?;
    if !st.is_alive() {
        return Err(DirError::NotRunning);
    }
    let shift = if st.rootless {
        Shift::Rootless(st.root_uid)
    } else {
        Shift::Block(st.root_uid)
    };
    // Rootless, the daemon reads as the user who is the sandbox's root already; as root it
    // reads only what the sandbox's root could.
    let view = match shift {
        Shift::Block(base) => Some(GuestView::new(base)),
        _ => None,
    };
    capture_below(
        Path::new(&format!("/proc/{}/root", st.pid)),
        path,
        layers_dir,
        shift,
        view,
    )
}

/// Copies directory `path` of the tree at `root` (a microVM's filesystem as the guest sees
/// it, assembled read-only on the host) into `layers_dir/<digest>`, owners as they are.
pub fn capture_dir_of_tree(
    root: &Path,
    path: &str,
    layers_dir: &Path,
) -> Result<Captured, DirError> {
    capture_below(root, path, layers_dir, Shift::Keep, None)
}

/// `path` resolved inside `root` (a link cannot lead out of it), copied with owners shifted.
fn capture_below(
    root: &Path,
    path: &str,
    layers_dir: &Path,
    shift: Shift,
    view: Option<GuestView>,
) -> Result<Captured, DirError> {
    let rel = relative(path)?;
    if guest_view::is_refused_path(path) {
        return Err(DirError::Pseudo(path.to_owned()));
    }
    let root = open(libc::AT_FDCWD, root, 0, libc::O_DIRECTORY)
        .map_err(|e| DirError::Open(e, "/".into()))?;
    let dir = open(
        root.as_raw_fd(),
        &rel,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
        0,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => DirError::NotFound(path.to_owned()),
        Some(libc::ENOTDIR) => DirError::NotADirectory(path.to_owned()),
        _ => DirError::Open(e, path.to_owned()),
    })?;
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| DirError::Open(e, path.to_owned()))?;
    if !meta.is_dir() {
        return Err(DirError::NotADirectory(path.to_owned()));
    }
    let src = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    // A link in the sandbox may lead to a pseudo-filesystem under another name.
    if guest_view::is_pseudo(&src).map_err(|e| DirError::Open(e, path.to_owned()))? {
        return Err(DirError::Pseudo(path.to_owned()));
    }
    let below = |rel: &Path| format!("{}/{}", path.trim_end_matches('/'), rel.display());
    let captured = match view {
        Some(view) => capture_view(&src, layers_dir, view, shift),
        None => capture_tree(&src, layers_dir, shift, None),
    }
    .map_err(|e| match e {
        super::Error::Unreadable(rel) if rel.as_os_str().is_empty() => {
            DirError::Unreadable(path.to_owned())
        }
        super::Error::Unreadable(rel) => DirError::Unreadable(below(&rel)),
        super::Error::Pseudo(rel) => DirError::Pseudo(below(&rel)),
        e => DirError::Capture(e),
    })?;
    drop(dir);
    Ok(captured)
}

/// `path` without its leading `/`, once it is a plain absolute path below `/`.
fn relative(path: &str) -> Result<PathBuf, DirError> {
    let invalid = || DirError::Invalid(path.to_owned());
    let p = Path::new(path);
    if !p.is_absolute() || path.contains('\0') || path.len() > 1024 {
        return Err(invalid());
    }
    let mut rel = PathBuf::new();
    for comp in p.components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(n) => rel.push(n),
            _ => return Err(invalid()),
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(invalid());
    }
    Ok(rel)
}

/// The kernel's `struct open_how` (libc's is `non_exhaustive`, so it cannot be built here).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dirfd, path, O_PATH | O_CLOEXEC | flags, resolve)`.
fn open(dirfd: i32, path: &Path, resolve: u64, flags: i32) -> io::Result<OwnedFd> {
    let p = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC | flags) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: a valid C path and an initialised `open_how` of the size passed; the returned
    // descriptor is owned here.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            p.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let fd = crate::conv::fd(fd)?;
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_plain_and_absolute() {
        assert_eq!(relative("/a/b").unwrap(), Path::new("a/b"));
        assert_eq!(relative("/a/b/").unwrap(), Path::new("a/b"));
        for bad in ["a", "/", "", "/a/../b", "/a/\0"] {
            assert!(matches!(relative(bad), Err(DirError::Invalid(_))), "{bad}");
        }
    }
}
