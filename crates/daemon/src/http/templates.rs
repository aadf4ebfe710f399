//! `/v1/templates`: an image plus the defaults of the sandboxes made from it, and the size
//! of its warm pool.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use belljar_api::{CreateTemplate, Template, TemplateList};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::openapi::{Errors, TemplatePath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(get_one, replace, remove))
}

/// Create a template over an image the daemon has (`image_not_available` otherwise;
/// `conflict` when the name is taken); its pool starts filling in the background.
#[utoipa::path(post, path = "/v1/templates", operation_id = "template_create", tag = "templates",
    request_body = CreateTemplate,
    responses((status = 201, description = "The template", body = Template), Errors))]
async fn create(
    State(st): State<AppState>,
    ApiJson(req): ApiJson<CreateTemplate>,
) -> Result<(StatusCode, Json<Template>), ApiError> {
    let t = detached(async move { st.sandboxes.create_template(req) }).await?;
    Ok((StatusCode::CREATED, Json(t)))
}

/// List the templates, by name, with their pools' state.
#[utoipa::path(get, path = "/v1/templates", operation_id = "template_list", tag = "templates",
    responses((status = 200, description = "Every template", body = TemplateList), Errors))]
async fn list(State(st): State<AppState>) -> Result<Json<TemplateList>, ApiError> {
    Ok(Json(st.sandboxes.templates()?))
}

/// Get a template, with its pool's state.
#[utoipa::path(get, path = "/v1/templates/{name}", operation_id = "template_get", tag = "templates",
    params(TemplatePath),
    responses((status = 200, description = "The template", body = Template), Errors))]
async fn get_one(
    State(st): State<AppState>,
    ApiPath(TemplatePath { name }): ApiPath<TemplatePath>,
) -> Result<Json<Template>, ApiError> {
    Ok(Json(st.sandboxes.template(&name)?))
}

/// Replace a template's image and defaults (the body's `name` is the template's): sandboxes
/// made from it stay as they are; its pool is made again to the new defaults.
#[utoipa::path(put, path = "/v1/templates/{name}", operation_id = "template_replace", tag = "templates",
    params(TemplatePath), request_body = CreateTemplate,
    responses((status = 200, description = "The template", body = Template), Errors))]
async fn replace(
    State(st): State<AppState>,
    ApiPath(TemplatePath { name }): ApiPath<TemplatePath>,
    ApiJson(req): ApiJson<CreateTemplate>,
) -> Result<Json<Template>, ApiError> {
    let t = detached(async move { st.sandboxes.replace_template(&name, req).await }).await?;
    Ok(Json(t))
}

/// Delete a template and destroy its pooled sandboxes; sandboxes made from it stay.
#[utoipa::path(delete, path = "/v1/templates/{name}", operation_id = "template_delete", tag = "templates",
    params(TemplatePath),
    responses((status = 204, description = "Deleted"), Errors))]
async fn remove(
    State(st): State<AppState>,
    ApiPath(TemplatePath { name }): ApiPath<TemplatePath>,
) -> Result<StatusCode, ApiError> {
    detached(async move { st.sandboxes.remove_template(&name).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
