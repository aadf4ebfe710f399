//! Files through the Sandbox0 layer: read, write, mkdir, stat, list, move, delete and the
//! watch WebSocket, over the daemon's file service (the sandbox's agent).

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use belljar_agent_proto::client::body_from_stream;
use belljar_api::{FileEntry, FileKind, MkdirRequest, MoveRequest as DaemonMove, WatchKind};
use futures::{SinkExt, StreamExt, TryStreamExt};

use super::error::{Result, Sandbox0Error};
use super::wire::{
    Done, FileInfo, FileList, MoveRequest, PathQuery, Success, WatchMessage, WatchRequest,
};
use super::{S0Json, S0Path, S0Query};
use crate::http::AppState;
use crate::sandbox::SandboxError;
use crate::time::rfc3339;

fn info(e: FileEntry) -> FileInfo {
    FileInfo {
        kind: match e.kind {
            FileKind::Directory => "dir",
            FileKind::Symlink => "symlink",
            FileKind::File | FileKind::Other => "file",
        },
        is_link: e.kind == FileKind::Symlink,
        name: e.name,
        path: e.path,
        size: e.size,
        mode: format!("{:04o}", e.mode & 0o7777),
        mod_time: rfc3339(e.mtime),
        link_target: e.link_target,
    }
}

fn done(d: Done) -> Response {
    Json(Success::new(d)).into_response()
}

pub async fn read(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Query(q): S0Query<PathQuery>,
) -> Result<Response> {
    super::sandboxes::wake(&st, &id).await?;
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

/// The parent directory of an absolute path.
fn parent(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    let cut = trimmed.rfind('/')?;
    Some(if cut == 0 { "/" } else { &trimmed[..cut] })
}

/// Writes the body to `path`, or with `mkdir` makes the directory (`recursive`: its parents
/// too, else the parent must exist).
pub async fn write(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Query(q): S0Query<PathQuery>,
    body: Body,
) -> Result<Response> {
    super::sandboxes::wake(&st, &id).await?;
    if q.mkdir.unwrap_or(false) {
        if !q.recursive.unwrap_or(false)
            && let Some(parent) = parent(&q.path)
        {
            match st.sandboxes.stat(&id, parent).await {
                Ok(e) if e.kind == FileKind::Directory => {}
                Ok(_) => {
                    return Err(Sandbox0Error::BadRequest(format!(
                        "path: {parent} is not a directory"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        st.sandboxes
            .mkdir(&id, MkdirRequest { path: q.path })
            .await?;
        return Ok((
            StatusCode::CREATED,
            Json(Success::new(Done {
                created: Some(true),
                ..Done::default()
            })),
        )
            .into_response());
    }
    let body = body_from_stream(body.into_data_stream().map_err(std::io::Error::other));
    st.sandboxes.write_file(&id, &q.path, None, body).await?;
    Ok(done(Done {
        written: Some(true),
        ..Done::default()
    }))
}

pub async fn remove(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Query(q): S0Query<PathQuery>,
) -> Result<Response> {
    super::sandboxes::wake(&st, &id).await?;
    st.sandboxes.remove(&id, &q.path, true).await?;
    Ok(done(Done {
        deleted: Some(true),
        ..Done::default()
    }))
}

pub async fn stat(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Query(q): S0Query<PathQuery>,
) -> Result<Response> {
    super::sandboxes::wake(&st, &id).await?;
    let e = st.sandboxes.stat(&id, &q.path).await?;
    Ok(Json(Success::new(info(e))).into_response())
}

pub async fn list(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Query(q): S0Query<PathQuery>,
) -> Result<Response> {
    super::sandboxes::wake(&st, &id).await?;
    let mut entries = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = st
            .sandboxes
            .list_files(
                &id,
                &q.path,
                Some(belljar_api::LIST_MAX_LIMIT),
                cursor.as_deref(),
            )
            .await?;
        entries.extend(page.entries.into_iter().map(info));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(Json(Success::new(FileList { entries })).into_response())
}

pub async fn move_path(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<MoveRequest>,
) -> Result<Response> {
    super::sandboxes::wake(&st, &id).await?;
    let req = DaemonMove {
        from: req.source,
        to: req.destination,
        overwrite: true,
    };
    st.sandboxes.move_path(&id, req).await?;
    Ok(done(Done {
        moved: Some(true),
        ..Done::default()
    }))
}

pub async fn watch(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    upgrade: std::result::Result<
        WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Result<Response> {
    let upgrade = upgrade.map_err(|_| {
        Sandbox0Error::BadRequest("A file watch needs a WebSocket upgrade request".into())
    })?;
    super::sandboxes::wake(&st, &id).await?;
    Ok(upgrade.on_upgrade(move |socket| run_watch(st, id, socket)))
}

fn text(msg: &WatchMessage) -> Message {
    Message::Text(serde_json::to_string(msg).unwrap_or_default().into())
}

fn event_name(kind: WatchKind) -> &'static str {
    match kind {
        WatchKind::Create => "create",
        WatchKind::Modify => "write",
        WatchKind::Remove => "remove",
        WatchKind::Rename => "rename",
    }
}

/// One watch per socket: a `subscribe` starts it, an `unsubscribe` (or the socket's end)
/// ends it.
async fn run_watch(st: AppState, id: String, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let request = loop {
        match stream.next().await {
            Some(Ok(Message::Text(t))) => break serde_json::from_str::<WatchRequest>(&t),
            Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            Some(Ok(_)) => {}
        }
    };
    let (path, recursive) = match request {
        Ok(WatchRequest::Subscribe { path, recursive }) => (path, recursive),
        Ok(WatchRequest::Unsubscribe { .. }) => {
            let error = "subscribe first".to_owned();
            let _ = sink.send(text(&WatchMessage::Error { error })).await;
            return;
        }
        Err(e) => {
            let error = format!("message: {e}");
            let _ = sink.send(text(&WatchMessage::Error { error })).await;
            return;
        }
    };
    let events = match st.sandboxes.watch(&id, &path, recursive).await {
        Ok(e) => e,
        Err(e) => {
            let error = Sandbox0Error::from(e).parts().2;
            let _ = sink.send(text(&WatchMessage::Error { error })).await;
            return;
        }
    };
    let watch_id = format!("watch_{:016x}", rand::random::<u64>());
    let subscribed = WatchMessage::Subscribed {
        watch_id: watch_id.clone(),
        path,
    };
    if sink.send(text(&subscribed)).await.is_err() {
        return;
    }
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(e) => {
                    // A rename is the old name's `rename` and the new name's `create`, as
                    // inotify-based watchers report it.
                    let mut msgs = vec![WatchMessage::Event {
                        watch_id: watch_id.clone(),
                        event: event_name(e.kind),
                        path: e.path,
                    }];
                    if let Some(to) = e.to {
                        msgs.push(WatchMessage::Event {
                            watch_id: watch_id.clone(),
                            event: "create",
                            path: to,
                        });
                    }
                    for msg in &msgs {
                        if sink.send(text(msg)).await.is_err() {
                            return;
                        }
                    }
                }
                None => {
                    let error = SandboxError::Conflict("The watch ended".into()).to_string();
                    let _ = sink.send(text(&WatchMessage::Error { error })).await;
                    return;
                }
            },
            msg = stream.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    if let Ok(WatchRequest::Unsubscribe { .. }) = serde_json::from_str(&t) {
                        let _ = sink.send(text(&WatchMessage::Unsubscribed { watch_id })).await;
                        let _ = sink.send(Message::Close(None)).await;
                        return;
                    }
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents() {
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a/b/"), Some("/a"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("a"), None);
    }
}
