//! Compatibility layers: the REST APIs of cloud sandbox products, served by the daemon so that
//! code written for them runs against local sandboxes unchanged.
//!
//! Modal's layer is gRPC on a listener of its own ([`modal::serve`]); the others are routes of
//! the daemon's HTTP API ([`router`]).
//!
//! Each layer only translates: requests become calls to the daemon's own sandbox, command,
//! file and snapshot services (the ones `/v1` uses), never a second way into a sandbox.

pub mod e2b;
pub mod modal;
pub mod sandbox0;
pub mod vercel;

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use belljar_api::limits::MAX_JSON_BODY;
use belljar_api::{KillCommand, RunCommand, Sandbox};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::http::AppState;
use crate::http::error::ApiError;
use crate::sandbox::Sandboxes;

/// Every compatibility API, under its own prefix.
pub fn router() -> Router<AppState> {
    Router::new()
        .nest(vercel::PREFIX, vercel::router())
        .nest(sandbox0::PREFIX, sandbox0::router())
        .nest(e2b::PREFIX, e2b::router())
}

/// How much of an oversized JSON body is read and dropped before the 413. A connection closed
/// with unread data is reset, and the client (Node's fetch: "other side closed") loses the
/// answer with it; past this much, the answer may be lost rather than read on for ever.
const DRAIN_LIMIT: usize = 16 << 20;

/// A JSON body as the products' SDKs send it (an empty body is `{}`), at most
/// [`MAX_JSON_BODY`] bytes; fields a newer SDK adds are ignored, as the products ignore them.
pub(crate) async fn json_body<T: DeserializeOwned>(req: Request) -> Result<T, ApiError> {
    let mut body = req.into_body();
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen > DRAIN_LIMIT {
            break;
        }
        if seen <= MAX_JSON_BODY {
            bytes.extend_from_slice(&data);
        }
    }
    if seen > MAX_JSON_BODY {
        return Err(ApiError::PayloadTooLarge(MAX_JSON_BODY));
    }
    crate::http::extract::parse_json(&bytes)
}

/// `path` made absolute against `base` and normalised: `.` and `..` resolved lexically, never
/// above `/`, as the products' SDKs resolve the paths they are given.
pub(crate) fn normalise(base: &str, path: &str) -> String {
    let mut out = PathBuf::from("/");
    for c in Path::new(base).join(path).components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out.to_string_lossy().into_owned()
}

/// Kills a command with `SIGKILL` after `after`, unless it has ended by then (a product's
/// per-command timeout).
pub(crate) fn kill_after(sandboxes: &Sandboxes, sid: &str, cid: &str, after: Duration) {
    let (sandboxes, sid, cid) = (sandboxes.clone(), sid.to_owned(), cid.to_owned());
    tokio::spawn(async move {
        let ended = tokio::time::timeout(after, sandboxes.wait_command(&sid, &cid)).await;
        if ended.is_err() {
            let kill = KillCommand {
                signal: Some("KILL".into()),
            };
            // It may have ended between the timeout and the kill.
            let _ = sandboxes.kill_command(&sid, &cid, kill).await;
        }
    });
}

/// Runs a product's set-up script (`argv`, as root) in a new sandbox: the sandbox as it is
/// after, or, when the script fails, the failure (`what` names what it sets up) with the
/// sandbox deleted, since one without it is not what the SDK asked for.
pub(crate) async fn set_up(
    sandboxes: &Sandboxes,
    sandbox: &Sandbox,
    argv: Vec<String>,
    what: &str,
) -> Result<Sandbox, ApiError> {
    let run = RunCommand {
        argv,
        sudo: true,
        ..RunCommand::default()
    };
    let why = match sandboxes.run_command(&sandbox.id, run, None).await {
        Ok(c) if c.exit_code == Some(0) => return Ok(sandboxes.get(&sandbox.id)?),
        Ok(c) => format!("exit status {:?}", c.exit_code),
        Err(e) => e.to_string(),
    };
    if let Err(e) = sandboxes.delete(&sandbox.id).await {
        tracing::warn!(sandbox = %sandbox.id, error = %e, "cannot delete a sandbox whose set-up failed");
    }
    Err(ApiError::Internal(format!(
        "setting up {what} failed: {why}"
    )))
}
