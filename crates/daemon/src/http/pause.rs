//! `POST /v1/sandboxes/{id}/pause` and `/resume`: freeze a sandbox's processes where they
//! are, and let them run on.

use axum::Json;
use axum::extract::State;
use belljar_api::Sandbox;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::openapi::{Errors, SandboxPath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(pause))
        .routes(routes!(resume))
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
