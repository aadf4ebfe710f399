//! The 3.x line: `/v2/sandboxes...` (and `POST /v3/sandboxes`, which 3.x uses to create a
//! sandbox without a runtime). A named sandbox is the newest daemon sandbox of that name and
//! its current session is that sandbox, addressed by id under `/v2/sandboxes/sessions/`.
//!
//! Sandboxes are persistent unless created with `persistent: false`, as Vercel's are: a stop
//! snapshots them (the daemon's persistent sandboxes) and resuming starts the same sandbox
//! again from that snapshot. Resuming a non-persistent one starts a new session with the same
//! configuration and clean files; resuming a paused one resumes it.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use belljar_api::{ListSandboxesQuery, ListSnapshotsQuery, Sandbox, SandboxStatus, UpdateSandbox};
use serde::Deserialize;
use serde_json::json;

use super::error::{Result, VercelError};
use super::wire::{
    CreateRequest, CursorPagination, ExtendRequest, KeepLast, KillRequest, Line, ListQuery,
    NamedSandbox, PathRequest, Resources, RunRequest, Session, SnapshotRequest, WireSnapshot,
};
use super::{VJson, VPath, VQuery, exec, files, lifecycle};
use crate::http::AppState;

pub fn router() -> Router<AppState> {
    let s = "/v2/sandboxes/sessions/{sid}";
    Router::new()
        .route("/v2/sandboxes", post(create).get(list))
        .route("/v3/sandboxes", post(create))
        .route("/v2/sandboxes/sessions", get(list_sessions))
        .route("/v2/sandboxes/snapshots", get(list_snapshots))
        .route("/v2/sandboxes/snapshots/tree", get(not_implemented))
        .route(
            "/v2/sandboxes/snapshots/{snapshot}",
            get(get_snapshot).delete(delete_snapshot),
        )
        .route("/v2/sandboxes/drives", get(not_implemented))
        .route(
            "/v2/sandboxes/drives/{drive}",
            post(not_implemented).delete(not_implemented),
        )
        .route(
            "/v2/sandboxes/{name}",
            get(get_one).patch(update).delete(delete),
        )
        .route("/v2/sandboxes/{name}/fork", post(fork))
        .route(s, get(get_session))
        .route(&format!("{s}/cmd"), post(run))
        .route(&format!("{s}/cmd/{{cid}}"), get(get_command))
        .route(&format!("{s}/cmd/{{cid}}/logs"), get(logs))
        .route(&format!("{s}/cmd/{{cid}}/kill"), post(kill))
        .route(&format!("{s}/fs/read"), post(read))
        .route(&format!("{s}/fs/write"), post(write))
        .route(&format!("{s}/fs/mkdir"), post(mkdir))
        .route(&format!("{s}/stop"), post(stop))
        .route(&format!("{s}/extend-timeout"), post(extend))
        .route(&format!("{s}/network-policy"), post(network_policy))
        .route(&format!("{s}/snapshot"), post(snapshot))
        .route(&format!("{s}/interactive"), post(not_implemented))
}

async fn not_implemented(uri: axum::http::Uri) -> VercelError {
    VercelError::NotImplemented(uri.path().trim_start_matches(super::PREFIX).to_owned())
}

/// The named sandbox `s` is, with its snapshot policy.
fn named(st: &AppState, s: &Sandbox) -> NamedSandbox {
    NamedSandbox::from(s).with_policy(st.sandboxes.snapshot_policy(&s.id))
}

/// `{ sandbox, session, routes }`, the answer of create, get and fork.
fn full(st: &AppState, s: &Sandbox, resumed: bool) -> Response {
    Json(json!({
        "sandbox": named(st, s),
        "session": Session::from(s),
        "routes": lifecycle::routes(st, s),
        "resumed": resumed,
    }))
    .into_response()
}

fn session_body(s: &Sandbox) -> Response {
    Json(json!({ "session": Session::from(s) })).into_response()
}

/// Vercel's sandboxes are persistent unless asked otherwise.
async fn create(
    State(st): State<AppState>,
    VJson(mut req): VJson<CreateRequest>,
) -> Result<Response> {
    req.persistent.get_or_insert(true);
    Ok(full(&st, &lifecycle::create(&st, req).await?, false))
}

/// With `resume=true`, a paused sandbox is resumed, a stopped persistent one starts again from
/// its latest snapshot, and a stopped non-persistent one starts a new session.
async fn get_one(
    State(st): State<AppState>,
    VPath(name): VPath<String>,
    VQuery(q): VQuery<ListQuery>,
) -> Result<Response> {
    let s = lifecycle::named(&st, &name)?;
    let resume = q.resume.as_deref() == Some("true");
    if resume
        && (s.status == SandboxStatus::Paused || (s.status.is_final() && s.lifecycle.persistent))
    {
        return Ok(full(&st, &lifecycle::resume(&st, &s.id).await?, true));
    }
    if resume && s.status.is_final() {
        let again = CreateRequest {
            timeout: Some(s.timeout_ms),
            resources: Some(Resources {
                vcpus: Some(s.vcpus),
                memory: None,
            }),
            image: Some(s.image.clone()),
            name: s.name.clone(),
            env: Some(s.env.clone()),
            tags: Some(s.tags.clone()),
            persistent: Some(false),
            ..CreateRequest::default()
        };
        return Ok(full(&st, &lifecycle::create(&st, again).await?, true));
    }
    Ok(full(&st, &s, false))
}

/// Tags pass through; a longer `timeout` extends a running session; `networkPolicy` replaces
/// the policy; `ports` exposes more; `snapshotExpiration` and `keepLastSnapshots` replace the
/// sandbox's snapshot policy (a new retention applies at once); `persistent` may repeat what
/// the sandbox is. Changing persistence or resources has no counterpart yet.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateRequest {
    #[serde(default)]
    persistent: Option<bool>,
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    network_policy: Option<serde_json::Value>,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    snapshot_expiration: Option<i64>,
    #[serde(default)]
    keep_last_snapshots: Option<KeepLast>,
    #[serde(default)]
    resources: Option<serde_json::Value>,
    #[serde(default)]
    network_id: Option<String>,
    #[serde(default)]
    current_snapshot_id: Option<String>,
    #[serde(default)]
    mounts: Option<serde_json::Value>,
}

async fn update(
    State(st): State<AppState>,
    VPath(name): VPath<String>,
    VJson(req): VJson<UpdateRequest>,
) -> Result<Response> {
    let s = lifecycle::named(&st, &name)?;
    let unsupported = [
        (
            req.persistent.is_some_and(|p| p != s.lifecycle.persistent),
            "changing persistent",
        ),
        (req.resources.is_some(), "changing resources"),
        (req.network_id.is_some(), "networkId"),
        (req.current_snapshot_id.is_some(), "currentSnapshotId"),
        (req.mounts.is_some(), "mounts (drives)"),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(asked, _)| *asked) {
        return Err(VercelError::NotImplemented((*what).to_owned()));
    }
    if req.snapshot_expiration.is_some() || req.keep_last_snapshots.is_some() {
        st.sandboxes
            .set_snapshot_policy(
                &s.id,
                req.snapshot_expiration.map(Some),
                req.keep_last_snapshots.map(|k| Some(k.into())),
            )
            .await?;
    }
    if let Some(policy) = &req.network_policy {
        lifecycle::set_policy(&st, &s.id, policy).await?;
    }
    if let Some(ports) = &req.ports {
        lifecycle::add_ports(&st, &s, ports).await?;
    }
    if let Some(timeout) = req.timeout
        && timeout > s.timeout_ms
        && !s.status.is_final()
    {
        lifecycle::extend(&st, &s.id, timeout - s.timeout_ms).await?;
    }
    if let Some(tags) = req.tags {
        let update = UpdateSandbox {
            tags: Some(tags),
            name: None,
            network_policy: None,
        };
        belljar_api::Validate::validate(&update)
            .map_err(|e| VercelError::BadRequest(e.to_string()))?;
        st.sandboxes.update(&s.id, update).await?;
    }
    let s = st.sandboxes.get(&s.id)?;
    Ok(
        Json(json!({ "sandbox": named(&st, &s), "routes": lifecycle::routes(&st, &s) }))
            .into_response(),
    )
}

/// Deletes the sandbox: every session of that name, with its files.
async fn delete(State(st): State<AppState>, VPath(name): VPath<String>) -> Result<Response> {
    let s = lifecycle::named(&st, &name)?;
    let ids = lifecycle::sessions_of(&st, &s)?;
    let sandboxes = st.sandboxes.clone();
    tokio::spawn(async move {
        for id in ids {
            sandboxes.delete(&id).await?;
        }
        Ok::<_, crate::sandbox::SandboxError>(())
    })
    .await
    .map_err(|e| VercelError::Api(crate::http::error::ApiError::Internal(e.to_string())))??;
    Ok(Json(json!({ "sandbox": named(&st, &s) })).into_response())
}

async fn fork(
    State(st): State<AppState>,
    VPath(name): VPath<String>,
    VJson(req): VJson<CreateRequest>,
) -> Result<Response> {
    let source = lifecycle::named(&st, &name)?;
    Ok(full(
        &st,
        &lifecycle::fork(&st, &source.id, req).await?,
        false,
    ))
}

async fn list(State(st): State<AppState>, VQuery(q): VQuery<ListQuery>) -> Result<Response> {
    let tag = q.tags.as_deref().map(|t| t.replacen(':', "=", 1));
    let (sandboxes, next) = lifecycle::sandboxes(
        &st,
        ListSandboxesQuery {
            tag,
            limit: q.limit,
            cursor: q.cursor,
            ..ListSandboxesQuery::default()
        },
    )?;
    let prefix = q.name_prefix.unwrap_or_default();
    let sandboxes: Vec<NamedSandbox> = sandboxes
        .iter()
        .map(|s| named(&st, s))
        .filter(|s| s.name.starts_with(&prefix))
        .collect();
    let pagination = CursorPagination {
        count: sandboxes.len(),
        next,
    };
    Ok(Json(json!({ "sandboxes": sandboxes, "pagination": pagination })).into_response())
}

/// The sessions of one named sandbox (every daemon sandbox of that name), or of all.
async fn list_sessions(
    State(st): State<AppState>,
    VQuery(q): VQuery<ListQuery>,
) -> Result<Response> {
    let (sandboxes, next) = lifecycle::sandboxes(
        &st,
        ListSandboxesQuery {
            limit: q.limit,
            cursor: q.cursor,
            ..ListSandboxesQuery::default()
        },
    )?;
    let sessions: Vec<Session> = sandboxes
        .iter()
        .filter(|s| q.name.is_none() || s.name == q.name || Some(&s.id) == q.name.as_ref())
        .map(Session::from)
        .collect();
    let pagination = CursorPagination {
        count: sessions.len(),
        next,
    };
    Ok(Json(json!({ "sessions": sessions, "pagination": pagination })).into_response())
}

async fn get_session(State(st): State<AppState>, VPath(sid): VPath<String>) -> Result<Response> {
    let s = st.sandboxes.get(&sid)?;
    Ok(
        Json(json!({ "session": Session::from(&s), "routes": lifecycle::routes(&st, &s) }))
            .into_response(),
    )
}

async fn run(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    VJson(req): VJson<RunRequest>,
) -> Result<Response> {
    exec::run(&st, &sid, req, Line::V2).await
}

async fn get_command(
    State(st): State<AppState>,
    VPath((sid, cid)): VPath<(String, String)>,
    VQuery(q): VQuery<ListQuery>,
) -> Result<Response> {
    exec::get(&st, &sid, &cid, q.wait.as_deref() == Some("true"), Line::V2).await
}

async fn logs(
    State(st): State<AppState>,
    VPath((sid, cid)): VPath<(String, String)>,
) -> Result<Response> {
    exec::logs(&st, &sid, &cid)
}

async fn kill(
    State(st): State<AppState>,
    VPath((sid, cid)): VPath<(String, String)>,
    VJson(req): VJson<KillRequest>,
) -> Result<Response> {
    exec::kill(&st, &sid, &cid, req, Line::V2).await
}

async fn read(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    VJson(req): VJson<PathRequest>,
) -> Result<Response> {
    files::read(&st, &sid, req).await
}

async fn write(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    files::write(&st, &sid, &headers, body).await
}

async fn mkdir(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    VJson(req): VJson<PathRequest>,
) -> Result<Response> {
    files::mkdir(&st, &sid, req).await
}

async fn stop(State(st): State<AppState>, VPath(sid): VPath<String>) -> Result<Response> {
    let s = lifecycle::stop(&st, &sid).await?;
    Ok(Json(json!({ "session": Session::from(&s), "sandbox": named(&st, &s) })).into_response())
}

async fn extend(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    VJson(req): VJson<ExtendRequest>,
) -> Result<Response> {
    Ok(session_body(
        &lifecycle::extend(&st, &sid, req.duration).await?,
    ))
}

async fn network_policy(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    VJson(policy): VJson<serde_json::Value>,
) -> Result<Response> {
    Ok(session_body(
        &lifecycle::set_policy(&st, &sid, &policy).await?,
    ))
}

async fn snapshot(
    State(st): State<AppState>,
    VPath(sid): VPath<String>,
    VJson(req): VJson<SnapshotRequest>,
) -> Result<Response> {
    let (snap, s) = lifecycle::snapshot(&st, &sid, req.expiration).await?;
    Ok(Json(json!({
        "snapshot": WireSnapshot::new(&snap, Line::V2),
        "session": Session::from(&s),
    }))
    .into_response())
}

/// Snapshots, of one named sandbox's sessions when `name` is given.
async fn list_snapshots(
    State(st): State<AppState>,
    VQuery(q): VQuery<ListQuery>,
) -> Result<Response> {
    let sandbox_id = match &q.name {
        Some(name) => Some(lifecycle::named(&st, name)?.id),
        None => None,
    };
    let (snaps, next) = lifecycle::snapshots(
        &st,
        ListSnapshotsQuery {
            sandbox_id,
            limit: q.limit,
            cursor: q.cursor,
            ..ListSnapshotsQuery::default()
        },
    )?;
    let snapshots: Vec<WireSnapshot> = snaps
        .iter()
        .map(|s| WireSnapshot::new(s, Line::V2))
        .collect();
    let pagination = CursorPagination {
        count: snapshots.len(),
        next,
    };
    Ok(Json(json!({ "snapshots": snapshots, "pagination": pagination })).into_response())
}

async fn get_snapshot(State(st): State<AppState>, VPath(id): VPath<String>) -> Result<Response> {
    let s = st.sandboxes.get_snapshot(&id)?;
    Ok(Json(json!({ "snapshot": WireSnapshot::new(&s, Line::V2) })).into_response())
}

async fn delete_snapshot(State(st): State<AppState>, VPath(id): VPath<String>) -> Result<Response> {
    let s = st.sandboxes.delete_snapshot(&id).await?;
    Ok(Json(json!({ "snapshot": WireSnapshot::new(&s, Line::V2) })).into_response())
}
