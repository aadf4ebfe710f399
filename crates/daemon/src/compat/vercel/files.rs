//! Files through the Vercel layer: `fs/read` (the bytes, 404 for a missing file, which the
//! SDK turns into `null`), `fs/write` (a gzipped tar extracted under the `x-cwd` directory)
//! and `fs/mkdir`, over the daemon's file service.
//!
//! The gzip is undone on a blocking thread as the body arrives and the plain tar goes on to
//! the agent's extraction (which skips entries that would land outside the directory), so a
//! write of any size moves in constant memory. What is written belongs to
//! [`runtime::USER`]; the tar header's mode is kept (the SDK's `writeFiles` `mode`).

use std::io::{self, Read};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use belljar_agent_proto::client::body_from_stream;
use belljar_api::MkdirRequest;
use bytes::Bytes;
use futures::TryStreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::error::{Result, VercelError};
use super::runtime;
use super::wire::PathRequest;
use crate::http::AppState;

/// The header that names the directory `fs/write` extracts under.
const CWD_HEADER: &str = "x-cwd";

/// A file's bytes.
pub async fn read(st: &AppState, id: &str, req: PathRequest) -> Result<Response> {
    let path = runtime::resolve(&req.path, req.cwd.as_deref())?;
    let (len, bytes) = st.sandboxes.read_file(id, &path).await?;
    let mut resp = (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(bytes),
    )
        .into_response();
    if let Some(len) = len {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, len.into());
    }
    Ok(resp)
}

/// Extracts a gzipped tar under the `x-cwd` directory (default `/`).
pub async fn write(st: &AppState, id: &str, headers: &HeaderMap, body: Body) -> Result<Response> {
    let dir = match headers.get(CWD_HEADER) {
        None => "/".to_owned(),
        Some(v) => {
            let v = v
                .to_str()
                .map_err(|_| VercelError::BadRequest("x-cwd: must be text".into()))?;
            if !v.starts_with('/') {
                return Err(VercelError::BadRequest("x-cwd: must be absolute".into()));
            }
            runtime::resolve(".", Some(v))?
        }
    };
    let bad_gzip = Arc::new(Mutex::new(None));
    let result = st
        .sandboxes
        .upload_tar_as(
            id,
            &dir,
            Some(runtime::USER),
            gunzip(body, bad_gzip.clone()),
        )
        .await;
    // A body that is not gzip breaks the stream to the agent mid-request, which on its own
    // would read as the agent's failure: say what was wrong instead.
    if let Some(why) = bad_gzip.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(VercelError::BadRequest(format!(
            "body: not a gzip stream ({why})"
        )));
    }
    result?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// Creates a directory (and its parents) owned by the sandbox's user.
pub async fn mkdir(st: &AppState, id: &str, req: PathRequest) -> Result<Response> {
    let path = runtime::resolve(&req.path, req.cwd.as_deref())?;
    st.sandboxes
        .mkdir_as(id, MkdirRequest { path }, Some(runtime::USER))
        .await?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// The body, decompressed as it arrives. A body that is not gzip ends the stream with an
/// error and leaves the reason in `bad_gzip`.
fn gunzip(
    body: Body,
    bad_gzip: Arc<Mutex<Option<String>>>,
) -> belljar_agent_proto::client::RequestBody {
    let compressed = StreamReader::new(body.into_data_stream().map_err(io::Error::other));
    let reader = SyncIoBridge::new(compressed);
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
    tokio::task::spawn_blocking(move || {
        let mut gz = flate2::read::GzDecoder::new(reader);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match gz.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    *bad_gzip.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                    let _ = tx.blocking_send(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("body: not a gzip stream ({e})"),
                    )));
                    break;
                }
            }
        }
    });
    body_from_stream(ReceiverStream::new(rx))
}
