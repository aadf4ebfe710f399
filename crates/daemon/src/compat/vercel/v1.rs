//! The 1.x line: `/v1/sandboxes...`, where a sandbox is addressed by its id.

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use belljar_api::{ListSandboxesQuery, ListSnapshotsQuery, Sandbox};
use serde_json::json;

use super::error::Result;
use super::wire::{
    CreateRequest, ExtendRequest, KillRequest, Line, ListQuery, PathRequest, RunRequest, Session,
    SnapshotRequest, TimePagination, WireSnapshot,
};
use super::{VJson, VPath, VQuery, exec, files, lifecycle};
use crate::http::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/snapshots", get(list_snapshots))
        .route(
            "/v1/sandboxes/snapshots/{snapshot}",
            get(get_snapshot).delete(delete_snapshot),
        )
        .route("/v1/sandboxes/{id}", get(get_one))
        .route("/v1/sandboxes/{id}/cmd", post(run))
        .route("/v1/sandboxes/{id}/cmd/{cid}", get(get_command))
        .route("/v1/sandboxes/{id}/cmd/{cid}/logs", get(logs))
        .route("/v1/sandboxes/{id}/{cid}/kill", post(kill))
        .route("/v1/sandboxes/{id}/fs/read", post(read))
        .route("/v1/sandboxes/{id}/fs/write", post(write))
        .route("/v1/sandboxes/{id}/fs/mkdir", post(mkdir))
        .route("/v1/sandboxes/{id}/stop", post(stop))
        .route("/v1/sandboxes/{id}/extend-timeout", post(extend))
        .route("/v1/sandboxes/{id}/network-policy", post(network_policy))
        .route("/v1/sandboxes/{id}/snapshot", post(snapshot))
}

fn sandbox_body(s: &Sandbox) -> Response {
    Json(json!({ "sandbox": Session::from(s) })).into_response()
}

fn with_routes(st: &AppState, s: &Sandbox) -> Response {
    Json(json!({ "sandbox": Session::from(s), "routes": lifecycle::routes(st, s) })).into_response()
}

async fn create(State(st): State<AppState>, VJson(req): VJson<CreateRequest>) -> Result<Response> {
    Ok(with_routes(&st, &lifecycle::create(&st, req).await?))
}

async fn get_one(State(st): State<AppState>, VPath(id): VPath<String>) -> Result<Response> {
    Ok(with_routes(&st, &st.sandboxes.get(&id)?))
}

/// Newest first; `pagination.next` is the `until` of the next page.
async fn list(State(st): State<AppState>, VQuery(q): VQuery<ListQuery>) -> Result<Response> {
    let (sandboxes, more) = lifecycle::sandboxes(
        &st,
        ListSandboxesQuery {
            since: q.since,
            until: q.until,
            limit: q.limit,
            ..ListSandboxesQuery::default()
        },
    )?;
    let pagination = TimePagination {
        count: sandboxes.len(),
        next: more.and(sandboxes.last().map(|s| s.created_at)),
        prev: None,
    };
    let sandboxes: Vec<Session> = sandboxes.iter().map(Session::from).collect();
    Ok(Json(json!({ "sandboxes": sandboxes, "pagination": pagination })).into_response())
}

async fn run(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    VJson(req): VJson<RunRequest>,
) -> Result<Response> {
    exec::run(&st, &id, req, Line::V1).await
}

async fn get_command(
    State(st): State<AppState>,
    VPath((id, cid)): VPath<(String, String)>,
    VQuery(q): VQuery<ListQuery>,
) -> Result<Response> {
    exec::get(&st, &id, &cid, q.wait.as_deref() == Some("true"), Line::V1).await
}

async fn logs(
    State(st): State<AppState>,
    VPath((id, cid)): VPath<(String, String)>,
) -> Result<Response> {
    exec::logs(&st, &id, &cid)
}

async fn kill(
    State(st): State<AppState>,
    VPath((id, cid)): VPath<(String, String)>,
    VJson(req): VJson<KillRequest>,
) -> Result<Response> {
    exec::kill(&st, &id, &cid, req, Line::V1).await
}

async fn read(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    VJson(req): VJson<PathRequest>,
) -> Result<Response> {
    files::read(&st, &id, req).await
}

async fn write(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    files::write(&st, &id, &headers, body).await
}

async fn mkdir(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    VJson(req): VJson<PathRequest>,
) -> Result<Response> {
    files::mkdir(&st, &id, req).await
}

async fn stop(State(st): State<AppState>, VPath(id): VPath<String>) -> Result<Response> {
    Ok(sandbox_body(&lifecycle::stop(&st, &id).await?))
}

async fn extend(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    VJson(req): VJson<ExtendRequest>,
) -> Result<Response> {
    Ok(sandbox_body(
        &lifecycle::extend(&st, &id, req.duration).await?,
    ))
}

async fn network_policy(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    VJson(policy): VJson<serde_json::Value>,
) -> Result<Response> {
    Ok(sandbox_body(
        &lifecycle::set_policy(&st, &id, &policy).await?,
    ))
}

async fn snapshot(
    State(st): State<AppState>,
    VPath(id): VPath<String>,
    VJson(req): VJson<SnapshotRequest>,
) -> Result<Response> {
    let (snap, sandbox) = lifecycle::snapshot(&st, &id, req.expiration).await?;
    Ok(Json(json!({
        "snapshot": WireSnapshot::new(&snap, Line::V1),
        "sandbox": Session::from(&sandbox),
    }))
    .into_response())
}

async fn list_snapshots(
    State(st): State<AppState>,
    VQuery(q): VQuery<ListQuery>,
) -> Result<Response> {
    let (snaps, more) = lifecycle::snapshots(
        &st,
        ListSnapshotsQuery {
            since: q.since,
            until: q.until,
            limit: q.limit,
            ..ListSnapshotsQuery::default()
        },
    )?;
    let pagination = TimePagination {
        count: snaps.len(),
        next: more.and(snaps.last().map(|s| s.created_at)),
        prev: None,
    };
    let snapshots: Vec<WireSnapshot> = snaps
        .iter()
        .map(|s| WireSnapshot::new(s, Line::V1))
        .collect();
    Ok(Json(json!({ "snapshots": snapshots, "pagination": pagination })).into_response())
}

async fn get_snapshot(State(st): State<AppState>, VPath(id): VPath<String>) -> Result<Response> {
    let s = st.sandboxes.get_snapshot(&id)?;
    Ok(Json(json!({ "snapshot": WireSnapshot::new(&s, Line::V1) })).into_response())
}

async fn delete_snapshot(State(st): State<AppState>, VPath(id): VPath<String>) -> Result<Response> {
    let s = st.sandboxes.delete_snapshot(&id).await?;
    Ok(Json(json!({ "snapshot": WireSnapshot::new(&s, Line::V1) })).into_response())
}
