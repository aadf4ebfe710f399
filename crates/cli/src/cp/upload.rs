//! Host to sandbox: a file is streamed as it is read, a directory as a tar stream built on a
//! blocking thread while the upload runs, so neither is held in memory.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use belljar_client::{Client, streamed};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::sync::oneshot;
use tokio_util::io::{ReaderStream, SyncIoBridge};

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
        let (tarball, builder) = tar_stream(from.to_path_buf(), None);
        let counted = pb.clone();
        let total = Arc::new(AtomicU64::new(0));
        let total2 = total.clone();
        let body = tarball.inspect(move |chunk| {
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

/// What a build context's tar leaves out: what its `.dockerignore` excludes, except the files
/// the daemon must read (the Dockerfile and the ignore file, by their paths in the context).
pub struct Selection {
    pub ignore: belljar_api::dockerignore::Ignore,
    pub always: Vec<String>,
}

impl Selection {
    /// Whether the entry at `path` (relative, `/`-separated) goes in the tar: a directory
    /// left out goes in all the same when something in it may be kept (the daemon removes
    /// it if nothing is), and then it is looked into.
    fn keeps(&self, path: &str, is_dir: bool) -> bool {
        if self.always.iter().any(|a| a == path) || !self.ignore.excludes(path) {
            return true;
        }
        let needed_inside = self.always.iter().any(|a| {
            a.strip_prefix(path)
                .is_some_and(|rest| rest.starts_with('/'))
        });
        is_dir && (needed_inside || self.ignore.may_keep_inside(path))
    }
}

/// Streams a tar of the contents of `dir` (entries relative to it), built on a blocking
/// thread while the upload reads it, with only what `selection` keeps. A failure ends the
/// stream with an error, so the upload fails rather than ending like a whole archive.
pub fn tar_stream(
    dir: PathBuf,
    selection: Option<Selection>,
) -> (
    impl Stream<Item = std::io::Result<Bytes>> + Send + Sync + 'static,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (reader, writer) = tokio::io::duplex(CHUNK);
    let (failed_tx, failed_rx) = oneshot::channel();
    let handle = tokio::task::spawn_blocking(move || {
        // The writer is dropped when `write_tar` returns, so the reader has seen all the
        // bytes before it looks for a failure.
        let result = write_tar(&dir, SyncIoBridge::new(writer), selection.as_ref());
        if let Err(e) = &result {
            let _ = failed_tx.send(std::io::Error::new(e.kind(), e.to_string()));
        }
        result
    });
    let failure = futures::stream::once(failed_rx)
        .filter_map(|failed| std::future::ready(failed.ok().map(Err)));
    (
        ReaderStream::with_capacity(reader, CHUNK).chain(failure),
        handle,
    )
}

/// Writes the tar of `dir` to `writer` in `CHUNK`-sized writes. A tree that cannot be read
/// ends the stream without the archive's end: the builder, dropped on an error, writes that
/// end into the buffer, which is then dropped unsent, so the sandbox never takes a partial
/// tree for a whole one.
fn write_tar<W: Write>(
    dir: &Path,
    writer: W,
    selection: Option<&Selection>,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(CHUNK, writer);
    let mut builder = tar::Builder::new(&mut out);
    builder.follow_symlinks(false);
    let built = append_children(&mut builder, dir, Path::new(""), selection)
        .and_then(|()| builder.finish());
    drop(builder);
    match built {
        Ok(()) => out.flush(),
        Err(e) => {
            drop(out.into_parts());
            Err(e)
        }
    }
}

/// Appends the entries of `dir` under `prefix`, in name order. Symlinks are written with
/// their target's bytes as they are: the `tar` crate's own helper renders a link to `/` as
/// `//`. Sockets, FIFOs and devices are skipped (reading a FIFO would block).
fn append_children<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    prefix: &Path,
    selection: Option<&Selection>,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = prefix.join(entry.file_name());
        let path = entry.path();
        let ft = entry.file_type()?;
        // A name that is not UTF-8 no pattern names; its parents were picked already.
        if let (Some(sel), Some(text)) = (selection, name.to_str())
            && !sel.keeps(text, ft.is_dir())
        {
            continue;
        }
        if ft.is_dir() {
            builder.append_dir(&name, &path)?;
            append_children(builder, &path, &name, selection)?;
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
    use futures::TryStreamExt;

    use super::*;

    #[test]
    fn a_tree_that_cannot_be_read_writes_no_end_of_archive() {
        let dir = tempfile::tempdir().unwrap();
        let mut tarball = Vec::new();
        write_tar(&dir.path().join("gone"), &mut tarball, None).unwrap_err();
        assert!(tarball.is_empty(), "{} bytes written", tarball.len());
    }

    #[tokio::test]
    async fn a_failed_tar_ends_its_stream_with_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let (tarball, builder) = tar_stream(dir.path().join("gone"), None);
        let chunks: Vec<std::io::Result<Bytes>> = tarball.collect().await;
        assert!(matches!(chunks.as_slice(), [Err(e)] if e.kind() == std::io::ErrorKind::NotFound));
        builder.await.unwrap().unwrap_err();
    }

    #[tokio::test]
    async fn a_tar_stream_carries_a_tree_larger_than_a_chunk() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("sub")).unwrap();
        std::fs::write(src.path().join("sub/big"), vec![7u8; CHUNK * 2 + 5]).unwrap();
        let (tarball, builder) = tar_stream(src.path().to_path_buf(), None);
        let chunks: Vec<Bytes> = tarball.try_collect().await.unwrap();
        builder.await.unwrap().unwrap();
        assert!(chunks.len() > 1);
        let tarball = chunks.concat();
        let out = tempfile::tempdir().unwrap();
        tar::Archive::new(&tarball[..]).unpack(out.path()).unwrap();
        assert_eq!(
            std::fs::read(out.path().join("sub/big")).unwrap(),
            vec![7u8; CHUNK * 2 + 5]
        );
    }

    #[test]
    fn tar_keeps_a_link_to_the_root_as_it_is() {
        let src = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/", src.path().join("root")).unwrap();
        std::fs::create_dir(src.path().join("d")).unwrap();
        std::os::unix::fs::symlink("../x", src.path().join("d/up")).unwrap();
        let mut tarball = Vec::new();
        write_tar(src.path(), &mut tarball, None).unwrap();
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
        write_tar(src.path(), &mut tarball, None).unwrap();
        let out = tempfile::tempdir().unwrap();
        tar::Archive::new(&tarball[..]).unpack(out.path()).unwrap();
        assert_eq!(
            std::fs::read(out.path().join("sub dir/ünï/a b.bin")).unwrap(),
            [0u8, 255, 10, 13]
        );
        assert_eq!(std::fs::read(out.path().join("empty")).unwrap(), b"");
    }

    #[test]
    fn a_context_leaves_out_what_its_ignore_file_excludes_but_what_the_daemon_reads() {
        let src = tempfile::tempdir().unwrap();
        for f in [
            "docker/app.Dockerfile",
            "docker/app.Dockerfile.dockerignore",
            "docker/other",
            "node_modules/dep/index.js",
            "src/main.rs",
            "vendor/keep.txt",
            "vendor/drop.txt",
        ] {
            let p = src.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f).unwrap();
        }
        let ignore = belljar_api::dockerignore::Ignore::parse(
            "docker\nnode_modules\nvendor\n!vendor/keep.txt\n",
        )
        .unwrap();
        let selection = Selection {
            ignore,
            always: vec![
                "docker/app.Dockerfile".into(),
                "docker/app.Dockerfile.dockerignore".into(),
            ],
        };
        let mut tarball = Vec::new();
        write_tar(src.path(), &mut tarball, Some(&selection)).unwrap();
        let mut names: Vec<String> = tar::Archive::new(&tarball[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "docker",
                "docker/app.Dockerfile",
                "docker/app.Dockerfile.dockerignore",
                "src",
                "src/main.rs",
                "vendor",
                "vendor/keep.txt",
            ]
        );
    }
}
