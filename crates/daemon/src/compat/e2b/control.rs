//! E2B's control plane: create (template → image), list (metadata and state filters, paged
//! by `x-next-token`), get, kill, set the timeout, pause and connect (which resumes a paused
//! sandbox), over the daemon's sandbox service. An E2B sandbox is a daemon sandbox with the
//! same id; its metadata are the sandbox's tags.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use belljar_api::{
    CreateSandbox, ExtendSandbox, ListSandboxesQuery, NetworkMode, NetworkPolicy, RunCommand,
    Sandbox, SandboxStatus, Validate,
};

use super::error::{E2bError, Result};
use super::wire::{
    ConnectRequest, CreatedSandbox, ListQuery, NewSandbox, SandboxDetail, TimeoutRequest,
};
use super::{ENVD_VERSION, connect, rfc3339, setup};
use crate::http::AppState;
use crate::http::error::ApiError;

/// E2B's default template, which is Belljar's `base` image too.
const DEFAULT_TEMPLATE: &str = "base";

/// The header that carries the next page's token.
const NEXT_TOKEN: &str = "x-next-token";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(connect_one))
        .route("/sandboxes/{id}/connect", post(connect_one))
        .route("/v2/sandboxes/{id}/connect", post(connect_one))
        .route("/sandboxes/{id}/metrics", get(not_yet))
        .route("/sandboxes/{id}/snapshots", post(not_yet))
        .route("/sandboxes/{id}/fork", post(not_yet))
        .route("/sandboxes/{id}/network", axum::routing::put(not_yet))
        .route("/sandboxes/{id}/refreshes", post(not_yet))
        .route("/templates/{id}", delete(not_yet))
}

async fn not_yet() -> E2bError {
    E2bError::NotImplemented("This E2B API route".into())
}

async fn json<T: serde::de::DeserializeOwned>(body: Body) -> Result<T> {
    connect::unary(body).await
}

fn created(s: &Sandbox, token: &str) -> CreatedSandbox {
    CreatedSandbox {
        template_id: s.image.clone(),
        sandbox_id: s.id.clone(),
        client_id: "belljar",
        envd_version: ENVD_VERSION,
        envd_access_token: token.to_owned(),
        domain: None,
    }
}

fn detail(s: &Sandbox) -> SandboxDetail {
    let started = s.started_at.unwrap_or(s.created_at);
    SandboxDetail {
        template_id: s.image.clone(),
        sandbox_id: s.id.clone(),
        client_id: "belljar",
        alias: s.name.clone(),
        started_at: rfc3339(started),
        end_at: rfc3339(s.expires_at.unwrap_or(started + s.timeout_ms)),
        envd_version: ENVD_VERSION,
        cpu_count: s.vcpus,
        memory_mb: s.memory_mib,
        disk_size_mb: s.disk_mib,
        state: if s.status == SandboxStatus::Paused {
            "paused"
        } else {
            "running"
        },
        metadata: s.tags.clone(),
    }
}

/// A sandbox E2B would show: running or paused (stopped and failed ones are gone to E2B).
fn live(st: &AppState, id: &str) -> Result<Sandbox> {
    let s = st.sandboxes.get(id)?;
    if matches!(
        s.status,
        SandboxStatus::Running | SandboxStatus::Paused | SandboxStatus::Pending
    ) {
        Ok(s)
    } else {
        Err(E2bError::NotFound(format!("Sandbox {id} not found")))
    }
}

fn request(req: NewSandbox) -> Result<CreateSandbox> {
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(E2bError::NotImplemented("volumeMounts".into()));
    }
    if req.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(E2bError::NotImplemented("mcp".into()));
    }
    if let Some(n) = &req.network
        && (n.allow_out.as_ref().is_some_and(|v| !v.is_empty())
            || n.deny_out.as_ref().is_some_and(|v| !v.is_empty()))
    {
        return Err(E2bError::NotImplemented(
            "network allowOut and denyOut".into(),
        ));
    }
    let timeout_ms = match req.timeout {
        None => None,
        Some(t) if t > 0 => Some(t.saturating_mul(1000)),
        Some(t) => {
            return Err(E2bError::BadRequest(format!(
                "timeout: must be positive seconds, not {t}"
            )));
        }
    };
    let image = req
        .template_id
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| DEFAULT_TEMPLATE.into());
    let network_policy = (req.allow_internet_access == Some(false))
        .then_some(NetworkPolicy::Mode(NetworkMode::DenyAll));
    let create = CreateSandbox {
        image: Some(image),
        timeout_ms,
        env: req.env_vars.filter(|e| !e.is_empty()),
        tags: req.metadata.filter(|m| !m.is_empty()),
        network_policy,
        ..CreateSandbox::default()
    };
    create
        .validate()
        .map_err(|e| E2bError::BadRequest(e.to_string()))?;
    Ok(create)
}

async fn create(State(st): State<AppState>, body: Body) -> Result<Response> {
    let create = request(json::<NewSandbox>(body).await?)?;
    let sandboxes = st.sandboxes.clone();
    // In its own task: a client that goes away cannot leave a sandbox half set up.
    let sandbox = tokio::spawn(async move {
        let sandbox = sandboxes.create(create).await?;
        let run = RunCommand {
            argv: vec!["sh".into(), "-c".into(), setup::SETUP.into()],
            sudo: true,
            ..RunCommand::default()
        };
        match sandboxes.run_command(&sandbox.id, run, None).await {
            Ok(c) if c.exit_code == Some(0) => Ok(sandboxes.get(&sandbox.id)?),
            other => {
                let why = match other {
                    Ok(c) => format!("exit status {:?}", c.exit_code),
                    Err(e) => e.to_string(),
                };
                let _ = sandboxes.delete(&sandbox.id).await;
                Err(E2bError::Api(ApiError::Internal(format!(
                    "setting up the sandbox's user failed: {why}"
                ))))
            }
        }
    })
    .await
    .map_err(|e| E2bError::Api(ApiError::Internal(e.to_string())))??;
    Ok((
        StatusCode::CREATED,
        Json(created(&sandbox, st.auth.token())),
    )
        .into_response())
}

/// `metadata=k%3Dv%26k2%3Dv2`: each pair must match a tag.
fn metadata_filter(raw: Option<&str>) -> Result<BTreeMap<String, String>> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(BTreeMap::new());
    };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

/// `%XX` and `+` undone, as a form encoding writes them.
fn percent_decode(s: &str) -> Result<String> {
    let bad = || E2bError::BadRequest(format!("metadata: {s:?} is not URL-encoded"));
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next().ok_or_else(bad)?, bytes.next().ok_or_else(bad)?];
                let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

async fn list(
    State(st): State<AppState>,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let q = query
        .map_err(|e| E2bError::BadRequest(format!("query: {}", e.body_text())))?
        .0;
    let wanted = metadata_filter(q.metadata.as_deref())?;
    let states: Vec<&str> = match q.state.as_deref() {
        None | Some("") => vec!["running", "paused"],
        Some(s) => s.split(',').map(str::trim).collect(),
    };
    if let Some(bad) = states.iter().find(|s| !["running", "paused"].contains(s)) {
        return Err(E2bError::BadRequest(format!(
            "state: {bad:?} is not running or paused"
        )));
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 200);
    let mut out = Vec::new();
    let mut cursor = q.next_token.filter(|t| !t.is_empty());
    // The daemon's pages hold stopped sandboxes too; read on until this page is full.
    let next = loop {
        let page = st.sandboxes.list(&ListSandboxesQuery {
            limit: Some(limit),
            cursor: cursor.clone(),
            ..ListSandboxesQuery::default()
        })?;
        for s in &page.sandboxes {
            let d = detail(s);
            let shown = matches!(
                s.status,
                SandboxStatus::Running | SandboxStatus::Paused | SandboxStatus::Pending
            ) && states.contains(&d.state)
                && wanted.iter().all(|(k, v)| s.tags.get(k) == Some(v));
            if shown {
                out.push(d);
            }
        }
        match page.next_cursor {
            Some(c) if out.len() < limit as usize => cursor = Some(c),
            other => break other,
        }
    };
    let mut resp = Json(out).into_response();
    if let Some(next) = next
        && let Ok(v) = HeaderValue::from_str(&next)
    {
        resp.headers_mut().insert(NEXT_TOKEN, v);
    }
    Ok(resp)
}

async fn get_one(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    Ok(Json(detail(&live(&st, &id)?)).into_response())
}

async fn kill(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    live(&st, &id)?;
    let sandboxes = st.sandboxes.clone();
    tokio::spawn(async move { sandboxes.delete(&id).await })
        .await
        .map_err(|e| E2bError::Api(ApiError::Internal(e.to_string())))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Makes the sandbox end `seconds` from now. The daemon's timeout only grows, so a shorter
/// one than what is left is kept as it is.
async fn extend_to(st: &AppState, s: &Sandbox, seconds: i64) -> Result<()> {
    if seconds <= 0 {
        return Err(E2bError::BadRequest(
            "timeout: must be positive seconds".into(),
        ));
    }
    let now = crate::compat::vercel::token::now().saturating_mul(1000);
    let wanted_end = now.saturating_add(seconds.saturating_mul(1000));
    let end = s.expires_at.unwrap_or(now);
    if wanted_end > end {
        st.sandboxes
            .extend(
                &s.id,
                ExtendSandbox {
                    duration_ms: wanted_end - end,
                },
            )
            .await?;
    }
    Ok(())
}

async fn set_timeout(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response> {
    let req: TimeoutRequest = json(body).await?;
    let s = live(&st, &id)?;
    extend_to(&st, &s, req.timeout).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn pause(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    let s = live(&st, &id)?;
    if s.status == SandboxStatus::Paused {
        return Ok((
            StatusCode::CONFLICT,
            Json(super::wire::ApiErrorBody {
                code: 409,
                message: format!("Sandbox {id} is already paused"),
            }),
        )
            .into_response());
    }
    let sandboxes = st.sandboxes.clone();
    tokio::spawn(async move { sandboxes.pause(&id).await })
        .await
        .map_err(|e| E2bError::Api(ApiError::Internal(e.to_string())))??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Connect (and resume): a paused sandbox is resumed; the timeout, when given, is set.
async fn connect_one(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response> {
    let req: ConnectRequest = json(body).await?;
    let mut s = live(&st, &id)?;
    let resumed = s.status == SandboxStatus::Paused;
    if resumed {
        let (sandboxes, sid) = (st.sandboxes.clone(), id.clone());
        s = tokio::spawn(async move { sandboxes.resume(&sid).await })
            .await
            .map_err(|e| E2bError::Api(ApiError::Internal(e.to_string())))??;
    }
    if let Some(t) = req.timeout {
        extend_to(&st, &s, t).await?;
    }
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(created(&s, st.auth.token()))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_requests_translate_and_refuse_what_has_no_counterpart() {
        let req: NewSandbox = serde_json::from_str(
            r#"{"templateID":"base","timeout":30,"metadata":{"k":"v"},"envVars":{"A":"1"},
                "allow_internet_access":false,"autoPause":false}"#,
        )
        .unwrap();
        let c = request(req).unwrap();
        assert_eq!(c.image.as_deref(), Some("base"));
        assert_eq!(c.timeout_ms, Some(30_000));
        assert_eq!(c.tags.unwrap()["k"], "v");
        assert_eq!(
            c.network_policy,
            Some(NetworkPolicy::Mode(NetworkMode::DenyAll))
        );
        let bad: NewSandbox = serde_json::from_str(r#"{"timeout":-1}"#).unwrap();
        assert!(matches!(request(bad), Err(E2bError::BadRequest(_))));
        let net: NewSandbox =
            serde_json::from_str(r#"{"network":{"allowOut":["1.1.1.1"]}}"#).unwrap();
        assert!(matches!(request(net), Err(E2bError::NotImplemented(_))));
    }

    #[test]
    fn metadata_filters_are_url_encoded_pairs() {
        let m = metadata_filter(Some("user=alice%20b&env=prod")).unwrap();
        assert_eq!(m.get("env").map(String::as_str), Some("prod"));
        assert_eq!(m.get("user").map(String::as_str), Some("alice b"));
        assert!(metadata_filter(Some("k=%zz")).is_err());
        assert!(metadata_filter(None).unwrap().is_empty());
    }
}
