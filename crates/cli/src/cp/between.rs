//! Sandbox to sandbox: the download's body becomes the upload's body, so nothing is staged
//! on the host.

use belljar_api::FileKind;
use belljar_client::{BoxError, Client};
use http_body_util::BodyExt;

use super::{CopyError, CopyReport, bar, remote_name, remote_target, source_entry};

/// Sandbox to sandbox: the download's body becomes the upload's body, nothing is staged.
pub(super) async fn between(
    client: &Client,
    from_id: &str,
    src: &str,
    to_id: &str,
    dst: &str,
    progress: bool,
) -> Result<CopyReport, CopyError> {
    let entry = source_entry(client, from_id, src).await?;
    let target = remote_target(client, to_id, dst, remote_name(src)).await?;
    let directory = match entry.kind {
        FileKind::File => false,
        FileKind::Directory => true,
        _ => return Err(CopyError::Unsupported(format!("{from_id}:{src}"))),
    };
    if directory {
        client.mkdir(to_id, &target).await?;
    }
    let download = if directory {
        client.download_tar(from_id, src).await?
    } else {
        client.read_file(from_id, src).await?
    };
    let pb = bar(
        progress,
        (!directory).then_some(entry.size),
        remote_name(src),
    );
    let counted = pb.clone();
    let body = download
        .into_body()
        .map_frame(move |f| {
            if let Some(d) = f.data_ref() {
                counted.inc(d.len() as u64);
            }
            f
        })
        .map_err(|e| Box::new(e) as BoxError)
        .boxed();
    let result = if directory {
        client.upload_tar(to_id, &target, body).await
    } else {
        let mode = entry.mode & 0o7777;
        client
            .write_file(to_id, &target, Some(mode), body)
            .await
            .map(drop)
    };
    pb.finish_and_clear();
    result?;
    Ok(CopyReport {
        destination: format!("{to_id}:{target}"),
        bytes: pb.position(),
        directory,
    })
}
