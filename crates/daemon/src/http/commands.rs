//! `/v1/sandboxes/{id}/commands`: run, list, get (and wait), logs, kill, stdin, resize.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use belljar_api::{Command, CommandList, KillCommand, PtySize, RunCommand};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};
use super::sandboxes::detached;
use super::stream::forward_body;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/commands", post(run).get(list))
        .route("/v1/sandboxes/{id}/commands/{cid}", get(get_one))
        .route("/v1/sandboxes/{id}/commands/{cid}/logs", get(logs))
        .route("/v1/sandboxes/{id}/commands/{cid}/kill", post(kill))
        .route("/v1/sandboxes/{id}/commands/{cid}/stdin", post(stdin))
        .route("/v1/sandboxes/{id}/commands/{cid}/resize", post(resize))
}

#[derive(Deserialize)]
struct WaitQuery {
    #[serde(default)]
    wait: bool,
}

#[derive(Deserialize)]
struct FollowQuery {
    #[serde(default)]
    follow: bool,
}

#[derive(Deserialize)]
struct CloseQuery {
    #[serde(default)]
    close: bool,
}

async fn run(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RunCommand>,
) -> Result<Json<Command>, ApiError> {
    Ok(Json(
        detached(async move { st.sandboxes.run_command(&id, req).await }).await?,
    ))
}

async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<CommandList>, ApiError> {
    Ok(Json(CommandList {
        commands: st.sandboxes.commands(&id)?,
    }))
}

async fn get_one(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<Command>, ApiError> {
    if q.wait {
        return Ok(Json(st.sandboxes.wait_command(&id, &cid).await?));
    }
    Ok(Json(st.sandboxes.command(&id, &cid)?))
}

async fn logs(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<FollowQuery>,
) -> Result<Response, ApiError> {
    let lines = st.sandboxes.command_logs(&id, &cid, q.follow)?;
    Ok((
        [(header::CONTENT_TYPE, belljar_api::routes::NDJSON)],
        Body::from_stream(lines),
    )
        .into_response())
}

async fn kill(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
    ApiJson(req): ApiJson<KillCommand>,
) -> Result<Json<Command>, ApiError> {
    Ok(Json(st.sandboxes.kill_command(&id, &cid, req).await?))
}

async fn stdin(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<CloseQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    st.sandboxes
        .write_stdin(&id, &cid, forward_body(body), q.close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn resize(
    State(st): State<AppState>,
    Path((id, cid)): Path<(String, String)>,
    ApiJson(size): ApiJson<PtySize>,
) -> Result<StatusCode, ApiError> {
    st.sandboxes.resize_command(&id, &cid, size).await?;
    Ok(StatusCode::NO_CONTENT)
}
