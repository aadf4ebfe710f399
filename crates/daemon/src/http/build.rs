//! `POST /v1/images/build`: a Dockerfile build of the context sent as a tar body.

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use belljar_api::{BuildQuery, ImageBuildEvent};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::openapi::{Errors, RawBytes};
use super::spool::spool;
use super::stream::ndjson;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(build_dockerfile))
}

/// Build an image from a Dockerfile; the context is the body (a tar, holding the
/// Dockerfile). NDJSON progress: a `step` per instruction (`cached` when the step cache had
/// it), the `RUN` commands' output as `progress`, then `done` (the image) or `error`.
#[utoipa::path(post, path = "/v1/images/build", operation_id = "image_build_dockerfile", tag = "images",
    params(BuildQuery),
    request_body(content = RawBytes, content_type = "application/x-tar"),
    responses((status = 200, description = "NDJSON of `ImageBuildEvent`", body = ImageBuildEvent,
        content_type = "application/x-ndjson"), Errors))]
async fn build_dockerfile(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<BuildQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let build_args = match q.build_args.as_deref() {
        None | Some("") => Default::default(),
        Some(a) => serde_json::from_str(a).map_err(|e| {
            ApiError::BadRequest(format!("build_args: not a JSON object of strings: {e}"))
        })?,
    };
    belljar_oci::Reference::parse(&q.tag).map_err(crate::images::ImageError::from)?;
    let path = st.images.scratch_dir()?.join(format!(
        "{}context-{}.tar",
        belljar_oci::store::scratch_prefix(),
        crate::util::new_id("bld")
    ));
    spool(body, &path, st.images.cap_bytes()).await?;
    let req = crate::build::BuildRequest {
        tag: q.tag,
        dockerfile: q.dockerfile.unwrap_or_else(|| "Dockerfile".into()),
        build_args,
        no_cache: q.no_cache.unwrap_or(false),
    };
    match crate::build::start(&st.images, &st.sandboxes, path.clone(), req) {
        Ok(events) => Ok(ndjson(events)),
        Err(e) => {
            let _ = tokio::fs::remove_file(&path).await;
            Err(e.into())
        }
    }
}
