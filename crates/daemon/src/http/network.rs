//! A sandbox's network: its firewall and byte totals, its flow log (NDJSON, followed live),
//! and its exposed ports. The policy is set at create and replaced whole, either by `PUT
//! /v1/sandboxes/{id}/network/policy` (here) or by `network_policy` in `PATCH
//! /v1/sandboxes/{id}`: both replace it whole (PATCH patches the sandbox, not the policy).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use belljar_api::{AddPort, FlowsQuery, NetworkFlow, NetworkInfo, NetworkPolicy, Port, PortList};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::openapi::{Errors, SandboxPath};
use super::sandboxes::detached;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(info))
        .routes(routes!(put_policy))
        .routes(routes!(flows))
        .routes(routes!(list_ports, add_port))
        .routes(routes!(remove_port))
}

/// `{id}/ports/{port}`: one exposed port of a sandbox.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PortPath {
    /// The sandbox's id.
    #[param(pattern = "^sbx_[a-z0-9]{1,64}$", max_length = 68)]
    pub id: String,
    /// The sandbox's TCP port.
    #[param(minimum = 1, maximum = 65535)]
    pub port: u32,
}

/// A sandbox's firewall (brokered values redacted), exposed ports and byte totals.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", operation_id = "network_get", tag = "network",
    params(SandboxPath),
    responses((status = 200, description = "The sandbox's network", body = NetworkInfo), Errors))]
async fn info(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<NetworkInfo>, ApiError> {
    Ok(Json(st.sandboxes.network_info(&id)?))
}

/// Replace the sandbox's firewall whole (what the body leaves out is gone, not kept). Open
/// flows the new policy denies are cut at once. A brokered header sent back as its redacted
/// value keeps the secret it had.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network/policy", operation_id = "network_policy_put", tag = "network",
    params(SandboxPath), request_body = NetworkPolicy,
    responses((status = 200, description = "The sandbox's network under the new policy", body = NetworkInfo), Errors))]
async fn put_policy(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(policy): ApiJson<NetworkPolicy>,
) -> Result<Json<NetworkInfo>, ApiError> {
    Ok(Json(st.sandboxes.put_network_policy(&id, &policy).await?))
}

/// The sandbox's flows, oldest first (the last 1000, kept across daemon restarts); with
/// `follow`, new ones as they are decided and again when they end.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network/flows", operation_id = "network_flows", tag = "network",
    params(SandboxPath, FlowsQuery),
    responses((status = 200, description = "NDJSON of `NetworkFlow`", body = NetworkFlow,
        content_type = "application/x-ndjson"), Errors))]
async fn flows(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiQuery(q): ApiQuery<FlowsQuery>,
) -> Result<Response, ApiError> {
    let flows = st.sandboxes.flows(&id, q.follow.unwrap_or(false))?;
    Ok(super::stream::ndjson(flows))
}

/// The sandbox's exposed ports.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", operation_id = "port_list", tag = "network",
    params(SandboxPath),
    responses((status = 200, description = "The ports", body = PortList), Errors))]
async fn list_ports(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
) -> Result<Json<PortList>, ApiError> {
    Ok(Json(st.sandboxes.ports(&id)?))
}

/// Expose a running sandbox's TCP port on 127.0.0.1 (kept across daemon restarts).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports", operation_id = "port_add", tag = "network",
    params(SandboxPath), request_body = AddPort,
    responses((status = 201, description = "The mapping", body = Port), Errors))]
async fn add_port(
    State(st): State<AppState>,
    ApiPath(SandboxPath { id }): ApiPath<SandboxPath>,
    ApiJson(req): ApiJson<AddPort>,
) -> Result<(StatusCode, Json<Port>), ApiError> {
    let port = detached(async move { st.sandboxes.add_port(&id, req).await }).await?;
    Ok((StatusCode::CREATED, Json(port)))
}

/// Stop exposing a port.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", operation_id = "port_remove", tag = "network",
    params(PortPath),
    responses((status = 204, description = "Removed"), Errors))]
async fn remove_port(
    State(st): State<AppState>,
    ApiPath(PortPath { id, port }): ApiPath<PortPath>,
) -> Result<StatusCode, ApiError> {
    detached(async move { st.sandboxes.remove_port(&id, port).await }).await?;
    Ok(StatusCode::NO_CONTENT)
}
