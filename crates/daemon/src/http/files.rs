//! `/v1/sandboxes/{id}/files`: read and write (streamed), list, stat, mkdir, remove, move,
//! tar down and up, watch (NDJSON or WebSocket) and thumbnails.

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use belljar_api::{FileEntry, FileList, MkdirRequest, MoveRequest, WatchEvent};
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};
use super::stream::{forward_body, ndjson, wants_websocket};

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/sandboxes/{id}/files",
            get(read).put(write).delete(remove),
        )
        .route("/v1/sandboxes/{id}/files/list", get(list))
        .route("/v1/sandboxes/{id}/files/stat", get(stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(mkdir))
        .route("/v1/sandboxes/{id}/files/move", post(move_path))
        .route("/v1/sandboxes/{id}/files/tar", get(tar_down).put(tar_up))
        .route("/v1/sandboxes/{id}/files/watch", get(watch))
        .route("/v1/sandboxes/{id}/files/thumbnail", get(thumbnail))
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Deserialize)]
struct ListQuery {
    path: String,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Deserialize)]
struct WriteQuery {
    path: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize)]
struct RemoveQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
struct WatchQuery {
    path: String,
    #[serde(default = "yes")]
    recursive: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct ThumbnailQuery {
    path: String,
    #[serde(default)]
    size: Option<u32>,
}

async fn read(
    State(st): State<AppState>,
    Path(id): Path<String>,
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

async fn write(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    body: Body,
) -> Result<Json<FileEntry>, ApiError> {
    let entry = st
        .sandboxes
        .write_file(&id, &q.path, q.mode.as_deref(), forward_body(body))
        .await?;
    Ok(Json(entry))
}

async fn remove(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> Result<StatusCode, ApiError> {
    st.sandboxes.remove(&id, &q.path, q.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<FileList>, ApiError> {
    let page = st
        .sandboxes
        .list_files(&id, &q.path, q.limit, q.cursor.as_deref())
        .await?;
    Ok(Json(page))
}

async fn stat(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(st.sandboxes.stat(&id, &q.path).await?))
}

async fn mkdir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(st.sandboxes.mkdir(&id, req).await?))
}

async fn move_path(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<MoveRequest>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(st.sandboxes.move_path(&id, req).await?))
}

async fn tar_down(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, ApiError> {
    let bytes = st.sandboxes.download_tar(&id, &q.path).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        Body::from_stream(bytes),
    )
        .into_response())
}

async fn tar_up(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    st.sandboxes
        .upload_tar(&id, &q.path, forward_body(body))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn watch(
    State(st): State<AppState>,
    Path(id): Path<String>,
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

async fn thumbnail(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ThumbnailQuery>,
) -> Result<Response, ApiError> {
    let png = st
        .sandboxes
        .thumbnail(&id, &q.path, q.size.unwrap_or(128))
        .await?;
    Ok(([(header::CONTENT_TYPE, "image/png")], png.0).into_response())
}
