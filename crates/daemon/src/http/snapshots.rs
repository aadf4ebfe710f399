//! `/v1/snapshots` and `POST /v1/sandboxes/{id}/snapshots`: take, list, get, delete and
//! compare snapshots. A sandbox is made from one with `source: {type: "snapshot"}` at create.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use belljar_api::{
    CreateSnapshot, DiffQuery, ListSnapshotsQuery, Snapshot, SnapshotDiff, SnapshotList,
    UpdateSnapshot,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{Errors, SandboxPath, SnapshotPath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create))
        .routes(routes!(list))
        .routes(routes!(get_one, delete, update))
        .routes(routes!(diff))
}

/// What changed: from this snapshot to `to` (a later snapshot, or a sandbox's current files),
/// or without `to`, what this snapshot changed on top of its parent (or its image). Added,
/// modified and deleted paths with kinds, modes, owners and sizes; text files carry their
/// unified diff.
#[utoipa::path(get, path = "/v1/snapshots/{id}/diff", operation_id = "snapshot_diff", tag = "snapshots",
    params(SnapshotPath, DiffQuery),
    responses((status = 200, description = "The changes, in path order", body = SnapshotDiff), Errors))]
async fn diff(
    State(st): State<AppState>,
    ApiPath(SnapshotPath { id }): ApiPath<SnapshotPath>,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> Result<Json<SnapshotDiff>, ApiError> {
    let d = detached(async move { st.sandboxes.diff_snapshot(&id, q.to.as_deref()).await }).await?;
    Ok(Json(d))
}

/// Snapshot a running or paused sandbox. By default the sandbox stops and its writable layer
/// becomes the snapshot; with `keep_running` its processes are frozen while the layer is
/// copied. A paused sandbox with `auto_resume` (the default) is resumed first, as any use
/// resumes it; without, a live snapshot captures it as it stands (`frozen_ms` 0) and it stays
/// paused, and a stopping one stops it as `stop` does.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", operation_id = "snapshot_create", tag = "snapshots",
    params(SandboxPath), request_body = CreateSnapshot,
    responses((status = 201, description = "The snapshot, status `created`", body = Snapshot), Errors))]
async fn create(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<CreateSnapshot>,
) -> Result<(StatusCode, Json<Snapshot>), ApiError> {
    let s = detached(async move { st.sandboxes.snapshot(&id, req).await }).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

/// List snapshots, newest first.
#[utoipa::path(get, path = "/v1/snapshots", operation_id = "snapshot_list", tag = "snapshots", params(ListSnapshotsQuery),
    responses((status = 200, description = "One page", body = SnapshotList), Errors))]
async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListSnapshotsQuery>,
) -> Result<Json<SnapshotList>, ApiError> {
    Ok(Json(st.sandboxes.list_snapshots(&q)?))
}

/// Get a snapshot.
#[utoipa::path(get, path = "/v1/snapshots/{id}", operation_id = "snapshot_get", tag = "snapshots", params(SnapshotPath),
    responses((status = 200, description = "The snapshot", body = Snapshot), Errors))]
async fn get_one(
    State(st): State<AppState>,
    ApiPath(SnapshotPath { id }): ApiPath<SnapshotPath>,
) -> Result<Json<Snapshot>, ApiError> {
    Ok(Json(st.sandboxes.get_snapshot(&id)?))
}

/// Set how long a snapshot lives from now (and after each later use); `0` never expires.
#[utoipa::path(patch, path = "/v1/snapshots/{id}", operation_id = "snapshot_update", tag = "snapshots", params(SnapshotPath),
    request_body = UpdateSnapshot,
    responses((status = 200, description = "The snapshot with its new `expires_at`", body = Snapshot), Errors))]
async fn update(
    State(st): State<AppState>,
    ApiPath(SnapshotPath { id }): ApiPath<SnapshotPath>,
    ApiJson(req): ApiJson<UpdateSnapshot>,
) -> Result<Json<Snapshot>, ApiError> {
    Ok(Json(
        st.sandboxes
            .set_snapshot_expiration(&id, req.expiration_ms)?,
    ))
}

/// Delete a snapshot. Its files stay while sandboxes made from it still run on them. A failed
/// snapshot can be deleted too: for a persistent sandbox whose newest snapshot failed, that
/// discards the unsaved session, and its next start resumes from its last created snapshot.
#[utoipa::path(delete, path = "/v1/snapshots/{id}", operation_id = "snapshot_delete", tag = "snapshots", params(SnapshotPath),
    responses((status = 200, description = "The snapshot, status `deleted`", body = Snapshot), Errors))]
async fn delete(
    State(st): State<AppState>,
    ApiPath(SnapshotPath { id }): ApiPath<SnapshotPath>,
) -> Result<Json<Snapshot>, ApiError> {
    let s = detached(async move { st.sandboxes.delete_snapshot(&id).await }).await?;
    Ok(Json(s))
}
