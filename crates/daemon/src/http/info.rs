//! `/v1/info`, `/v1/doctor`, `/v1/images`, image builds and the OpenAPI document.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belljar_api::{
    DoctorReport, Image, ImageBuildEvent, ImportQuery, Info, PruneImages, PrunedImages, PullImage,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{self, Errors, ImagePath, RawBytes};
use super::spool::spool;
use super::stream::ndjson;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(info))
        .routes(routes!(doctor))
        .routes(routes!(openapi_json))
        .routes(routes!(images))
        .routes(routes!(build))
        .routes(routes!(pull))
        .routes(routes!(import))
        .routes(routes!(remove))
        .routes(routes!(prune))
        .routes(routes!(export))
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

/// Pull an image from a registry into the image store; progress streams as NDJSON, ending
/// with `done` (the image) or `error` (its stable code and the registry's answer).
#[utoipa::path(post, path = "/v1/images/pull", operation_id = "image_pull", tag = "images",
    request_body = PullImage,
    responses((status = 200, description = "NDJSON of `ImageBuildEvent`", body = ImageBuildEvent,
        content_type = "application/x-ndjson"), Errors))]
async fn pull(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<PullImage>,
) -> Result<Response, ApiError> {
    Ok(ndjson(
        st.images
            .pull(&req.reference, req.insecure.unwrap_or(false))?,
    ))
}

/// Import a `docker save` / `podman save` archive or an OCI layout (as a tar), sent as the
/// body; NDJSON progress ends with one `done` per image the archive holds, or `error`.
#[utoipa::path(post, path = "/v1/images/import", operation_id = "image_import", tag = "images",
    params(ImportQuery),
    request_body(content = RawBytes, content_type = "application/x-tar"),
    responses((status = 200, description = "NDJSON of `ImageBuildEvent`", body = ImageBuildEvent,
        content_type = "application/x-ndjson"), Errors))]
async fn import(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ImportQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let tags: Vec<String> = q.tag.into_iter().collect();
    for t in &tags {
        belljar_oci::Reference::parse(t).map_err(crate::images::ImageError::from)?;
    }
    let dir = st.images.scratch_dir()?;
    let path = dir.join(format!(
        "{}upload-{}.tar",
        belljar_oci::store::scratch_prefix(),
        crate::util::new_id("imp")
    ));
    spool(body, &path, st.images.cap_bytes()).await?;
    Ok(ndjson(st.images.import(path, tags, true)?))
}

/// Remove the images nothing stands on: unnamed ones, and as asked every named one of the
/// user's and the Dockerfile step cache.
#[utoipa::path(post, path = "/v1/images/prune", operation_id = "images_prune", tag = "images",
    request_body = PruneImages,
    responses((status = 200, description = "What was removed", body = PrunedImages), Errors))]
async fn prune(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<PruneImages>,
) -> Result<Json<PrunedImages>, ApiError> {
    let images = st.images.clone();
    let pruned = tokio::task::spawn_blocking(move || images.prune(&req))
        .await
        .map_err(|e| ApiError::Internal(format!("prune: {e}")))??;
    Ok(Json(pruned))
}

/// Export a user's image as an OCI archive (an OCI layout as a tar, with Docker's
/// `manifest.json` too: `podman load`, `docker load` and `belljar images import` read it).
#[utoipa::path(get, path = "/v1/images/{name}/export", operation_id = "image_export", tag = "images", params(ImagePath),
    responses((status = 200, description = "The archive", body = RawBytes,
        content_type = "application/x-tar"), Errors))]
async fn export(
    State(st): State<AppState>,
    ApiPath(ImagePath { name }): ApiPath<ImagePath>,
) -> Result<Response, ApiError> {
    let images = st.images.clone();
    let (file, len) = tokio::task::spawn_blocking(move || images.export(&name))
        .await
        .map_err(|e| ApiError::Internal(format!("export: {e}")))??;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/x-tar".to_owned(),
            ),
            (axum::http::header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Remove a pulled or imported image's name; the image goes with its last name.
#[utoipa::path(delete, path = "/v1/images/{name}", operation_id = "image_remove", tag = "images", params(ImagePath),
    responses((status = 204, description = "Removed"), Errors))]
async fn remove(
    State(st): State<AppState>,
    ApiPath(ImagePath { name }): ApiPath<ImagePath>,
) -> Result<StatusCode, ApiError> {
    st.images.remove(&name)?;
    Ok(StatusCode::NO_CONTENT)
}
