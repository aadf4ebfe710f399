//! `/v1/sandboxes/{id}/files`: read and write (streamed), list, stat, mkdir, remove, move,
//! tar down and up, watch (NDJSON or WebSocket) and thumbnails.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use belljar_api::{FileEntry, FileList, Invalid, MkdirRequest, MoveRequest, Validate, WatchEvent};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{Errors, RawBytes, SandboxPath};
use super::stream::{forward_body, ndjson, wants_websocket};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(read, write, remove))
        .routes(routes!(list))
        .routes(routes!(stat))
        .routes(routes!(mkdir))
        .routes(routes!(move_path))
        .routes(routes!(tar_down, tar_up))
        .routes(routes!(watch))
        .routes(routes!(thumbnail))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct PathQuery {
    /// An absolute path inside the sandbox.
    #[param(min_length = 1, max_length = 4096, pattern = "^/")]
    path: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// A directory inside the sandbox.
    #[param(min_length = 1, max_length = 4096, pattern = "^/")]
    path: String,
    /// Entries in this page, 1..=5000, default 1000.
    #[serde(default)]
    #[param(minimum = 1, maximum = 5000)]
    limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    #[param(min_length = 1, max_length = 8192)]
    cursor: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WriteQuery {
    /// An absolute path inside the sandbox; missing parents are created.
    #[param(min_length = 1, max_length = 4096, pattern = "^/")]
    path: String,
    /// Octal permission bits, e.g. `644`.
    #[serde(default)]
    #[param(pattern = "^[0-7]{1,4}$")]
    mode: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct RemoveQuery {
    /// An absolute path inside the sandbox.
    #[param(min_length = 1, max_length = 4096, pattern = "^/")]
    path: String,
    /// Remove a directory with everything in it.
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WatchQuery {
    /// An absolute path inside the sandbox.
    #[param(min_length = 1, max_length = 4096, pattern = "^/")]
    path: String,
    /// Watch the whole tree under `path` (default true).
    #[serde(default = "yes")]
    recursive: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ThumbnailQuery {
    /// An image file inside the sandbox.
    #[param(min_length = 1, max_length = 4096, pattern = "^/")]
    path: String,
    /// The longer side in pixels, 1..=1024, default 128.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1024)]
    size: Option<u32>,
}

fn sandbox_path(p: &str) -> Result<(), Invalid> {
    belljar_api::limits::sandbox_path("path", p)
}

impl Validate for PathQuery {
    fn validate(&self) -> Result<(), Invalid> {
        sandbox_path(&self.path)
    }
}

impl Validate for ListQuery {
    fn validate(&self) -> Result<(), Invalid> {
        sandbox_path(&self.path)?;
        belljar_api::limits::range("limit", self.limit, 1, belljar_api::LIST_MAX_LIMIT)?;
        self.cursor.as_deref().map_or(Ok(()), |c| {
            belljar_api::limits::text("cursor", c, 2 * belljar_api::limits::MAX_PATH)
        })
    }
}

impl Validate for WriteQuery {
    fn validate(&self) -> Result<(), Invalid> {
        sandbox_path(&self.path)?;
        match &self.mode {
            Some(m) if m.len() > 4 => Err(Invalid::new("mode", "must be octal, e.g. 644")),
            _ => Ok(()),
        }
    }
}

impl Validate for RemoveQuery {
    fn validate(&self) -> Result<(), Invalid> {
        sandbox_path(&self.path)
    }
}

impl Validate for WatchQuery {
    fn validate(&self) -> Result<(), Invalid> {
        sandbox_path(&self.path)
    }
}

impl Validate for ThumbnailQuery {
    fn validate(&self) -> Result<(), Invalid> {
        sandbox_path(&self.path)?;
        belljar_api::limits::range("size", self.size, 1, 1024)
    }
}

/// Read a file (streamed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", operation_id = "file_read", tag = "files", params(SandboxPath, PathQuery),
    responses((status = 200, description = "The file's bytes", body = RawBytes,
        content_type = "application/octet-stream"), Errors))]
async fn read(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, ApiError> {
    let (len, bytes) = st.sandboxes.read_file(&id, &q.path).await?;
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

/// Write a file (streamed; parents are created).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", operation_id = "file_write", tag = "files", params(SandboxPath, WriteQuery),
    request_body(content = RawBytes, content_type = "application/octet-stream"),
    responses((status = 200, description = "The written file", body = FileEntry), Errors))]
async fn write(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    body: Body,
) -> Result<Json<FileEntry>, ApiError> {
    let entry = st
        .sandboxes
        .write_file(&id, &q.path, q.mode.as_deref(), forward_body(body))
        .await?;
    Ok(Json(entry))
}

/// Remove a file or directory.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", operation_id = "file_remove", tag = "files", params(SandboxPath, RemoveQuery),
    responses((status = 204, description = "Removed"), Errors))]
async fn remove(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> Result<StatusCode, ApiError> {
    st.sandboxes.remove(&id, &q.path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", operation_id = "file_list", tag = "files", params(SandboxPath, ListQuery),
    responses((status = 200, description = "The entries, sorted by name", body = FileList), Errors))]
async fn list(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<FileList>, ApiError> {
    let page = st
        .sandboxes
        .list_files(&id, &q.path, q.limit, q.cursor.as_deref())
        .await?;
    Ok(Json(page))
}

/// A file's metadata.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", operation_id = "file_stat", tag = "files", params(SandboxPath, PathQuery),
    responses((status = 200, description = "The entry", body = FileEntry), Errors))]
async fn stat(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(st.sandboxes.stat(&id, &q.path).await?))
}

/// Make a directory with its parents.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", operation_id = "file_mkdir", tag = "files", params(SandboxPath),
    request_body = MkdirRequest,
    responses((status = 200, description = "The directory", body = FileEntry), Errors))]
async fn mkdir(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(st.sandboxes.mkdir(&id, req).await?))
}

/// Move or rename a file or directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", operation_id = "file_move", tag = "files", params(SandboxPath),
    request_body = MoveRequest,
    responses((status = 200, description = "The entry at its new path", body = FileEntry), Errors))]
async fn move_path(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<MoveRequest>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(st.sandboxes.move_path(&id, req).await?))
}

/// Download a tree as a tar stream.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/tar", operation_id = "file_tar_down", tag = "files", params(SandboxPath, PathQuery),
    responses((status = 200, description = "A tar stream", body = RawBytes,
        content_type = "application/x-tar"), Errors))]
async fn tar_down(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, ApiError> {
    let bytes = st.sandboxes.download_tar(&id, &q.path).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        Body::from_stream(bytes),
    )
        .into_response())
}

/// Extract a tar stream under a directory.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/tar", operation_id = "file_tar_up", tag = "files", params(SandboxPath, PathQuery),
    request_body(content = RawBytes, content_type = "application/x-tar"),
    responses((status = 204, description = "Extracted"), Errors))]
async fn tar_up(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<PathQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    st.sandboxes
        .upload_tar(&id, &q.path, forward_body(body))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Watch a path: NDJSON, or text frames on a WebSocket.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", operation_id = "file_watch", tag = "files", params(SandboxPath, WatchQuery),
    responses((status = 200, description = "NDJSON of `WatchEvent`", body = WatchEvent,
        content_type = "application/x-ndjson"), Errors))]
async fn watch(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<WatchQuery>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let events = st.sandboxes.watch(&id, &q.path, q.recursive).await?;
    match ws {
        Ok(ws) if wants_websocket(&headers) => {
            Ok(ws.on_upgrade(move |socket| watch_socket(socket, events)))
        }
        _ => Ok(ndjson(events)),
    }
}

/// Sends each event as a text frame until either side ends.
async fn watch_socket(
    mut socket: WebSocket,
    events: impl Stream<Item = WatchEvent> + Send + 'static,
) {
    let mut events = Box::pin(events);
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { break };
                let text = serde_json::to_string(&event).unwrap_or_default();
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
            msg = socket.recv() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// A PNG thumbnail of an image file.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/thumbnail", operation_id = "file_thumbnail", tag = "files", params(SandboxPath, ThumbnailQuery),
    responses((status = 200, description = "A PNG", body = RawBytes,
        content_type = "image/png"), Errors))]
async fn thumbnail(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<ThumbnailQuery>,
) -> Result<Response, ApiError> {
    let png = st
        .sandboxes
        .thumbnail(&id, &q.path, q.size.unwrap_or(128))
        .await?;
    Ok(([(header::CONTENT_TYPE, "image/png")], png.0).into_response())
}
