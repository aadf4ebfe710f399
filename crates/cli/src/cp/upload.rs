//! Host to sandbox: a file is streamed as it is read, a directory as a tar stream built on a
//! blocking thread while the upload runs, so neither is held in memory.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use belljar_client::{Client, streamed};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::io::ReaderStream;

use super::{CHUNK, CopyError, CopyReport, bar, local_err, remote_target};

pub(super) async fn upload(
    client: &Client,
    from: &Path,
    id: &str,
    dst: &str,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    let meta = tokio::fs::metadata(from).await.map_err(local_err(from))?;
    let name = from
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".to_string());
    let target = remote_target(client, id, dst, &name).await?;
    if meta.is_file() {
        let file = tokio::fs::File::open(from).await.map_err(local_err(from))?;
        let pb = bar(progress, Some(meta.len()), &name);
        let counted = pb.clone();
        let body = ReaderStream::with_capacity(file, CHUNK).inspect(move |chunk| {
            if let Ok(c) = chunk {
                counted.inc(c.len() as u64);
            }
        });
        let mode = meta.permissions().mode() & 0o7777;
        let result = client
            .write_file(id, &target, Some(mode), streamed(body))
            .await;
        pb.finish_and_clear();
        result?;
        Ok(CopyReport {
            destination: format!("{id}:{target}"),
            bytes: meta.len(),
            directory: false,
        })
    } else if meta.is_dir() {
        client.mkdir(id, &target).await?;
        let pb = bar(progress, None, &name);
        let (rx, builder) = tar_stream(from.to_path_buf());
        let counted = pb.clone();
        let total = Arc::new(AtomicU64::new(0));
        let total2 = total.clone();
        let body = tokio_stream_from(rx).inspect(move |chunk| {
            if let Ok(c) = chunk {
                counted.inc(c.len() as u64);
                total2.fetch_add(c.len() as u64, Ordering::Relaxed);
            }
        });
        let result = client.upload_tar(id, &target, streamed(body)).await;
        pb.finish_and_clear();
        let built = builder
            .await
            .map_err(|e| CopyError::Transfer(e.to_string()))?;
        result?;
        built.map_err(local_err(from))?;
        Ok(CopyReport {
            destination: format!("{id}:{target}"),
            bytes: total.load(Ordering::Relaxed),
            directory: true,
        })
    } else {
        Err(CopyError::Unsupported(from.display().to_string()))
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<std::io::Result<Bytes>>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + Sync + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A `Write` that hands each chunk to the async side.
pub(super) struct ChannelWriter {
    pub(super) tx: mpsc::Sender<std::io::Result<Bytes>>,
    pub(super) buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload ended"))
    }
}

/// Streams a tar of the contents of `dir` (entries relative to it) from a blocking thread.
fn tar_stream(
    dir: PathBuf,
) -> (
    mpsc::Receiver<std::io::Result<Bytes>>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (tx, rx) = mpsc::channel(8);
    let handle = tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let result = write_tar(&dir, writer);
        if let Err(e) = &result {
            let _ = tx.blocking_send(Err(std::io::Error::new(e.kind(), e.to_string())));
        }
        result
    });
    (rx, handle)
}

fn write_tar<W: Write>(dir: &Path, writer: W) -> std::io::Result<()> {
    let mut builder = tar::Builder::new(writer);
    builder.follow_symlinks(false);
    append_children(&mut builder, dir, Path::new(""))?;
    let mut writer = builder.into_inner()?;
    writer.flush()
}

/// Appends the entries of `dir` under `prefix`, in name order. Symlinks are written with
/// their target's bytes as they are: the `tar` crate's own helper renders a link to `/` as
/// `//`. Sockets, FIFOs and devices are skipped (reading a FIFO would block).
fn append_children<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    prefix: &Path,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = prefix.join(entry.file_name());
        let path = entry.path();
        let ft = entry.file_type()?;
        if ft.is_dir() {
            builder.append_dir(&name, &path)?;
            append_children(builder, &path, &name)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&path)?;
            let mut header = tar::Header::new_gnu();
            header.set_metadata(&std::fs::symlink_metadata(&path)?);
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            let bytes = target.as_os_str().as_bytes();
            let field = &mut header.as_old_mut().linkname;
            if bytes.len() <= field.len() {
                field[..bytes.len()].copy_from_slice(bytes);
                builder.append_data(&mut header, &name, std::io::empty())?;
            } else {
                builder.append_link(&mut header, &name, &target)?;
            }
        } else if ft.is_file() {
            builder.append_path_with_name(&path, &name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_keeps_a_link_to_the_root_as_it_is() {
        let src = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", src.path().join("root")).unwrap();
        std::fs::create_dir(src.path().join("d")).unwrap();
        std::os::unix::fs::symlink("../x", src.path().join("d/up")).unwrap();
        let mut tarball = Vec::new();
        write_tar(src.path(), &mut tarball).unwrap();
        let mut links = Vec::new();
        for entry in tar::Archive::new(&tarball[..]).entries().unwrap() {
            let entry = entry.unwrap();
            if let Some(target) = entry.link_name_bytes() {
                links.push((
                    entry.path().unwrap().display().to_string(),
                    String::from_utf8(target.into_owned()).unwrap(),
                ));
            }
        }
        assert_eq!(
            links,
            [
                ("d/up".to_owned(), "../x".to_owned()),
                ("root".to_owned(), "/".to_owned())
            ]
        );
    }

    #[test]
    fn tar_round_trip_keeps_names_and_bytes() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("sub dir/ünï")).unwrap();
        std::fs::write(src.path().join("sub dir/ünï/a b.bin"), [0u8, 255, 10, 13]).unwrap();
        std::fs::write(src.path().join("empty"), b"").unwrap();
        let mut tarball = Vec::new();
        write_tar(src.path(), &mut tarball).unwrap();
        let out = tempfile::tempdir().unwrap();
        tar::Archive::new(&tarball[..]).unpack(out.path()).unwrap();
        assert_eq!(
            std::fs::read(out.path().join("sub dir/ünï/a b.bin")).unwrap(),
            [0u8, 255, 10, 13]
        );
        assert_eq!(std::fs::read(out.path().join("empty")).unwrap(), b"");
    }
}
