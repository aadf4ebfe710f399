//! `/v1/info`, `/v1/doctor`, `/v1/images`, image builds and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use belljar_api::{DoctorReport, Image, ImageBuildEvent, Info};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::openapi::{self, Errors, ImagePath};
use super::stream::ndjson;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(info))
        .routes(routes!(doctor))
        .routes(routes!(openapi_json))
        .routes(routes!(images))
        .routes(routes!(build))
}

/// The daemon, its backends and images.
#[utoipa::path(get, path = "/v1/info", operation_id = "info", tag = "daemon",
    responses((status = 200, description = "What the daemon is and can do", body = Info), Errors))]
async fn info(State(st): State<AppState>) -> Json<Info> {
    let backends = st.sandboxes.backends();
    Json(Info {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        default_backend: backends.default,
        default_backend_reason: backends.default_reason.clone(),
        backends: backends.info(),
        images: st.images.list(),
        free_memory_mib: st.sandboxes.free_memory_mib(),
        pool: st.sandboxes.pool_info(),
    })
}

/// What this host offers Belljar and what is missing, each finding with the command that
/// fixes it: the checks of `belljar doctor`, run by the daemon (as its user), for the app's
/// settings. The overlayfs and network probes run in short-lived children of `belljard`.
#[utoipa::path(get, path = "/v1/doctor", operation_id = "doctor", tag = "daemon",
    responses((status = 200, description = "The host's findings", body = DoctorReport), Errors))]
async fn doctor(State(st): State<AppState>) -> Json<DoctorReport> {
    Json(belljar_doctor::gather(&st.dirs, &st.probe_exe).await)
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", operation_id = "openapi", tag = "daemon",
    responses((status = 200, description = "The OpenAPI document", body = Object), Errors))]
async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi::document())
}

/// The images and whether each is built.
#[utoipa::path(get, path = "/v1/images", operation_id = "images_list", tag = "images",
    responses((status = 200, description = "Every image", body = Vec<Image>), Errors))]
async fn images(State(st): State<AppState>) -> Json<Vec<Image>> {
    Json(st.images.list())
}

/// Build an image; progress streams as NDJSON.
#[utoipa::path(post, path = "/v1/images/{name}/build", operation_id = "image_build", tag = "images", params(ImagePath),
    responses((status = 200, description = "NDJSON of `ImageBuildEvent`", body = ImageBuildEvent,
        content_type = "application/x-ndjson"), Errors))]
async fn build(
    State(st): State<AppState>,
    ApiPath(ImagePath { name }): ApiPath<ImagePath>,
) -> Result<Response, ApiError> {
    Ok(ndjson(st.images.build(&name)?))
}
