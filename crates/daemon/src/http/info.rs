//! `/v1/info`, `/v1/images`, image builds and the OpenAPI document.

use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use belljar_api::{Image, Info};

use super::AppState;
use super::error::ApiError;
use super::openapi;
use super::stream::ndjson;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/info", get(info))
        .route("/v1/openapi.json", get(openapi_json))
        .route("/v1/images", get(images))
        .route("/v1/images/{name}/build", post(build))
}

async fn info(State(st): State<AppState>) -> Json<Info> {
    let backends = st.sandboxes.backends();
    Json(Info {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        default_backend: backends.default,
        default_backend_reason: backends.default_reason.clone(),
        backends: backends.info(),
        images: st.images.list(),
        free_memory_mib: st.sandboxes.free_memory_mib(),
    })
}

async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi::document())
}

async fn images(State(st): State<AppState>) -> Json<Vec<Image>> {
    Json(st.images.list())
}

async fn build(State(st): State<AppState>, Path(name): Path<String>) -> Result<Response, ApiError> {
    Ok(ndjson(st.images.build(&name)?))
}
