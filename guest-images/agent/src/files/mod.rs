//! File operations on the sandbox's filesystem: streamed reads and writes in constant memory,
//! directories, metadata, removal, moves and whole trees as tar. Files and directories the API
//! creates belong to the requesting user (see `users::resolve`).
//!
//! Only regular files are read: a FIFO would block a thread forever and a device has no end,
//! so both are refused before they are opened for reading (and checked again on the opened
//! descriptor, in case the path was swapped in between).

mod list;
pub mod pending;
mod tar;

pub use list::{list, parse_limit};
pub use tar::{tar_download, tar_upload};

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, lchown};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use belljar_agent_proto::{FileEntry, FileKind, MkdirRequest, MoveRequest, RemoveRequest};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use crate::error::AgentError;
use crate::users;

/// Size of the chunks tar streams are read and sent in.
const CHUNK: usize = 64 * 1024;

/// Size of a file's reads and writes: each is one trip to a blocking thread, so small ones
/// bound a transfer by the trips (64 KiB chunks held uploads near 200 MB/s), and a write of
/// this size runs on its thread while the next one's bytes arrive.
const FILE_IO: usize = 1 << 20;

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

type Owner = Option<(u32, u32)>;

/// The uid and gid that new files get: the requested user's when the agent is root, else
/// none (files belong to the agent's own user).
pub fn owner(user: Option<&str>) -> Result<Owner, AgentError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = users::resolve(user)?;
    Ok(Some((user.uid, user.gid)))
}

/// Checks that `path` is absolute and has no NUL.
pub fn check_path(path: &str) -> Result<PathBuf, AgentError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AgentError::InvalidPath(path.to_owned()));
    }
    Ok(PathBuf::from(path))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AgentError::Internal(e.to_string()))?
}

fn err(path: &Path) -> impl Fn(io::Error) -> AgentError + '_ {
    move |e| AgentError::io(e, &path.display().to_string())
}

fn entry_from(path: &Path, meta: &std::fs::Metadata) -> FileEntry {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let link_target = if ft.is_symlink() {
        std::fs::read_link(path)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    FileEntry {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.to_string_lossy().into_owned(),
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
        link_target,
    }
}

fn stat_sync(path: &Path) -> Result<FileEntry, AgentError> {
    let meta = std::fs::symlink_metadata(path).map_err(err(path))?;
    Ok(entry_from(path, &meta))
}

/// Creates `dir` and its missing parents (mode 0755, or `mode` for `dir` itself), owned by
/// `owner`. An existing directory is fine; an existing non-directory is `exists` for `dir`
/// and `not_a_directory` for a parent.
fn create_dirs(dir: &Path, mode: u32, owner: Owner) -> Result<(), AgentError> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(p) = cur {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => break,
            Ok(_) if p == dir => return Err(AgentError::Exists(p.display().to_string())),
            Ok(_) => return Err(AgentError::NotADirectory(p.display().to_string())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(p),
            Err(e) => return Err(err(p)(e)),
        }
        cur = p.parent();
    }
    for p in missing.into_iter().rev() {
        match std::fs::create_dir(p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && p.is_dir() => continue,
            Err(e) => return Err(err(p)(e)),
        }
        let m = if p == dir { mode } else { 0o755 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).map_err(err(p))?;
        if let Some((uid, gid)) = owner {
            lchown(p, Some(uid), Some(gid)).map_err(err(p))?;
        }
    }
    Ok(())
}

/// Filesystems whose files' sizes say nothing about their contents (`/proc` files are 0 bytes,
/// `/sys` files 4096): their files are read until their end, with no length announced.
const SIZELESS_FILESYSTEMS: [libc::c_long; 6] = [
    libc::PROC_SUPER_MAGIC,
    libc::SYSFS_MAGIC,
    libc::DEBUGFS_MAGIC,
    libc::SECURITYFS_MAGIC,
    libc::CGROUP_SUPER_MAGIC,
    libc::CGROUP2_SUPER_MAGIC,
];

/// Refuses what is not a regular file: a directory as `is_a_directory`, anything else
/// (FIFO, socket, device) as `not_a_regular_file`.
fn require_regular(meta: &std::fs::Metadata, path: &Path) -> Result<(), AgentError> {
    let ft = meta.file_type();
    if ft.is_file() {
        Ok(())
    } else if ft.is_dir() {
        Err(AgentError::IsADirectory(path.display().to_string()))
    } else {
        Err(AgentError::NotARegularFile(path.display().to_string()))
    }
}

/// Opens a regular file for reading without ever blocking on a FIFO or opening a device, and
/// returns it with its length when that length can be trusted.
pub(crate) fn open_regular(path: &Path) -> Result<(std::fs::File, Option<u64>), AgentError> {
    // The path is checked first so that a device is never opened (opening one can have
    // effects); the descriptor is checked again because the path may change in between.
    require_regular(&std::fs::metadata(path).map_err(err(path))?, path)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(err(path))?;
    let meta = file.metadata().map_err(err(path))?;
    require_regular(&meta, path)?;
    nix::fcntl::fcntl(
        file.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
    )
    .map_err(|e| err(path)(e.into()))?;
    let sizeless = nix::sys::statfs::fstatfs(&file)
        .map(|fs| SIZELESS_FILESYSTEMS.contains(&(fs.filesystem_type().0 as libc::c_long)))
        .unwrap_or(true);
    let len = (!sizeless && meta.len() > 0).then_some(meta.len());
    Ok((file, len))
}

/// Opens a regular file for a streamed read; returns its length (when known) and its bytes.
/// A known length is also the most that is sent, so a file that grows while it is read still
/// matches the `content-length` announced.
pub async fn read(
    path: &str,
) -> Result<
    (
        Option<u64>,
        impl Stream<Item = io::Result<Bytes>> + Send + 'static,
    ),
    AgentError,
> {
    let p = check_path(path)?;
    let (file, len) = blocking(move || open_regular(&p)).await?;
    let mut file = tokio::fs::File::from_std(file);
    file.set_max_buf_size(FILE_IO);
    let reader = file.take(len.unwrap_or(u64::MAX));
    Ok((len, ReaderStream::with_capacity(reader, FILE_IO)))
}

/// Streams `body` into `path` through a temporary file renamed into place, so that readers
/// never see a half-written file. Parents are created; an existing file keeps its mode unless
/// `mode` is given (0644 for a new file).
pub async fn write<S, E>(
    path: &str,
    mode: Option<u32>,
    user: Option<&str>,
    body: S,
) -> Result<FileEntry, AgentError>
where
    S: Stream<Item = Result<Bytes, E>> + Send,
    E: std::fmt::Display,
{
    let p = check_path(path)?;
    let owner = owner(user)?;
    let existing_mode = match tokio::fs::metadata(&p).await {
        Ok(m) if m.is_dir() => return Err(AgentError::IsADirectory(path.to_owned())),
        Ok(m) => Some(m.mode() & 0o7777),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(err(&p)(e)),
    };
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(AgentError::InvalidPath(path.to_owned()));
    };
    let parent = parent.to_owned();
    blocking({
        let parent = parent.clone();
        move || create_dirs(&parent, 0o755, owner)
    })
    .await?;
    // Removed if the upload ends before its rename, even by this future being dropped.
    let pending = pending::Pending::new(parent.join(format!(
        ".{}.belljar-{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    )));
    let tmp = pending.path().to_owned();
    let result = async {
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .await
            .map_err(err(&p))?;
        file.set_max_buf_size(FILE_IO);
        let mut file = tokio::io::BufWriter::with_capacity(FILE_IO, file);
        let mut body = std::pin::pin!(body);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| AgentError::BadRequest(format!("upload failed: {e}")))?;
            file.write_all(&chunk).await.map_err(err(&p))?;
        }
        file.flush().await.map_err(err(&p))?;
        drop(file);
        let mode = mode.or(existing_mode).unwrap_or(0o644);
        tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
            .await
            .map_err(err(&p))?;
        if let Some((uid, gid)) = owner {
            lchown(&tmp, Some(uid), Some(gid)).map_err(err(&p))?;
        }
        tokio::fs::rename(&tmp, &p).await.map_err(err(&p))
    }
    .await;
    match result {
        Ok(()) => pending.finish(),
        Err(e) => {
            drop(pending);
            return Err(e);
        }
    }
    blocking(move || stat_sync(&p)).await
}

/// `mkdir` (with parents unless `parents` is false).
pub async fn mkdir(req: MkdirRequest) -> Result<FileEntry, AgentError> {
    let p = check_path(&req.path)?;
    let owner = owner(req.user.as_deref())?;
    let mode = req.mode.unwrap_or(0o755);
    blocking(move || {
        if req.parents {
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => return stat_sync(&p),
                _ => create_dirs(&p, mode, owner)?,
            }
        } else {
            std::fs::create_dir(&p).map_err(err(&p))?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).map_err(err(&p))?;
            if let Some((uid, gid)) = owner {
                lchown(&p, Some(uid), Some(gid)).map_err(err(&p))?;
            }
        }
        stat_sync(&p)
    })
    .await
}

/// Metadata of `path` itself (a symlink is reported as one).
pub async fn stat(path: &str) -> Result<FileEntry, AgentError> {
    let p = check_path(path)?;
    blocking(move || stat_sync(&p)).await
}

/// Removes a file or a directory (`recursive` for a non-empty one). `/` is refused.
pub async fn remove(req: RemoveRequest) -> Result<(), AgentError> {
    let p = check_path(&req.path)?;
    if p.parent().is_none() {
        return Err(AgentError::PermissionDenied("/".into()));
    }
    blocking(move || {
        let meta = std::fs::symlink_metadata(&p).map_err(err(&p))?;
        let result = if !meta.is_dir() {
            std::fs::remove_file(&p)
        } else if req.recursive {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_dir(&p)
        };
        result.map_err(err(&p))
    })
    .await
}

/// Renames `from` to `to`, copying across filesystems (overlayfs refuses to rename
/// directories of the image) when a rename is not possible.
pub async fn move_path(req: MoveRequest) -> Result<FileEntry, AgentError> {
    let from = check_path(&req.from)?;
    let to = check_path(&req.to)?;
    for p in [&from, &to] {
        if p.parent().is_none() {
            return Err(AgentError::InvalidPath(format!(
                "{}: the root directory cannot be moved or replaced",
                p.display()
            )));
        }
    }
    blocking(move || {
        std::fs::symlink_metadata(&from).map_err(err(&from))?;
        if std::fs::symlink_metadata(&to).is_ok() && !req.overwrite {
            return Err(AgentError::Exists(to.display().to_string()));
        }
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                copy_tree(&from, &to)?;
                let meta = std::fs::symlink_metadata(&from).map_err(err(&from))?;
                if meta.is_dir() {
                    std::fs::remove_dir_all(&from).map_err(err(&from))?;
                } else {
                    std::fs::remove_file(&from).map_err(err(&from))?;
                }
            }
            Err(e) => return Err(err(&to)(e)),
        }
        stat_sync(&to)
    })
    .await
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), AgentError> {
    let meta = std::fs::symlink_metadata(from).map_err(err(from))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(from).map_err(err(from))?;
        std::os::unix::fs::symlink(target, to).map_err(err(to))?;
    } else if ft.is_dir() {
        match std::fs::create_dir(to) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && to.is_dir() => {}
            Err(e) => return Err(err(to)(e)),
        }
        for dirent in std::fs::read_dir(from).map_err(err(from))? {
            let dirent = dirent.map_err(err(from))?;
            copy_tree(&dirent.path(), &to.join(dirent.file_name()))?;
        }
    } else if ft.is_file() {
        std::fs::copy(from, to).map_err(err(to))?;
    } else {
        // A FIFO, socket or device is made anew: copying its "contents" would block or never end.
        let kind = nix::sys::stat::SFlag::from_bits_truncate(meta.mode() & libc::S_IFMT);
        let perm = nix::sys::stat::Mode::from_bits_truncate(meta.mode() & 0o7777);
        nix::sys::stat::mknod(to, kind, perm, meta.rdev())
            .map_err(|e| err(to)(io::Error::from(e)))?;
    }
    if !ft.is_symlink() {
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(err(to))?;
    }
    if nix::unistd::geteuid().is_root() {
        lchown(to, Some(meta.uid()), Some(meta.gid())).map_err(err(to))?;
    }
    Ok(())
}
