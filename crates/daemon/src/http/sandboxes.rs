//! `/v1/sandboxes`: create, list, get, update, extend, stop, delete.
//!
//! Changes run in their own task, so a client that disconnects mid-request cannot leave a
//! sandbox half created or half stopped.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use belljar_api::{
    CreateSandbox, ExtendSandbox, ListSandboxesQuery, Sandbox, SandboxList, UpdateSandbox,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{Errors, SandboxPath};
use crate::sandbox::volumes::MountAuthority;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get_one, update, delete))
        .routes(routes!(extend))
        .routes(routes!(stop))
}

/// Runs `fut` to completion even if the client goes away.
pub async fn detached<T: Send + 'static>(
    fut: impl Future<Output = Result<T, crate::sandbox::SandboxError>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(fut)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(ApiError::from)
}

/// Create a sandbox; it is running when this answers.
#[utoipa::path(post, path = "/v1/sandboxes", operation_id = "sandbox_create", tag = "sandboxes", request_body = CreateSandbox,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "1 to 255 visible ASCII characters; a second request with the same key returns the sandbox the first one created")),
    responses((status = 201, description = "The running sandbox", body = Sandbox), Errors))]
async fn create(
    State(st): State<AppState>,
    headers: HeaderMap,
    peer: Option<axum::Extension<super::auth::UnixPeer>>,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> Result<(StatusCode, Json<Sandbox>), ApiError> {
    // A key that is not visible ASCII is passed on as an empty one, which the check refuses.
    let key = headers
        .get(belljar_api::IDEMPOTENCY_KEY_HEADER)
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let who = match peer.and_then(|p| p.0.uid) {
        Some(uid) => MountAuthority::Uid(uid),
        None => MountAuthority::Tcp,
    };
    let s = detached(async move { st.sandboxes.create_as(req, key, who).await }).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

/// List sandboxes, newest first.
#[utoipa::path(get, path = "/v1/sandboxes", operation_id = "sandbox_list", tag = "sandboxes", params(ListSandboxesQuery),
    responses((status = 200, description = "One page", body = SandboxList), Errors))]
async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListSandboxesQuery>,
) -> Result<Json<SandboxList>, ApiError> {
    Ok(Json(st.sandboxes.list(&q)?))
}

/// Get a sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", operation_id = "sandbox_get", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "The sandbox", body = Sandbox), Errors))]
async fn get_one(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(st.sandboxes.get(&id)?))
}

/// Replace a sandbox's tags or name.
#[utoipa::path(patch, path = "/v1/sandboxes/{id}", operation_id = "sandbox_update", tag = "sandboxes", params(SandboxPath),
    request_body = UpdateSandbox,
    responses((status = 200, description = "The changed sandbox", body = Sandbox), Errors))]
async fn update(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<UpdateSandbox>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(st.sandboxes.update(&id, req).await?))
}

/// Add time to a running sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/extend", operation_id = "sandbox_extend", tag = "sandboxes", params(SandboxPath),
    request_body = ExtendSandbox,
    responses((status = 200, description = "The sandbox", body = Sandbox), Errors))]
async fn extend(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<ExtendSandbox>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(st.sandboxes.extend(&id, req).await?))
}

/// Stop a sandbox (its record stays).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/stop", operation_id = "sandbox_stop", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "The stopped sandbox", body = Sandbox), Errors))]
async fn stop(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<Sandbox>, ApiError> {
    let s = detached(async move { st.sandboxes.stop(&id).await }).await?;
    Ok(Json(s))
}

/// Stop and delete a sandbox.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", operation_id = "sandbox_delete", tag = "sandboxes", params(SandboxPath),
    responses((status = 204, description = "Deleted"), Errors))]
async fn delete(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<StatusCode, ApiError> {
    detached(async move { st.sandboxes.delete(&id).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
