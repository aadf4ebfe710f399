//! Watching directories, both ways envd offers: the `WatchDir` server stream (the async SDKs)
//! and the polled watchers of `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher` (the
//! sync ones), over the daemon's watch service.
//!
//! A polled watcher keeps at most [`MAX_EVENTS`] events between two polls (the oldest go
//! first), and the daemon holds at most [`MAX_WATCHERS`] of them; they live as long as the
//! daemon or until removed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use belljar_api::{WatchEvent, WatchKind};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::connect;
use super::error::{E2bError, Result};
use super::wire::Empty;
use super::{EnvdUser, sandbox_of, setup};
use crate::http::AppState;
use crate::http::error::ApiError;

/// Events a polled watcher keeps between two polls.
const MAX_EVENTS: usize = 10_000;
/// Polled watchers the daemon holds at once.
const MAX_WATCHERS: usize = 1_000;
/// How long a watch stream may be quiet before a keepalive goes out.
const KEEPALIVE: Duration = Duration::from_secs(30);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route("/filesystem.Filesystem/GetWatcherEvents", post(get_events))
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WatchRequest {
    path: String,
    recursive: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WatcherRequest {
    watcher_id: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WatcherBody {
    watcher_id: String,
}

/// One change: its path relative to the watched directory and `EVENT_TYPE_*`.
#[derive(Debug, Clone, Serialize)]
struct FsEvent {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Debug, Serialize)]
struct EventsBody {
    events: Vec<FsEvent>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum WatchDirEvent {
    Start(Empty),
    Filesystem(FsEvent),
    Keepalive(Empty),
}

struct Watcher {
    sandbox: String,
    events: Arc<Mutex<VecDeque<FsEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

static WATCHERS: LazyLock<Mutex<HashMap<String, Watcher>>> = LazyLock::new(Mutex::default);
static NEXT: AtomicU64 = AtomicU64::new(1);

fn watchers() -> std::sync::MutexGuard<'static, HashMap<String, Watcher>> {
    WATCHERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `path` is the temporary file of a write in progress (`.NAME.belljar-PID-N.tmp`),
/// which envd's writes do not show.
fn is_write_temp(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or_default();
    name.starts_with('.') && name.contains(".belljar-") && name.ends_with(".tmp")
}

/// The envd events of one daemon event under `root`. A write lands as its temporary file
/// renamed into place, which envd reports as the file's creation and write.
fn events(root: &str, e: &WatchEvent) -> Vec<FsEvent> {
    let rel = |p: &str| {
        p.strip_prefix(root)
            .map(|r| r.trim_start_matches('/'))
            .filter(|r| !r.is_empty())
            .unwrap_or(p)
            .to_owned()
    };
    let kind = match e.kind {
        WatchKind::Create => "EVENT_TYPE_CREATE",
        WatchKind::Modify => "EVENT_TYPE_WRITE",
        WatchKind::Remove => "EVENT_TYPE_REMOVE",
        WatchKind::Rename => "EVENT_TYPE_RENAME",
    };
    if is_write_temp(&e.path) {
        return match (e.kind, e.to.as_deref()) {
            (WatchKind::Rename, Some(to)) => vec![
                FsEvent {
                    name: rel(to),
                    kind: "EVENT_TYPE_CREATE",
                },
                FsEvent {
                    name: rel(to),
                    kind: "EVENT_TYPE_WRITE",
                },
            ],
            _ => Vec::new(),
        };
    }
    let mut out = vec![FsEvent {
        name: rel(&e.path),
        kind,
    }];
    if let (WatchKind::Rename, Some(to)) = (e.kind, e.to.as_deref())
        && to.starts_with(root)
    {
        out.push(FsEvent {
            name: rel(to),
            kind: "EVENT_TYPE_CREATE",
        });
    }
    out
}

/// The sandbox and the absolute directory of a watch request.
async fn start(
    st: &AppState,
    headers: &HeaderMap,
    user: Option<&str>,
    req: &WatchRequest,
) -> Result<(
    String,
    String,
    impl futures::Stream<Item = WatchEvent> + use<>,
)> {
    let sandbox = sandbox_of(headers)?;
    let root = setup::resolve(&req.path, &setup::home(&setup::user(user)))?;
    let entry = st.sandboxes.stat(&sandbox, &root).await?;
    if entry.kind != belljar_api::FileKind::Directory {
        return Err(E2bError::BadRequest(format!(
            "path: {root} is not a directory"
        )));
    }
    let stream = st.sandboxes.watch(&sandbox, &root, req.recursive).await?;
    Ok((sandbox, root, stream))
}

async fn watch_dir(
    State(st): State<AppState>,
    headers: HeaderMap,
    user: Option<Extension<EnvdUser>>,
    body: Body,
) -> Response {
    let started = async {
        let req: WatchRequest = connect::stream_request(body).await?;
        start(&st, &headers, user.as_ref().map(|u| u.0.0.as_str()), &req).await
    }
    .await;
    let (_, root, stream) = match started {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e).await,
    };
    let (tx, response) = connect::stream();
    tokio::spawn(async move {
        if !tx.send(&WatchDirEvent::Start(Empty {})).await {
            return;
        }
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                () = tokio::time::sleep(KEEPALIVE) => {
                    if !tx.send(&WatchDirEvent::Keepalive(Empty {})).await {
                        return;
                    }
                    continue;
                }
            };
            let Some(e) = next else { break };
            for ev in events(&root, &e) {
                if !tx.send(&WatchDirEvent::Filesystem(ev)).await {
                    return;
                }
            }
        }
        tx.end(None).await;
    });
    response
}

async fn unary<F>(f: F) -> Response
where
    F: Future<Output = Result<Response>>,
{
    f.await.unwrap_or_else(E2bError::into_connect_response)
}

async fn create_watcher(
    State(st): State<AppState>,
    headers: HeaderMap,
    user: Option<Extension<EnvdUser>>,
    body: Body,
) -> Response {
    unary(async {
        let req: WatchRequest = connect::unary(body).await?;
        if watchers().len() >= MAX_WATCHERS {
            return Err(E2bError::Api(ApiError::Sandbox(
                crate::sandbox::SandboxError::BadRequest(format!(
                    "watchers: at most {MAX_WATCHERS} at once; remove one first"
                )),
            )));
        }
        let (sandbox, root, stream) =
            start(&st, &headers, user.as_ref().map(|u| u.0.0.as_str()), &req).await?;
        let events_buf = Arc::new(Mutex::new(VecDeque::new()));
        let buf = events_buf.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(e) = stream.next().await {
                let mut q = buf.lock().unwrap_or_else(|e| e.into_inner());
                for ev in events(&root, &e) {
                    if q.len() >= MAX_EVENTS {
                        q.pop_front();
                    }
                    q.push_back(ev);
                }
            }
        });
        let id = format!("watch_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        watchers().insert(
            id.clone(),
            Watcher {
                sandbox,
                events: events_buf,
                task,
            },
        );
        Ok(connect::ok(&WatcherBody { watcher_id: id }))
    })
    .await
}

fn not_found(id: &str) -> E2bError {
    E2bError::NotFound(format!("watcher {id:?} not found"))
}

async fn get_events(headers: HeaderMap, body: Body) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        let req: WatcherRequest = connect::unary(body).await?;
        let buf = watchers()
            .get(&req.watcher_id)
            .filter(|w| w.sandbox == sandbox)
            .map(|w| w.events.clone())
            .ok_or_else(|| not_found(&req.watcher_id))?;
        let events: Vec<FsEvent> = buf
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        Ok(connect::ok(&EventsBody { events }))
    })
    .await
}

async fn remove_watcher(headers: HeaderMap, body: Body) -> Response {
    unary(async {
        let sandbox = sandbox_of(&headers)?;
        let req: WatcherRequest = connect::unary(body).await?;
        let mut all = watchers();
        if all
            .get(&req.watcher_id)
            .is_none_or(|w| w.sandbox != sandbox)
        {
            return Err(not_found(&req.watcher_id));
        }
        if let Some(w) = all.remove(&req.watcher_id) {
            w.task.abort();
        }
        Ok(connect::ok(&Empty {}))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_events_become_envd_events_relative_to_the_directory() {
        let e = WatchEvent {
            kind: WatchKind::Rename,
            path: "/home/user/a".into(),
            to: Some("/home/user/d/b".into()),
            is_dir: false,
            ts: 0,
        };
        let out = events("/home/user", &e);
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].name.as_str(), out[0].kind),
            ("a", "EVENT_TYPE_RENAME")
        );
        assert_eq!(
            (out[1].name.as_str(), out[1].kind),
            ("d/b", "EVENT_TYPE_CREATE")
        );
        let write = WatchEvent {
            path: "/home/user/.x.txt.belljar-7-1.tmp".into(),
            to: Some("/home/user/x.txt".into()),
            ..e.clone()
        };
        let out = events("/home/user", &write);
        assert_eq!(
            (out[0].name.as_str(), out[0].kind),
            ("x.txt", "EVENT_TYPE_CREATE")
        );
        assert_eq!(out[1].kind, "EVENT_TYPE_WRITE");
        let temp = WatchEvent {
            kind: WatchKind::Create,
            to: None,
            ..write
        };
        assert!(events("/home/user", &temp).is_empty());
        let json = serde_json::to_string(&WatchDirEvent::Start(Empty {})).unwrap();
        assert_eq!(json, r#"{"start":{}}"#);
    }
}
