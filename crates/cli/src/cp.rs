//! `belljar cp`: copies files and directory trees between the host and a sandbox (or between
//! two sandboxes), streamed in constant memory with a progress bar for files.
//!
//! Semantics follow `cp -r`: copying onto an existing directory puts the source inside it
//! under its own name; otherwise the destination is the new name. Directories travel as tar
//! streams through the daemon's tar endpoints.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use belljar_api::{FileEntry, FileKind, MkdirRequest};
use bytes::Bytes;
use futures::StreamExt;
use http::Method;
use http_body_util::BodyExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::io::ReaderStream;

use crate::client::{self, Client, ClientError};
use crate::query::with_query;

/// The chunk size of streamed transfers.
const CHUNK: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A local file could not be read or written.
    #[error("{path}: {source}")]
    Local {
        path: String,
        source: std::io::Error,
    },
    /// Both sides are local paths.
    #[error("One side of cp must be in a sandbox, written ID:/path")]
    BothLocal,
    /// The source is neither a file nor a directory.
    #[error("{0}: not a regular file or directory")]
    Unsupported(String),
    /// The download ended early or a tar stream was malformed.
    #[error("Transfer failed: {0}")]
    Transfer(String),
}

impl CopyError {
    pub fn code(&self) -> &str {
        match self {
            Self::Client(e) => e.code(),
            Self::Local { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                "not_found"
            }
            Self::Local { .. } => "io",
            Self::BothLocal | Self::Unsupported(_) => "bad_request",
            Self::Transfer(_) => "connection_lost",
        }
    }
}

fn local_err(path: &Path) -> impl FnOnce(std::io::Error) -> CopyError + '_ {
    move |source| CopyError::Local {
        path: path.display().to_string(),
        source,
    }
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Sandbox { id: String, path: String },
}

impl Location {
    /// `ID:/path` is in a sandbox (a relative path is under `/workspace`); anything else is
    /// local. Write `./a:b` for a local file whose name has a colon.
    pub fn parse(s: &str) -> Self {
        if let Some((id, path)) = s.split_once(':')
            && !id.is_empty()
            && !id.contains('/')
        {
            let path = if path.is_empty() {
                "/workspace".to_string()
            } else if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/workspace/{path}")
            };
            return Self::Sandbox {
                id: id.to_string(),
                path,
            };
        }
        Self::Local(PathBuf::from(s))
    }
}

/// What a copy moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// Where the copy ended up (a host path, or `ID:/path`).
    pub destination: String,
    /// Payload bytes (file contents or tar stream).
    pub bytes: u64,
    pub directory: bool,
}

/// Copies `src` to `dst`; `progress` shows a bar on stderr.
pub async fn copy(
    client: &Client,
    src: &Location,
    dst: &Location,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    match (src, dst) {
        (Location::Local(from), Location::Sandbox { id, path }) => {
            upload(client, from, id, path, progress).await
        }
        (Location::Sandbox { id, path }, Location::Local(to)) => {
            download(client, id, path, to, progress).await
        }
        (Location::Sandbox { id: a, path: pa }, Location::Sandbox { id: b, path: pb }) => {
            between(client, a, pa, b, pb, progress).await
        }
        (Location::Local(_), Location::Local(_)) => Err(CopyError::BothLocal),
    }
}

/// The last path component of a sandbox path.
fn remote_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("root")
}

fn remote_join(dir: &str, name: &str) -> String {
    format!("{}/{}", dir.trim_end_matches('/'), name)
}

/// Stat of a sandbox path, `None` when it does not exist.
pub async fn stat(client: &Client, id: &str, path: &str) -> Result<Option<FileEntry>, CopyError> {
    let url = with_query(
        &format!("/v1/sandboxes/{id}/files/stat"),
        &[("path", Some(path.to_string()))],
    );
    match client.get::<FileEntry>(&url).await {
        Ok(e) => Ok(Some(e)),
        Err(ClientError::Api { status: 404, .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Where a source named `name` lands when copied to sandbox path `dst`.
async fn remote_target(
    client: &Client,
    id: &str,
    dst: &str,
    name: &str,
) -> Result<String, CopyError> {
    if dst.ends_with('/') {
        return Ok(remote_join(dst, name));
    }
    match stat(client, id, dst).await? {
        Some(e) if e.kind == FileKind::Directory => Ok(remote_join(dst, name)),
        _ => Ok(dst.to_string()),
    }
}

/// Where a source named `name` lands when copied to host path `dst`.
fn local_target(dst: &Path, name: &str) -> PathBuf {
    if dst.is_dir() || dst.as_os_str().to_string_lossy().ends_with('/') {
        dst.join(name)
    } else {
        dst.to_path_buf()
    }
}

fn bar(progress: bool, len: Option<u64>, label: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = match len {
        Some(len) => ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    let style = match len {
        Some(_) => ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        ),
        None => ProgressStyle::with_template("{msg} {spinner} {bytes} {bytes_per_sec}"),
    };
    if let Ok(style) = style {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(label.to_string());
    pb
}

async fn upload(
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
        let mode = format!("{:o}", meta.permissions().mode() & 0o7777);
        let url = with_query(
            &format!("/v1/sandboxes/{id}/files"),
            &[("path", Some(target.clone())), ("mode", Some(mode))],
        );
        let result = client
            .request(
                Method::PUT,
                &url,
                client::streamed(body),
                Some("application/octet-stream"),
            )
            .await;
        pb.finish_and_clear();
        result?
            .into_body()
            .collect()
            .await
            .map_err(ClientError::from)?;
        Ok(CopyReport {
            destination: format!("{id}:{target}"),
            bytes: meta.len(),
            directory: false,
        })
    } else if meta.is_dir() {
        let _: FileEntry = client
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/files/mkdir"),
                &MkdirRequest {
                    path: target.clone(),
                },
            )
            .await?;
        let pb = bar(progress, None, &name);
        let (rx, builder) = tar_stream(from.to_path_buf());
        let counted = pb.clone();
        let total = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let total2 = total.clone();
        let body = tokio_stream_from(rx).inspect(move |chunk| {
            if let Ok(c) = chunk {
                counted.inc(c.len() as u64);
                total2.fetch_add(c.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let url = with_query(
            &format!("/v1/sandboxes/{id}/files/tar"),
            &[("path", Some(target.clone()))],
        );
        let result = client
            .call_no_content(
                Method::PUT,
                &url,
                client::streamed(body),
                Some("application/x-tar"),
            )
            .await;
        pb.finish_and_clear();
        let built = builder
            .await
            .map_err(|e| CopyError::Transfer(e.to_string()))?;
        result?;
        built.map_err(local_err(from))?;
        Ok(CopyReport {
            destination: format!("{id}:{target}"),
            bytes: total.load(std::sync::atomic::Ordering::Relaxed),
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
struct ChannelWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
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

/// A `Read` over chunks from the async side, for the tar unpacker.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

async fn download(
    client: &Client,
    id: &str,
    src: &str,
    dst: &Path,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    let entry = stat(client, id, src)
        .await?
        .ok_or_else(|| ClientError::Api {
            status: 404,
            code: "not_found".into(),
            message: format!("{id}:{src} does not exist"),
        })?;
    let target = local_target(dst, remote_name(src));
    match entry.kind {
        FileKind::File => {
            let url = with_query(
                &format!("/v1/sandboxes/{id}/files"),
                &[("path", Some(src.to_string()))],
            );
            let resp = client
                .request(Method::GET, &url, client::empty(), None)
                .await?;
            // A file whose size the sandbox's kernel does not know (`/proc`, `/sys`) comes
            // without a length and is read to its end.
            let len = resp
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let mut file = tokio::fs::File::create(&target)
                .await
                .map_err(local_err(&target))?;
            let pb = bar(progress, len, remote_name(src));
            let mut body = resp.into_body();
            let mut bytes = 0u64;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(ClientError::from)?;
                if let Ok(data) = frame.into_data() {
                    file.write_all(&data).await.map_err(local_err(&target))?;
                    bytes += data.len() as u64;
                    pb.inc(data.len() as u64);
                }
            }
            file.flush().await.map_err(local_err(&target))?;
            pb.finish_and_clear();
            let mode = entry.mode & 0o7777;
            if mode != 0 {
                let _ = tokio::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
                    .await;
            }
            if let Some(len) = len
                && bytes != len
            {
                return Err(CopyError::Transfer(format!(
                    "{id}:{src}: got {bytes} of {len} bytes"
                )));
            }
            Ok(CopyReport {
                destination: target.display().to_string(),
                bytes,
                directory: false,
            })
        }
        FileKind::Directory => {
            tokio::fs::create_dir_all(&target)
                .await
                .map_err(local_err(&target))?;
            let url = with_query(
                &format!("/v1/sandboxes/{id}/files/tar"),
                &[("path", Some(src.to_string()))],
            );
            let resp = client
                .request(Method::GET, &url, client::empty(), None)
                .await?;
            let (tx, rx) = mpsc::channel::<Bytes>(8);
            let unpack_to = target.clone();
            let unpacker = tokio::task::spawn_blocking(move || {
                let mut archive = tar::Archive::new(ChannelReader {
                    rx,
                    current: Bytes::new(),
                });
                archive.set_preserve_permissions(true);
                archive.unpack(&unpack_to)
            });
            let pb = bar(progress, None, remote_name(src));
            let mut body = resp.into_body();
            let mut bytes = 0u64;
            let mut failed = None;
            while let Some(frame) = body.frame().await {
                match frame {
                    Err(e) => {
                        failed = Some(ClientError::from(e));
                        break;
                    }
                    Ok(frame) => {
                        if let Ok(data) = frame.into_data() {
                            bytes += data.len() as u64;
                            pb.inc(data.len() as u64);
                            if tx.send(data).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
            drop(tx);
            pb.finish_and_clear();
            let unpacked = unpacker
                .await
                .map_err(|e| CopyError::Transfer(e.to_string()))?;
            if let Some(e) = failed {
                return Err(e.into());
            }
            unpacked.map_err(local_err(&target))?;
            Ok(CopyReport {
                destination: target.display().to_string(),
                bytes,
                directory: true,
            })
        }
        _ => Err(CopyError::Unsupported(format!("{id}:{src}"))),
    }
}

/// Sandbox to sandbox: the download's body becomes the upload's body, nothing is staged.
async fn between(
    client: &Client,
    from_id: &str,
    src: &str,
    to_id: &str,
    dst: &str,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    let entry = stat(client, from_id, src)
        .await?
        .ok_or_else(|| ClientError::Api {
            status: 404,
            code: "not_found".into(),
            message: format!("{from_id}:{src} does not exist"),
        })?;
    let target = remote_target(client, to_id, dst, remote_name(src)).await?;
    let (get, put, directory) = match entry.kind {
        FileKind::File => ("files", "files", false),
        FileKind::Directory => ("files/tar", "files/tar", true),
        _ => return Err(CopyError::Unsupported(format!("{from_id}:{src}"))),
    };
    if directory {
        let _: FileEntry = client
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{to_id}/files/mkdir"),
                &MkdirRequest {
                    path: target.clone(),
                },
            )
            .await?;
    }
    let resp = client
        .request(
            Method::GET,
            &with_query(
                &format!("/v1/sandboxes/{from_id}/{get}"),
                &[("path", Some(src.to_string()))],
            ),
            client::empty(),
            None,
        )
        .await?;
    let pb = bar(
        progress,
        (!directory).then_some(entry.size),
        remote_name(src),
    );
    let counted = pb.clone();
    let body = resp
        .into_body()
        .map_frame(move |f| {
            if let Some(d) = f.data_ref() {
                counted.inc(d.len() as u64);
            }
            f
        })
        .map_err(|e| Box::new(e) as client::BoxError)
        .boxed();
    let mode = format!("{:o}", entry.mode & 0o7777);
    let url = with_query(
        &format!("/v1/sandboxes/{to_id}/{put}"),
        &[
            ("path", Some(target.clone())),
            ("mode", (!directory).then_some(mode)),
        ],
    );
    let ct = if directory {
        "application/x-tar"
    } else {
        "application/octet-stream"
    };
    let result = client
        .call_no_content(Method::PUT, &url, body, Some(ct))
        .await;
    pb.finish_and_clear();
    result?;
    Ok(CopyReport {
        destination: format!("{to_id}:{target}"),
        bytes: pb.position(),
        directory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_locations() {
        assert_eq!(
            Location::parse("sbx_ab12:/tmp/x y"),
            Location::Sandbox {
                id: "sbx_ab12".into(),
                path: "/tmp/x y".into()
            }
        );
        assert_eq!(
            Location::parse("sbx_1:rel/f"),
            Location::Sandbox {
                id: "sbx_1".into(),
                path: "/workspace/rel/f".into()
            }
        );
        assert_eq!(
            Location::parse("sbx_1:"),
            Location::Sandbox {
                id: "sbx_1".into(),
                path: "/workspace".into()
            }
        );
        assert_eq!(
            Location::parse("./a:b"),
            Location::Local(PathBuf::from("./a:b"))
        );
        assert_eq!(
            Location::parse("/abs/file"),
            Location::Local(PathBuf::from("/abs/file"))
        );
    }

    #[test]
    fn remote_names_and_joins() {
        assert_eq!(remote_name("/a/b/c.txt"), "c.txt");
        assert_eq!(remote_name("/a/dir/"), "dir");
        assert_eq!(remote_name("/"), "root");
        assert_eq!(remote_join("/a/", "b"), "/a/b");
    }

    #[test]
    fn local_target_follows_cp_semantics() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(local_target(dir.path(), "f"), dir.path().join("f"));
        let new = dir.path().join("new");
        assert_eq!(local_target(&new, "f"), new);
    }

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

    #[tokio::test]
    async fn channel_reader_and_writer_carry_bytes_across_threads() {
        let (tx, mut rx) = mpsc::channel(2);
        let writer = tokio::task::spawn_blocking(move || {
            let mut w = ChannelWriter {
                tx,
                buf: Vec::new(),
            };
            w.write_all(&vec![7u8; CHUNK * 2 + 5]).unwrap();
            w.flush().unwrap();
        });
        let (tx2, rx2) = mpsc::channel(2);
        let reader = tokio::task::spawn_blocking(move || {
            let mut r = ChannelReader {
                rx: rx2,
                current: Bytes::new(),
            };
            let mut all = Vec::new();
            r.read_to_end(&mut all).unwrap();
            all
        });
        while let Some(chunk) = rx.recv().await {
            tx2.send(chunk.unwrap()).await.unwrap();
        }
        drop(tx2);
        writer.await.unwrap();
        let all = reader.await.unwrap();
        assert_eq!(all.len(), CHUNK * 2 + 5);
        assert!(all.iter().all(|&b| b == 7));
    }
}
