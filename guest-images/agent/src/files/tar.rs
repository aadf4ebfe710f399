//! Whole trees as tar streams, produced and consumed on blocking threads in constant memory.
//!
//! Downloads write each entry's header themselves rather than through the `tar` crate's
//! path helpers: those render a link to `/` as `//`, open FIFOs (which blocks) and write a
//! `/proc` file's bytes after a header that says 0, corrupting the stream. Uploads extract
//! into a staging directory next to the destination and move the entries into place only
//! when the whole stream was good, so a truncated upload leaves nothing behind.

use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, lchown};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::sync::oneshot;
use tokio_util::io::{ReaderStream, StreamReader, SyncIoBridge};

use super::{CHUNK, Owner, TMP_COUNTER, blocking, check_path, copy_tree, create_dirs, err, owner};
use crate::error::AgentError;

/// Reads exactly `left` bytes: what the file has, then zeros if it shrank, so the bytes after
/// a header always match the size the header announced.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// A header for `meta` with everything but the entry's name and size.
fn header(meta: &std::fs::Metadata, kind: tar::EntryType) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    header.set_entry_type(kind);
    header.set_size(0);
    header
}

/// A symlink entry whose link name is the target's bytes as they are.
fn append_symlink<W: Write>(
    builder: &mut tar::Builder<W>,
    name: &Path,
    target: &Path,
    meta: &std::fs::Metadata,
) -> io::Result<()> {
    let mut header = header(meta, tar::EntryType::Symlink);
    let bytes = target.as_os_str().as_bytes();
    let field = &mut header.as_old_mut().linkname;
    if bytes.len() <= field.len() {
        field.fill(0);
        field[..bytes.len()].copy_from_slice(bytes);
        builder.append_data(&mut header, name, io::empty())
    } else {
        // A long target goes in a GNU long-link record; only `/` itself is mangled there.
        builder.append_link(&mut header, name, target)
    }
}

/// Appends `path` under `name`: directories with their contents, regular files and symlinks.
/// Sockets, FIFOs and devices are not part of a file tree worth downloading, and neither is
/// what another filesystem mounts inside the tree (`/proc`, `/sys`, `/dev` under `/`), whose
/// files lie about their sizes and fail to read: like `tar --one-file-system`, a mount point
/// comes without its contents. `dev` is the device of the tree's root.
fn append_entry<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    name: &Path,
    dev: u64,
) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        append_symlink(builder, name, &std::fs::read_link(path)?, &meta)
    } else if ft.is_dir() {
        let mut header = header(&meta, tar::EntryType::Directory);
        builder.append_data(&mut header, name, io::empty())?;
        if meta.dev() != dev {
            return Ok(());
        }
        append_children(builder, path, Some(name), dev)
    } else if ft.is_file() {
        // Opened like a read through the API: a path swapped for a FIFO is skipped, not hung on.
        let Ok((file, _)) = super::open_regular(path) else {
            return Ok(());
        };
        let meta = file.metadata()?;
        let mut header = header(&meta, tar::EntryType::Regular);
        header.set_size(meta.len());
        let data = Exact {
            inner: file,
            left: meta.len(),
        };
        builder.append_data(&mut header, name, data)
    } else {
        Ok(())
    }
}

fn append_children<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    prefix: Option<&Path>,
    dev: u64,
) -> io::Result<()> {
    let mut children: Vec<_> = std::fs::read_dir(dir)?
        .map(|d| d.map(|d| d.file_name()))
        .collect::<Result<_, _>>()?;
    children.sort();
    for child in children {
        let name = match prefix {
            Some(prefix) => prefix.join(&child),
            None => PathBuf::from(&child),
        };
        match append_entry(builder, &dir.join(&child), &name, dev) {
            // Removed while the tree was walked: not part of it any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

fn append_tree<W: Write>(builder: &mut tar::Builder<W>, root: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(root)?;
    if meta.is_dir() {
        append_children(builder, root, None, meta.dev())
    } else {
        let name = root.file_name().map(PathBuf::from).unwrap_or_default();
        append_entry(builder, root, &name, meta.dev())
    }
}

/// Writes the tar stream of the tree under `root` to `writer`, in `CHUNK`-sized writes.
/// A tree that cannot be read ends the stream without the archive's end: the builder, dropped
/// on an error, writes that end into the buffer, which is then dropped unsent, so a client
/// never takes a partial tree for a whole one.
fn write_tree<W: Write>(root: &Path, writer: W) -> io::Result<()> {
    let mut out = io::BufWriter::with_capacity(CHUNK, writer);
    let mut builder = tar::Builder::new(&mut out);
    let built = append_tree(&mut builder, root).and_then(|()| builder.finish());
    drop(builder);
    match built {
        Ok(()) => out.flush(),
        Err(e) => {
            drop(out.into_parts());
            Err(e)
        }
    }
}

/// The tree under `path` (its contents, not the directory itself; a file on its own) as a tar
/// stream, produced on a blocking thread as the client reads it. A failure ends the stream
/// with an error, so the response is cut short rather than ending like a whole archive.
pub async fn tar_download(
    path: &str,
) -> Result<impl Stream<Item = io::Result<Bytes>> + Send + 'static, AgentError> {
    let p = check_path(path)?;
    tokio::fs::symlink_metadata(&p).await.map_err(err(&p))?;
    let (reader, writer) = tokio::io::duplex(CHUNK);
    let (failed_tx, failed_rx) = oneshot::channel();
    tokio::task::spawn_blocking(move || {
        // The writer is dropped when `write_tree` returns, so the reader has seen all the
        // bytes before it looks for a failure.
        if let Err(e) = write_tree(&p, SyncIoBridge::new(writer)) {
            tracing::warn!(path = %p.display(), "tar download failed: {e}");
            let _ = failed_tx.send(e);
        }
    });
    let failure = futures::stream::once(failed_rx)
        .filter_map(|failed| std::future::ready(failed.ok().map(Err)));
    Ok(ReaderStream::with_capacity(reader, CHUNK).chain(failure))
}

/// Extracts the tar stream `body` under `path` (created if needed); entries that would land
/// outside `path` are skipped, and everything extracted belongs to the requesting user.
/// Nothing appears under `path` unless the whole stream was read and extracted.
pub async fn tar_upload<S, E>(path: &str, user: Option<&str>, body: S) -> Result<(), AgentError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
{
    let p = check_path(path)?;
    let owner = owner(user)?;
    // Removed with all it holds if the upload ends early, even by this future being dropped
    // or the agent dying (see `pending`).
    let pending = super::pending::Pending::new(p.join(format!(
        ".belljar-upload-{}-{}.tmp",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    )));
    let staging = pending.path().to_owned();
    blocking({
        let (p, staging) = (p.clone(), staging.clone());
        move || {
            create_dirs(&p, 0o755, owner)?;
            std::fs::create_dir(&staging).map_err(err(&p))
        }
    })
    .await?;
    let body = body.map(|r| r.map_err(|e| io::Error::other(e.to_string())));
    let reader = SyncIoBridge::new(StreamReader::new(Box::pin(body)));
    blocking(move || {
        let result = extract(reader, &staging, owner).and_then(|()| merge(&staging, &p));
        // The guard removes the staging (here, on a blocking thread) and its journal entry.
        drop(pending);
        result
    })
    .await
}

fn extract(reader: impl Read, staging: &Path, owner: Owner) -> Result<(), AgentError> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(true);
    let bad = |e: io::Error| match e.kind() {
        io::ErrorKind::Other | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
            AgentError::BadRequest(format!("bad tar stream: {e}"))
        }
        _ => AgentError::io(e, &staging.display().to_string()),
    };
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let rel = entry.path().map_err(bad)?.into_owned();
        if entry.unpack_in(staging).map_err(bad)?
            && let Some((uid, gid)) = owner
        {
            let target = unpacked_path(staging, &rel);
            lchown(&target, Some(uid), Some(gid)).map_err(err(&target))?;
        }
    }
    Ok(())
}

/// Where `unpack_in` put an entry named `rel`: its plain components under `dir`, the way the
/// tar crate drops a leading `/` and `.` (entries with `..` are not unpacked at all). Never
/// `dir.join(rel)`, which for an absolute name is the name itself, outside `dir`.
fn unpacked_path(dir: &Path, rel: &Path) -> PathBuf {
    let mut target = dir.to_path_buf();
    target.extend(rel.components().filter_map(|c| match c {
        Component::Normal(part) => Some(part),
        _ => None,
    }));
    target
}

/// Moves everything in `from` into `to`: into existing directories (never through a
/// symlink, which is replaced instead), over anything else.
fn merge(from: &Path, to: &Path) -> Result<(), AgentError> {
    for dirent in std::fs::read_dir(from).map_err(err(from))? {
        let name = dirent.map_err(err(from))?.file_name();
        let (src, dst) = (from.join(&name), to.join(&name));
        let src_dir = std::fs::symlink_metadata(&src).map_err(err(&src))?.is_dir();
        match std::fs::symlink_metadata(&dst) {
            Ok(m) if m.is_dir() && src_dir => {
                merge(&src, &dst)?;
                continue;
            }
            Ok(m) if m.is_dir() => return Err(AgentError::IsADirectory(dst.display().to_string())),
            // rename(2) replaces a file with a file but not with a directory.
            Ok(_) if src_dir => std::fs::remove_file(&dst).map_err(err(&dst))?,
            _ => {}
        }
        match std::fs::rename(&src, &dst) {
            Ok(()) => {}
            // A mount point under the destination: copy across it.
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy_tree(&src, &dst)?,
            Err(e) => return Err(err(&dst)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt;

    use super::*;

    #[test]
    fn a_tree_that_cannot_be_read_writes_no_end_of_archive() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        write_tree(&dir.path().join("gone"), &mut out).unwrap_err();
        assert!(out.is_empty(), "{} bytes written", out.len());
    }

    #[tokio::test]
    async fn a_download_streams_the_whole_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        // Larger than one chunk, so the stream carries several.
        std::fs::write(dir.path().join("sub/big"), vec![7u8; CHUNK * 2 + 5]).unwrap();
        let chunks: Vec<Bytes> = tar_download(dir.path().to_str().unwrap())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert!(chunks.len() > 1);
        let tarball = chunks.concat();
        let out = tempfile::tempdir().unwrap();
        tar::Archive::new(&tarball[..]).unpack(out.path()).unwrap();
        assert_eq!(
            std::fs::read(out.path().join("sub/big")).unwrap(),
            vec![7u8; CHUNK * 2 + 5]
        );
    }
}
