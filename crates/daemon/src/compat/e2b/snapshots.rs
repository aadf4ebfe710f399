//! Snapshots and forks through the control plane: a snapshot of a running sandbox (which
//! keeps running), the list of snapshots, deleting one (E2B deletes snapshots as templates)
//! and forks, over the daemon's snapshot and fork services. `Sandbox.create(template=SNAPSHOT)`
//! starts from a snapshot ([`super::control`]).

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use belljar_api::{CreateSnapshot, ForkSandbox, ListSnapshotsQuery, SnapshotStatus};

use super::connect;
use super::control::{created, live};
use super::error::{E2bError, Result};
use super::wire::{ForkRequest, ForkResult, SnapshotInfo, SnapshotRequest, SnapshotsQuery};
use crate::http::AppState;
use crate::http::error::ApiError;

/// The most forks one request makes.
const MAX_FORKS: u32 = 10;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sandboxes/{id}/snapshots", post(create))
        .route("/snapshots", get(list))
        .route("/templates/{id}", delete(remove))
        .route("/sandboxes/{id}/fork", post(fork))
}

fn internal(e: impl std::fmt::Display) -> E2bError {
    E2bError::Api(ApiError::Internal(e.to_string()))
}

async fn create(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response> {
    let _req: SnapshotRequest = connect::unary(body).await?;
    live(&st, &id)?;
    let sandboxes = st.sandboxes.clone();
    let req = CreateSnapshot {
        keep_running: Some(true),
        ..CreateSnapshot::default()
    };
    let snap = tokio::spawn(async move { sandboxes.snapshot(&id, req).await })
        .await
        .map_err(internal)??;
    let info = SnapshotInfo {
        snapshot_id: snap.id,
        names: Vec::new(),
    };
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn list(
    State(st): State<AppState>,
    q: std::result::Result<Query<SnapshotsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let q = q
        .map_err(|e| E2bError::BadRequest(format!("query: {}", e.body_text())))?
        .0;
    let page = st.sandboxes.list_snapshots(&ListSnapshotsQuery {
        sandbox_id: q.sandbox_id.filter(|s| !s.is_empty()),
        limit: Some(q.limit.unwrap_or(100).clamp(1, 200)),
        cursor: q.next_token.filter(|t| !t.is_empty()),
        ..ListSnapshotsQuery::default()
    })?;
    let infos: Vec<SnapshotInfo> = page
        .snapshots
        .into_iter()
        .filter(|s| s.status == SnapshotStatus::Created)
        .map(|s| SnapshotInfo {
            snapshot_id: s.id,
            names: Vec::new(),
        })
        .collect();
    let mut resp = Json(infos).into_response();
    if let Some(next) = page.next_cursor
        && let Ok(v) = HeaderValue::from_str(&next)
    {
        resp.headers_mut().insert("x-next-token", v);
    }
    Ok(resp)
}

/// Deletes a snapshot; templates that are images are not deleted here.
async fn remove(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    if !id.starts_with("snap_") {
        return Err(E2bError::NotImplemented(
            "Deleting templates other than snapshots".into(),
        ));
    }
    // A deleted snapshot stays listed by the daemon; to E2B it is gone.
    if st.sandboxes.get_snapshot(&id)?.status == SnapshotStatus::Deleted {
        return Err(E2bError::NotFound(format!("Snapshot {id} not found")));
    }
    let sandboxes = st.sandboxes.clone();
    tokio::spawn(async move { sandboxes.delete_snapshot(&id).await })
        .await
        .map_err(internal)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn fork(State(st): State<AppState>, Path(id): Path<String>, body: Body) -> Result<Response> {
    let req: ForkRequest = connect::unary(body).await?;
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(E2bError::BadRequest(format!(
            "count: must be 1..={MAX_FORKS}"
        )));
    }
    let timeout_ms = match req.timeout {
        None => None,
        Some(t) if t > 0 => Some(t.saturating_mul(1000)),
        Some(_) => {
            return Err(E2bError::BadRequest(
                "timeout: must be positive seconds".into(),
            ));
        }
    };
    live(&st, &id)?;
    let mut results = Vec::new();
    for _ in 0..count {
        let (sandboxes, sid) = (st.sandboxes.clone(), id.clone());
        let fork = ForkSandbox {
            timeout_ms,
            ..ForkSandbox::default()
        };
        let made = tokio::spawn(async move { sandboxes.fork(&sid, fork).await })
            .await
            .map_err(internal)?;
        results.push(match made {
            Ok(s) => ForkResult {
                sandbox: Some(created(&s, st.auth.token())),
                error: None,
            },
            Err(e) => {
                let (status, _, message) = E2bError::from(e).parts();
                ForkResult {
                    sandbox: None,
                    error: Some(super::wire::ApiErrorBody {
                        code: status.as_u16(),
                        message,
                    }),
                }
            }
        });
    }
    Ok((StatusCode::CREATED, Json(results)).into_response())
}
