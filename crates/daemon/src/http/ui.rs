//! Browser sessions and the web UI's files.
//!
//! `POST /v1/session/token` (Unix socket or bearer token) hands out a one-time token;
//! `GET /ui?token=` trades it for the `belljar_session` cookie and redirects to `/`. Every
//! other path outside `/v1` is a file of the built UI, with `index.html` for client-side
//! routes; when the UI is not built, `/` says how to build it.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use belljar_api::{SessionToken, Validate};
use serde::Deserialize;
use tower::ServiceExt;
use tower_http::services::{ServeDir, ServeFile};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{Caller, session_set_cookie};
use super::error::ApiError;
use super::extract::ApiQuery;
use super::openapi::Errors;

/// `POST /v1/session/token`, part of the API.
pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(session_token))
}

/// `GET /ui?token=`, outside the API: a browser's entry.
pub fn router() -> Router<AppState> {
    Router::new().route("/ui", get(ui_login))
}

/// A one-time token for `GET /ui?token=`, which trades it for the session cookie; needs the
/// bearer token (or the Unix socket).
#[utoipa::path(post, path = "/v1/session/token", operation_id = "session_token", tag = "daemon",
    responses((status = 200, description = "Valid once, for 60 seconds", body = SessionToken),
        Errors))]
async fn session_token(
    State(st): State<AppState>,
    caller: Option<Extension<Caller>>,
) -> Result<Json<SessionToken>, ApiError> {
    match caller.map(|Extension(c)| c) {
        Some(Caller::Unix | Caller::Bearer) => Ok(Json(SessionToken {
            token: st.auth.issue_one_time(),
        })),
        _ => Err(ApiError::Forbidden(
            "A session token needs the Unix socket or the bearer token".into(),
        )),
    }
}

#[derive(Deserialize)]
struct LoginQuery {
    token: String,
}

impl Validate for LoginQuery {}

async fn ui_login(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<LoginQuery>,
) -> Result<Response, ApiError> {
    let session = st.auth.redeem(&q.token).ok_or(ApiError::Unauthorized)?;
    Ok((
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, session_set_cookie(&session)),
            (header::LOCATION, "/".to_owned()),
        ],
    )
        .into_response())
}

/// Unknown `/v1` routes are JSON 404s; anything else is the UI.
pub async fn fallback(State(st): State<AppState>, req: Request) -> Response {
    let path = req.uri().path();
    if path == "/v1" || path.starts_with("/v1/") {
        return ApiError::NotFound(format!("No route {} {path}", req.method())).into_response();
    }
    let index = st.ui_dir.join("index.html");
    if !index.is_file() {
        return (
            StatusCode::NOT_FOUND,
            Html(format!(
                "<!doctype html><title>Belljar</title><h1>The Belljar web UI is not built</h1>\
                 <p>Build it with <code>npm --prefix ui ci &amp;&amp; npm --prefix ui run build</code> \
                 in the repository, or point <code>BELLJAR_UI_DIR</code> at a built UI \
                 (looked in <code>{}</code>).</p>",
                st.ui_dir.display()
            )),
        )
            .into_response();
    }
    match ServeDir::new(&st.ui_dir)
        .fallback(ServeFile::new(index))
        .oneshot(req)
        .await
    {
        Ok(resp) => resp.into_response(),
        Err(never) => match never {},
    }
}
