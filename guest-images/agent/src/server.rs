//! The HTTP/2 routes of `belljar-agent-proto`, mapped onto the agent's library functions. Each
//! handler takes its input, calls one function and maps the error; nothing else lives here.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::sync::Arc;

use belljar_agent_proto::{
    AgentInfo, ErrorBody, ErrorDetail, FENCE_HEADER, MkdirRequest, MoveRequest, PtySize,
    RemoveRequest, ShutdownAction, ShutdownRequest, SignalRequest, StartCommand, query,
};
use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, Empty, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::commands::{Commands, now_ms};
use crate::error::AgentError;
use crate::{files, metrics, watch};

/// Every response body.
pub type ResBody = UnsyncBoxBody<Bytes, io::Error>;

/// Largest JSON request body accepted.
const MAX_JSON: usize = 1 << 20;

/// What every handler can reach.
#[derive(Debug)]
pub struct App {
    pub commands: Commands,
    pub started: std::time::Instant,
    pub started_at: i64,
    /// Whether the sandbox's /proc/uptime is not its own (namespace and plain modes).
    pub own_uptime: bool,
    /// Where a shutdown request goes; the serve loop ends the sandbox.
    pub shutdown: mpsc::Sender<ShutdownAction>,
}

/// Serves one request; errors become [`ErrorBody`] responses.
pub async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
) -> Result<Response<ResBody>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    Ok(route(app, req).await.unwrap_or_else(|e| {
        if e.status().is_server_error() {
            tracing::warn!(%method, %path, "{e}");
        } else {
            tracing::debug!(%method, %path, "{e}");
        }
        error_response(&e)
    }))
}

async fn route(app: Arc<App>, req: Request<Incoming>) -> Result<Response<ResBody>, AgentError> {
    let q = query::parse(req.uri().query().unwrap_or(""))
        .ok_or_else(|| AgentError::BadRequest("malformed query string".into()))?;
    let path = req.uri().path().to_owned();
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let method = req.method().clone();
    match (method, segs.as_slice()) {
        (Method::GET, ["v1", "health"]) => json(&AgentInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid: std::process::id(),
            started_at: app.started_at,
        }),
        (Method::POST, ["v1", "commands"]) => {
            let follow = flag(&q, "follow")?;
            let start: StartCommand = read_json(req).await?;
            let started = app.commands.start(start)?;
            if follow {
                let lines = app.commands.follow(started)?;
                return Ok(stream(lines, "application/x-ndjson", None));
            }
            json(&started)
        }
        (Method::GET, ["v1", "commands"]) => {
            let fence = match q.get("fence") {
                Some(f) => Some(
                    f.parse()
                        .map_err(|_| AgentError::BadRequest(format!("bad fence {f}")))?,
                ),
                None => None,
            };
            let (list, fence) = app.commands.list(fence);
            let mut resp = json(&list)?;
            if let Some(fence) = fence {
                resp.headers_mut().insert(FENCE_HEADER, fence.into());
            }
            Ok(resp)
        }
        (Method::GET, ["v1", "commands", id]) => {
            json(&app.commands.info(id, flag(&q, "wait")?).await?)
        }
        (Method::GET, ["v1", "commands", id, "output"]) => {
            let skip = match q.get("skip") {
                Some(s) => s
                    .parse()
                    .map_err(|_| AgentError::BadRequest(format!("bad skip {s}")))?,
                None => 0,
            };
            let lines = app.commands.output(id, skip, flag(&q, "follow")?)?;
            Ok(stream(lines, "application/x-ndjson", None))
        }
        (Method::POST, ["v1", "commands", id, "stdin"]) => {
            let close = flag(&q, "close")?;
            let id = id.to_string();
            app.commands
                .write_stdin(&id, body_stream(req), close)
                .await?;
            Ok(no_content())
        }
        (Method::POST, ["v1", "commands", id, "signal"]) => {
            let id = id.to_string();
            let sig: SignalRequest = read_json(req).await?;
            app.commands.signal(&id, &sig.signal)?;
            Ok(no_content())
        }
        (Method::POST, ["v1", "commands", id, "resize"]) => {
            let id = id.to_string();
            let size: PtySize = read_json(req).await?;
            app.commands.resize(&id, size)?;
            Ok(no_content())
        }
        (Method::GET, ["v1", "files", "read"]) => {
            let (len, bytes) = files::read(param(&q, "path")?).await?;
            Ok(stream(bytes, "application/octet-stream", len))
        }
        (Method::PUT, ["v1", "files", "write"]) => {
            let mode = match q.get("mode") {
                Some(m) => Some(
                    u32::from_str_radix(m, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| AgentError::BadRequest(format!("bad mode {m}")))?,
                ),
                None => None,
            };
            let path = param(&q, "path")?;
            let user = q.get("user").map(String::as_str);
            json(&files::write(path, mode, user, body_stream(req)).await?)
        }
        (Method::POST, ["v1", "files", "mkdir"]) => {
            let mkdir: MkdirRequest = read_json(req).await?;
            json(&files::mkdir(mkdir).await?)
        }
        (Method::GET, ["v1", "files", "list"]) => {
            let limit = files::parse_limit(q.get("limit").map(String::as_str))?;
            let cursor = q.get("cursor").map(String::as_str);
            json(&files::list(param(&q, "path")?, limit, cursor).await?)
        }
        (Method::GET, ["v1", "files", "stat"]) => json(&files::stat(param(&q, "path")?).await?),
        (Method::POST, ["v1", "files", "remove"]) => {
            let remove: RemoveRequest = read_json(req).await?;
            files::remove(remove).await?;
            Ok(no_content())
        }
        (Method::POST, ["v1", "files", "move"]) => {
            let mv: MoveRequest = read_json(req).await?;
            json(&files::move_path(mv).await?)
        }
        (Method::GET, ["v1", "files", "tar"]) => {
            let tar = files::tar_download(param(&q, "path")?).await?;
            Ok(stream(tar, "application/x-tar", None))
        }
        (Method::PUT, ["v1", "files", "tar"]) => {
            let path = param(&q, "path")?;
            let user = q.get("user").map(String::as_str);
            files::tar_upload(path, user, body_stream(req)).await?;
            Ok(no_content())
        }
        (Method::GET, ["v1", "watch"]) => {
            let events = watch::watch(param(&q, "path")?, flag(&q, "recursive")?)?;
            Ok(stream(events, "application/x-ndjson", None))
        }
        (Method::GET, ["v1", "metrics"]) => json(
            &metrics::collect(app.started, app.own_uptime)
                .map_err(|e| AgentError::Internal(e.to_string()))?,
        ),
        (Method::POST, ["v1", "shutdown"]) => {
            let shutdown: ShutdownRequest = read_json(req).await?;
            let _ = app.shutdown.try_send(shutdown.action);
            Ok(no_content())
        }
        _ => Err(AgentError::NotFound(format!("no route {path}"))),
    }
}

fn param<'a>(q: &'a HashMap<String, String>, name: &str) -> Result<&'a str, AgentError> {
    q.get(name)
        .map(String::as_str)
        .ok_or_else(|| AgentError::BadRequest(format!("missing ?{name}=")))
}

fn flag(q: &HashMap<String, String>, name: &str) -> Result<bool, AgentError> {
    match q.get(name).map(String::as_str) {
        None | Some("false" | "0") => Ok(false),
        Some("" | "true" | "1") => Ok(true),
        Some(other) => Err(AgentError::BadRequest(format!("bad {name}={other}"))),
    }
}

async fn read_json<T: DeserializeOwned>(req: Request<Incoming>) -> Result<T, AgentError> {
    let bytes = Limited::new(req.into_body(), MAX_JSON)
        .collect()
        .await
        .map_err(|e| AgentError::BadRequest(format!("cannot read body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| AgentError::BadRequest(format!("bad JSON: {e}")))
}

fn body_stream(req: Request<Incoming>) -> impl Stream<Item = Result<Bytes, hyper::Error>> + Send {
    BodyStream::new(req.into_body())
        .try_filter_map(|frame| futures::future::ready(Ok(frame.into_data().ok())))
}

fn json(value: &impl Serialize) -> Result<Response<ResBody>, AgentError> {
    let body = serde_json::to_vec(value).map_err(|e| AgentError::Internal(e.to_string()))?;
    Ok(with_body(StatusCode::OK, "application/json", full(body)))
}

fn full(bytes: Vec<u8>) -> ResBody {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn with_body(status: StatusCode, content_type: &str, body: ResBody) -> Response<ResBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(ct) = content_type.parse() {
        resp.headers_mut().insert(CONTENT_TYPE, ct);
    }
    resp
}

fn stream<S>(bytes: S, content_type: &str, len: Option<u64>) -> Response<ResBody>
where
    S: Stream<Item = io::Result<Bytes>> + Send + 'static,
{
    let body = StreamBody::new(bytes.map_ok(Frame::data)).boxed_unsync();
    let mut resp = with_body(StatusCode::OK, content_type, body);
    if let Some(len) = len {
        resp.headers_mut().insert(CONTENT_LENGTH, len.into());
    }
    resp
}

fn no_content() -> Response<ResBody> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    resp
}

fn error_response(err: &AgentError) -> Response<ResBody> {
    let body = ErrorBody {
        error: ErrorDetail {
            code: err.code().to_owned(),
            message: err.to_string(),
        },
    };
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    with_body(err.status(), "application/json", full(bytes))
}

/// Unix milliseconds when the agent started.
pub fn started_at() -> i64 {
    now_ms()
}
