//! File operations on the sandbox's filesystem: streamed reads and writes in constant memory,
//! directories, metadata, removal, moves and whole trees as tar. Files and directories the API
//! creates belong to the requesting user (see `users::resolve`).

use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use belljar_agent_proto::{FileEntry, FileKind, MkdirRequest, MoveRequest, RemoveRequest};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::io::{ReaderStream, StreamReader, SyncIoBridge};

use crate::error::AgentError;
use crate::users;

/// Size of the chunks files and tar streams are read and sent in.
const CHUNK: usize = 64 * 1024;

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

/// Opens a file for a streamed read; returns its length and its bytes.
pub async fn read(
    path: &str,
) -> Result<(u64, impl Stream<Item = io::Result<Bytes>> + Send + 'static), AgentError> {
    let p = check_path(path)?;
    let file = tokio::fs::File::open(&p).await.map_err(err(&p))?;
    let meta = file.metadata().await.map_err(err(&p))?;
    if meta.is_dir() {
        return Err(AgentError::IsADirectory(path.to_owned()));
    }
    Ok((meta.len(), ReaderStream::with_capacity(file, CHUNK)))
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
    let tmp = parent.join(format!(
        ".{}.belljar-{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = async {
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .await
            .map_err(err(&p))?;
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
    if let Err(e) = result {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
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

/// A directory's entries, sorted by name.
pub async fn list(path: &str) -> Result<Vec<FileEntry>, AgentError> {
    let p = check_path(path)?;
    blocking(move || {
        let meta = std::fs::metadata(&p).map_err(err(&p))?;
        if !meta.is_dir() {
            return Err(AgentError::NotADirectory(p.display().to_string()));
        }
        let mut entries = Vec::new();
        for dirent in std::fs::read_dir(&p).map_err(err(&p))? {
            let dirent = dirent.map_err(err(&p))?;
            let child = dirent.path();
            // A file removed while listing is simply not listed.
            if let Ok(meta) = std::fs::symlink_metadata(&child) {
                entries.push(entry_from(&child, &meta));
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
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
    } else {
        std::fs::copy(from, to).map_err(err(to))?;
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

/// A `Write` that hands full chunks to an async receiver, so the `tar` crate (which is
/// synchronous) can run on a blocking thread and feed a response body.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

fn append_tree(builder: &mut tar::Builder<ChannelWriter>, root: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(root)?;
    if !meta.is_dir() {
        let name = root.file_name().map(PathBuf::from).unwrap_or_default();
        return builder.append_path_with_name(root, name);
    }
    let mut children: Vec<_> = std::fs::read_dir(root)?.collect::<Result<_, _>>()?;
    children.sort_by_key(|d| d.file_name());
    for child in children {
        let path = child.path();
        let name = PathBuf::from(child.file_name());
        let ft = child.file_type()?;
        if ft.is_dir() {
            builder.append_dir_all(&name, &path)?;
        } else if ft.is_file() || ft.is_symlink() {
            builder.append_path_with_name(&path, &name)?;
        }
        // Sockets, FIFOs and devices are not part of a file tree worth downloading.
    }
    Ok(())
}

/// The tree under `path` (its contents, not the directory itself; a file on its own) as a tar
/// stream, produced on a blocking thread as the client reads it.
pub async fn tar_download(
    path: &str,
) -> Result<impl Stream<Item = io::Result<Bytes>> + Send + 'static, AgentError> {
    let p = check_path(path)?;
    tokio::fs::symlink_metadata(&p).await.map_err(err(&p))?;
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        let result = append_tree(&mut builder, &p)
            .and_then(|()| builder.into_inner())
            .and_then(|mut w| w.flush());
        if let Err(e) = result {
            tracing::warn!(path = %p.display(), "tar download failed: {e}");
            let _ = tx.blocking_send(Err(e));
        }
    });
    Ok(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

/// Extracts the tar stream `body` under `path` (created if needed); entries that would land
/// outside `path` are skipped, and everything extracted belongs to the requesting user.
pub async fn tar_upload<S, E>(path: &str, user: Option<&str>, body: S) -> Result<(), AgentError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
{
    let p = check_path(path)?;
    let owner = owner(user)?;
    blocking({
        let p = p.clone();
        move || create_dirs(&p, 0o755, owner)
    })
    .await?;
    let body = body.map(|r| r.map_err(|e| io::Error::other(e.to_string())));
    let reader = SyncIoBridge::new(StreamReader::new(Box::pin(body)));
    blocking(move || {
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        archive.set_preserve_mtime(true);
        archive.set_overwrite(true);
        let bad = |e: io::Error| match e.kind() {
            io::ErrorKind::Other | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
                AgentError::BadRequest(format!("bad tar stream: {e}"))
            }
            _ => AgentError::io(e, &p.display().to_string()),
        };
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            let rel = entry.path().map_err(bad)?.into_owned();
            if entry.unpack_in(&p).map_err(bad)?
                && let Some((uid, gid)) = owner
            {
                let target = p.join(&rel);
                lchown(&target, Some(uid), Some(gid)).map_err(err(&target))?;
            }
        }
        Ok(())
    })
    .await
}
