//! `/v1/sandboxes`: create, list, get, update, extend, stop, delete.
//!
//! Changes run in their own task, so a client that disconnects mid-request cannot leave a
//! sandbox half created or half stopped.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use belljar_api::{
    CreateSandbox, ExtendSandbox, ListSandboxesQuery, Sandbox, SandboxList, UpdateSandbox,
};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes", post(create).get(list))
        .route(
            "/v1/sandboxes/{id}",
            get(get_one).patch(update).delete(delete),
        )
        .route("/v1/sandboxes/{id}/extend", post(extend))
        .route("/v1/sandboxes/{id}/stop", post(stop))
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

async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> Result<(StatusCode, Json<Sandbox>), ApiError> {
    let s = detached(async move { st.sandboxes.create(req).await }).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListSandboxesQuery>,
) -> Result<Json<SandboxList>, ApiError> {
    Ok(Json(st.sandboxes.list(&q)?))
}

async fn get_one(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(st.sandboxes.get(&id)?))
}

async fn update(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateSandbox>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(st.sandboxes.update(&id, req).await?))
}

async fn extend(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExtendSandbox>,
) -> Result<Json<Sandbox>, ApiError> {
    Ok(Json(st.sandboxes.extend(&id, req).await?))
}

async fn stop(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Sandbox>, ApiError> {
    let s = detached(async move { st.sandboxes.stop(&id).await }).await?;
    Ok(Json(s))
}

async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    detached(async move { st.sandboxes.delete(&id).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
