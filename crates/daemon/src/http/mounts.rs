//! `/v1/sandboxes/{id}/mounts`: the directory snapshots mounted in a sandbox, mounting one
//! into a running sandbox and unmounting one (Modal's `mount_image` / `unmount_image`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use belljar_api::{SandboxMounts, SnapshotMount, UnmountQuery};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{Errors, SandboxPath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list, mount, unmount))
}

/// The directory snapshots mounted in a sandbox: those given at create and those mounted
/// since, in that order.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/mounts", operation_id = "sandbox_mounts", tag = "snapshots",
    params(SandboxPath),
    responses((status = 200, description = "The mounts", body = SandboxMounts), Errors))]
async fn list(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<SandboxMounts>, ApiError> {
    Ok(Json(st.sandboxes.mounts(&id)?))
}

/// Mount a directory snapshot at a path of a running sandbox, copy-on-write: the sandbox
/// sees the snapshot's files there and its writes stay its own. A path that does not exist
/// is created; one that exists is hidden until the snapshot is unmounted.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/mounts", operation_id = "sandbox_mount", tag = "snapshots",
    params(SandboxPath), request_body = SnapshotMount,
    responses((status = 201, description = "Mounted", body = SnapshotMount), Errors))]
async fn mount(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<SnapshotMount>,
) -> Result<(StatusCode, Json<SnapshotMount>), ApiError> {
    let m = detached(async move { st.sandboxes.mount_snapshot(&id, req).await }).await?;
    Ok((StatusCode::CREATED, Json(m)))
}

/// Unmount the snapshot mounted at `path`: the sandbox's writes under it are discarded and
/// what the path held before shows again.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/mounts", operation_id = "sandbox_unmount", tag = "snapshots",
    params(SandboxPath, UnmountQuery),
    responses((status = 204, description = "Unmounted"), Errors))]
async fn unmount(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<UnmountQuery>,
) -> Result<StatusCode, ApiError> {
    detached(async move { st.sandboxes.unmount_snapshot(&id, &q.path).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
