//! Sandbox to host: a file is written as its bytes arrive, a directory's tar stream is
//! unpacked on a blocking thread as it arrives.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use belljar_api::FileKind;
use belljar_client::Client;
use tokio::io::AsyncWriteExt;
use tokio_util::io::SyncIoBridge;

use super::{
    CHUNK, CopyError, CopyReport, bar, local_err, local_target, remote_name, source_entry,
};

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
            // The chunks are written into a pipe that the unpacker, on a blocking thread,
            // reads as they arrive.
            let (mut tx, rx) = tokio::io::duplex(CHUNK);
            let unpack_to = target.clone();
            let unpacker = tokio::task::spawn_blocking(move || {
                let mut archive = tar::Archive::new(SyncIoBridge::new(rx));
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
                        // An error here means the unpacker stopped: its own error says why.
                        if tx.write_all(&data).await.is_err() {
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
