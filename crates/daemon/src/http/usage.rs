//! `GET /v1/sandboxes/{id}/usage`: what a sandbox uses now (memory, CPU time, processes), as
//! the host measures it; E2B's `getMetrics`.

use axum::Json;
use axum::extract::State;
use belljar_api::SandboxUsage;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::openapi::{Errors, SandboxPath};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(usage))
}

/// A running or paused sandbox's memory, CPU time and processes, measured now by the host
/// (a paused sandbox stays paused). A figure the host cannot know on the sandbox's backend
/// is `null`. A sandbox that does not run answers 409 `sandbox_not_running`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/usage", operation_id = "sandbox_usage", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "The sandbox's usage now", body = SandboxUsage), Errors))]
async fn usage(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<SandboxUsage>, ApiError> {
    Ok(Json(st.sandboxes.usage(&id).await?))
}
