//! Sandbox to host: a file is written as its bytes arrive, a directory's tar stream is
//! unpacked on a blocking thread as it arrives.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use belljar_api::FileKind;
use belljar_client::Client;
use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::{CopyError, CopyReport, bar, local_err, local_target, remote_name, source_entry};

/// A `Read` over chunks from the async side, for the tar unpacker.
pub(super) struct ChannelReader {
    pub(super) rx: mpsc::Receiver<Bytes>,
    pub(super) current: Bytes,
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

pub(super) async fn download(
    client: &Client,
    id: &str,
    src: &str,
    dst: &Path,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    let entry = source_entry(client, id, src).await?;
    let target = local_target(dst, remote_name(src));
    match entry.kind {
        FileKind::File => {
            let mut download = client.read_file(id, src).await?;
            // A file whose size the sandbox's kernel does not know (`/proc`, `/sys`) comes
            // without a length and is read to its end.
            let len = download.content_length();
            let mut file = tokio::fs::File::create(&target)
                .await
                .map_err(local_err(&target))?;
            let pb = bar(progress, len, remote_name(src));
            let mut bytes = 0u64;
            while let Some(data) = download.chunk().await? {
                file.write_all(&data).await.map_err(local_err(&target))?;
                bytes += data.len() as u64;
                pb.inc(data.len() as u64);
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
            let mut download = client.download_tar(id, src).await?;
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
            let mut bytes = 0u64;
            let mut failed = None;
            loop {
                match download.chunk().await {
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(data)) => {
                        bytes += data.len() as u64;
                        pb.inc(data.len() as u64);
                        if tx.send(data).await.is_err() {
                            break;
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::super::CHUNK;
    use super::super::upload::ChannelWriter;
    use super::*;

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
