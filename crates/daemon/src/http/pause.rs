//! `POST /v1/sandboxes/{id}/pause`, `/resume`, `/fork` and `/start`: freeze a sandbox's
//! processes where they are, let them run on, start a new sandbox from its current files, or
//! start a stopped persistent sandbox again from its latest snapshot.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use belljar_api::{ForkSandbox, Sandbox};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::openapi::{Errors, SandboxPath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(fork))
        .routes(routes!(start))
}

/// Start a stopped persistent sandbox again: the same sandbox (id, name, tags, settings)
/// on its latest snapshot. A running one is returned as it is; a paused one is resumed.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/start", operation_id = "sandbox_start", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "The sandbox, status `running`", body = Sandbox), Errors))]
async fn start(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(
        detached(async move { st.sandboxes.start(&id).await }).await?,
    ))
}

/// Pause a running sandbox: its processes stay in memory, frozen, until it is resumed.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", operation_id = "sandbox_pause", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "The sandbox, status `paused`", body = Sandbox), Errors))]
async fn pause(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(
        detached(async move { st.sandboxes.pause(&id).await }).await?,
    ))
}

/// Resume a paused sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", operation_id = "sandbox_resume", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "The sandbox, status `running`", body = Sandbox), Errors))]
async fn resume(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(
        detached(async move { st.sandboxes.resume(&id).await }).await?,
    ))
}

/// Fork a running or paused sandbox: a new running sandbox with its current files (a live
/// snapshot underneath) and its configuration, changed by the body. A paused source with
/// `auto_resume` is resumed first; without, it is forked as it stands and stays paused.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", operation_id = "sandbox_fork", tag = "sandboxes", params(SandboxPath),
    request_body = ForkSandbox,
    responses((status = 201, description = "The new running sandbox", body = Sandbox), Errors))]
async fn fork(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<ForkSandbox>,
) -> Result<(StatusCode, Json<Sandbox>), ApiError> {
    let s = detached(async move { st.sandboxes.fork(&id, req).await }).await?;
    Ok((StatusCode::CREATED, Json(s)))
}
