//! `/v1/volumes`: named volumes, which outlive the sandboxes that mount them.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use belljar_api::{CreateVolume, Volume, VolumeList};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::openapi::{Errors, VolumePath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get_one, remove))
}

/// Create a named volume, optionally with a size the kernel enforces.
#[utoipa::path(post, path = "/v1/volumes", operation_id = "volume_create", tag = "volumes",
    request_body = CreateVolume,
    responses((status = 201, description = "The volume", body = Volume), Errors))]
async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), ApiError> {
    let v = detached(async move { st.sandboxes.create_volume(req).await }).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// List the volumes, by name.
#[utoipa::path(get, path = "/v1/volumes", operation_id = "volume_list", tag = "volumes",
    responses((status = 200, description = "Every volume", body = VolumeList), Errors))]
async fn list(State(st): State<AppState>) -> Result<Json<VolumeList>, ApiError> {
    Ok(Json(st.sandboxes.list_volumes()?))
}

/// Get a volume, with the sandboxes that mount it.
#[utoipa::path(get, path = "/v1/volumes/{name}", operation_id = "volume_get", tag = "volumes",
    params(VolumePath),
    responses((status = 200, description = "The volume", body = Volume), Errors))]
async fn get_one(
    State(st): State<AppState>,
    ApiPath(VolumePath { name }): ApiPath<VolumePath>,
) -> Result<Json<Volume>, ApiError> {
    Ok(Json(st.sandboxes.volume(&name)?))
}

/// Delete a volume and its files; `volume_in_use` while a sandbox mounts it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", operation_id = "volume_delete", tag = "volumes",
    params(VolumePath),
    responses((status = 204, description = "Deleted"), Errors))]
async fn remove(
    State(st): State<AppState>,
    ApiPath(VolumePath { name }): ApiPath<VolumePath>,
) -> Result<StatusCode, ApiError> {
    detached(async move { st.sandboxes.remove_volume(&name).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
