//! `/v1/sandboxes/{id}/commands`: run, list, get (and wait), logs, kill, stdin, resize.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use belljar_api::{
    Command, CommandList, IDEMPOTENCY_KEY_HEADER, KillCommand, LogLine, PtySize, RunCommand,
    Validate,
};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{CommandPath, Errors, RawBytes, SandboxPath};
use super::sandboxes::detached;
use super::stream::forward_body;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(run, list))
        .routes(routes!(get_one))
        .routes(routes!(logs))
        .routes(routes!(kill))
        .routes(routes!(stdin))
        .routes(routes!(resize))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WaitQuery {
    /// Answer only once the command has exited.
    #[serde(default)]
    wait: bool,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct FollowQuery {
    /// Keep the answer open and stream output until the command exits.
    #[serde(default)]
    follow: bool,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct CloseQuery {
    /// Close the command's stdin after this body.
    #[serde(default)]
    close: bool,
}

impl Validate for WaitQuery {}
impl Validate for FollowQuery {}
impl Validate for CloseQuery {}

/// Run a command; it has exited when this answers, unless `detached`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", operation_id = "command_run", tag = "commands",
    params(SandboxPath, ("Idempotency-Key" = Option<String>, Header,
        description = "1 to 255 visible ASCII characters; a second request with the same key returns the command the first one started")),
    request_body = RunCommand,
    responses((status = 200, description = "The command", body = Command), Errors))]
async fn run(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<RunCommand>,
) -> Result<Json<Command>, ApiError> {
    // A key that is not visible ASCII is passed on as an empty one, which the check refuses.
    let key = headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    Ok(Json(
        detached(async move { st.sandboxes.run_command(&id, req, key).await }).await?,
    ))
}

/// A sandbox's commands, newest first.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands", operation_id = "command_list", tag = "commands", params(SandboxPath),
    responses((status = 200, description = "The commands", body = CommandList), Errors))]
async fn list(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<CommandList>, ApiError> {
    Ok(Json(CommandList {
        commands: st.sandboxes.commands(&id)?,
    }))
}

/// Get a command, or wait for it to exit.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}", operation_id = "command_get", tag = "commands",
    params(CommandPath, WaitQuery),
    responses((status = 200, description = "The command", body = Command), Errors))]
async fn get_one(
    State(st): State<AppState>,
    ApiPath(CommandPath { id, cid }): ApiPath<CommandPath>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<Command>, ApiError> {
    if q.wait {
        return Ok(Json(st.sandboxes.wait_command(&id, &cid).await?));
    }
    Ok(Json(st.sandboxes.command(&id, &cid)?))
}

/// A command's output, one `LogLine` per line.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{cid}/logs", operation_id = "command_logs", tag = "commands",
    params(CommandPath, FollowQuery),
    responses((status = 200, description = "NDJSON of `LogLine`", body = LogLine,
        content_type = "application/x-ndjson"), Errors))]
async fn logs(
    State(st): State<AppState>,
    ApiPath(CommandPath { id, cid }): ApiPath<CommandPath>,
    ApiQuery(q): ApiQuery<FollowQuery>,
) -> Result<Response, ApiError> {
    let lines = st.sandboxes.command_logs(&id, &cid, q.follow)?;
    Ok((
        [(header::CONTENT_TYPE, belljar_api::routes::NDJSON)],
        Body::from_stream(lines),
    )
        .into_response())
}

/// Send a command a signal.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/kill", operation_id = "command_kill", tag = "commands",
    params(CommandPath), request_body = KillCommand,
    responses((status = 200, description = "The command", body = Command), Errors))]
async fn kill(
    State(st): State<AppState>,
    ApiPath(CommandPath { id, cid }): ApiPath<CommandPath>,
    ApiJson(req): ApiJson<KillCommand>,
) -> Result<Json<Command>, ApiError> {
    Ok(Json(st.sandboxes.kill_command(&id, &cid, req).await?))
}

/// Write bytes to a command's stdin (started with `stdin: true`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/stdin", operation_id = "command_stdin", tag = "commands",
    params(CommandPath, CloseQuery),
    request_body(content = RawBytes, content_type = "application/octet-stream"),
    responses((status = 204, description = "Written"), Errors))]
async fn stdin(
    State(st): State<AppState>,
    ApiPath(CommandPath { id, cid }): ApiPath<CommandPath>,
    ApiQuery(q): ApiQuery<CloseQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    st.sandboxes
        .write_stdin(&id, &cid, forward_body(body), q.close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resize a command's pseudo-terminal.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{cid}/resize", operation_id = "command_resize", tag = "commands",
    params(CommandPath), request_body = PtySize,
    responses((status = 204, description = "Resized"), Errors))]
async fn resize(
    State(st): State<AppState>,
    ApiPath(CommandPath { id, cid }): ApiPath<CommandPath>,
    ApiJson(size): ApiJson<PtySize>,
) -> Result<StatusCode, ApiError> {
    st.sandboxes.resize_command(&id, &cid, size).await?;
    Ok(StatusCode::NO_CONTENT)
}
