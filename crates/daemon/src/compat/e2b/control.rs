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
use axum::routing::{get, post};
use belljar_api::{
    CreateSandbox, DomainAllow, ExtendSandbox, ListSandboxesQuery, NetworkMode, NetworkPolicy,
    NetworkRules, Sandbox, SandboxStatus, Source, Subnets, Validate,
};

use super::error::{E2bError, Result};
use super::wire::{
    ConnectRequest, CreatedSandbox, ListQuery, Metric, NetworkConfig, NewSandbox, SandboxDetail,
    TimeoutRequest,
};
use super::{ENVD_VERSION, connect, setup};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::time::rfc3339;

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
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/network", axum::routing::put(not_yet))
        .route("/sandboxes/{id}/refreshes", post(not_yet))
}

async fn not_yet() -> E2bError {
    E2bError::NotImplemented("This E2B API route".into())
}

async fn json<T: serde::de::DeserializeOwned>(body: Body) -> Result<T> {
    connect::unary(body).await
}

pub fn created(s: &Sandbox, token: &str) -> CreatedSandbox {
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
pub fn live(st: &AppState, id: &str) -> Result<Sandbox> {
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

/// The daemon's policy for E2B's egress settings. In E2B an allowed address or domain wins
/// over a denied range, and denying `0.0.0.0/0` (or `allow_internet_access: false`) denies
/// all but what is allowed; the daemon's deny wins instead, so an allow list is only taken
/// with all traffic denied.
fn policy(internet: Option<bool>, net: NetworkConfig) -> Result<Option<NetworkPolicy>> {
    let allow = net.allow_out.unwrap_or_default();
    let deny = net.deny_out.unwrap_or_default();
    let all = |c: &String| c == "0.0.0.0/0" || c == "::/0";
    let deny_all = internet == Some(false) || deny.iter().any(all);
    if deny_all {
        if allow.is_empty() {
            return Ok(Some(NetworkPolicy::Mode(NetworkMode::DenyAll)));
        }
        let (subnets, domains): (Vec<String>, Vec<String>) =
            allow.into_iter().partition(|a| is_address(a));
        return Ok(Some(NetworkPolicy::Rules(NetworkRules {
            allow: (!domains.is_empty()).then_some(DomainAllow::List(domains)),
            subnets: (!subnets.is_empty()).then(|| Subnets {
                allow: subnets.iter().map(|s| as_cidr(s)).collect(),
                deny: Vec::new(),
            }),
        })));
    }
    if deny.is_empty() {
        // Nothing denied: an allow list changes nothing, as in E2B.
        return Ok(None);
    }
    if !allow.is_empty() {
        return Err(E2bError::NotImplemented(
            "network.allowOut together with a denyOut narrower than all traffic".into(),
        ));
    }
    if let Some(d) = deny.iter().find(|d| !is_address(d)) {
        return Err(E2bError::BadRequest(format!(
            "network.denyOut: {d:?} is not an address or CIDR range"
        )));
    }
    Ok(Some(NetworkPolicy::Rules(NetworkRules {
        allow: None,
        subnets: Some(Subnets {
            allow: vec!["0.0.0.0/0".into(), "::/0".into()],
            deny: deny.iter().map(|d| as_cidr(d)).collect(),
        }),
    })))
}

/// Whether `s` is an IP address or a CIDR range (else a domain).
fn is_address(s: &str) -> bool {
    let ip = s.split_once('/').map_or(s, |(ip, _)| ip);
    ip.parse::<std::net::IpAddr>().is_ok()
}

/// An address as a one-address range; a range as it is.
fn as_cidr(s: &str) -> String {
    match s.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => format!("{s}/32"),
        Ok(std::net::IpAddr::V6(_)) => format!("{s}/128"),
        Err(_) => s.to_owned(),
    }
}

fn request(req: NewSandbox) -> Result<CreateSandbox> {
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(E2bError::NotImplemented("volumeMounts".into()));
    }
    if req.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(E2bError::NotImplemented("mcp".into()));
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
    let template = req
        .template_id
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| DEFAULT_TEMPLATE.into());
    // A snapshot is a template too, and brings its own image.
    let (image, source) = if template.starts_with("snap_") {
        (
            None,
            Some(Source::Snapshot {
                snapshot_id: template,
            }),
        )
    } else {
        (Some(template), None)
    };
    let network_policy = policy(req.allow_internet_access, req.network.unwrap_or_default())?;
    let create = CreateSandbox {
        image,
        source,
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
    let mut create = request(json::<NewSandbox>(body).await?)?;
    // A user's template of that name wins over the image of that name.
    if let Some(name) = create.image.clone() {
        create = st.sandboxes.prefer_template(create, &name)?;
    }
    let sandboxes = st.sandboxes.clone();
    // In its own task: a client that goes away cannot leave a sandbox half set up.
    let sandbox = tokio::spawn(async move {
        let sandbox = sandboxes.create(create).await?;
        let argv = vec!["sh".into(), "-c".into(), setup::SETUP.into()];
        Ok::<_, E2bError>(
            crate::compat::set_up(&sandboxes, &sandbox, argv, "the sandbox's user").await?,
        )
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
    let sid = id.clone();
    tokio::spawn(async move { sandboxes.delete(&sid).await })
        .await
        .map_err(|e| E2bError::Api(ApiError::Internal(e.to_string())))??;
    super::process::forget(&id);
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

/// One sample, now: memory as the daemon measures it, CPU as the average over the sandbox's
/// life (the daemon keeps no history), the disk as its size (its use is not measured).
async fn metrics(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response> {
    let s = live(&st, &id)?;
    let u = st.sandboxes.usage(&id).await?;
    let started = s.started_at.unwrap_or(s.created_at);
    let lived_us = (u.measured_at - started).max(1).saturating_mul(1000);
    let cpu_pct = u.cpu_usec.map_or(0.0, |c| {
        c as f64 * 100.0 / (lived_us as f64 * f64::from(s.vcpus.max(1)))
    });
    let mem_total = u.memory_limit_bytes.unwrap_or(s.memory_mib << 20);
    let metric = Metric {
        timestamp: rfc3339(u.measured_at),
        timestamp_unix: u.measured_at / 1000,
        cpu_count: s.vcpus,
        cpu_used_pct: cpu_pct.clamp(0.0, 100.0),
        mem_used: u.memory_bytes.unwrap_or(0),
        mem_total,
        mem_cache: 0,
        disk_used: 0,
        disk_total: s.disk_mib << 20,
    };
    Ok(Json(vec![metric]).into_response())
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
        let net: NewSandbox = serde_json::from_str(
            r#"{"network":{"allowOut":["10.0.0.1"],"denyOut":["10.0.0.0/8"]}}"#,
        )
        .unwrap();
        assert!(matches!(request(net), Err(E2bError::NotImplemented(_))));
    }

    #[test]
    fn egress_settings_become_the_daemons_policy() {
        let net = |allow: &[&str], deny: &[&str]| NetworkConfig {
            allow_out: Some(allow.iter().map(|s| (*s).to_owned()).collect()),
            deny_out: Some(deny.iter().map(|s| (*s).to_owned()).collect()),
        };
        assert_eq!(policy(None, net(&["example.com"], &[])).unwrap(), None);
        assert_eq!(
            policy(None, net(&[], &["0.0.0.0/0"])).unwrap(),
            Some(NetworkPolicy::Mode(NetworkMode::DenyAll))
        );
        let Some(NetworkPolicy::Rules(r)) = policy(
            Some(false),
            net(&["example.com", "1.2.3.4", "10.0.0.0/8"], &[]),
        )
        .unwrap() else {
            panic!("rules expected");
        };
        assert_eq!(r.allow, Some(DomainAllow::List(vec!["example.com".into()])));
        assert_eq!(r.subnets.unwrap().allow, ["1.2.3.4/32", "10.0.0.0/8"]);
        let Some(NetworkPolicy::Rules(r)) = policy(None, net(&[], &["192.168.0.0/16"])).unwrap()
        else {
            panic!("rules expected");
        };
        assert_eq!(r.subnets.unwrap().deny, ["192.168.0.0/16"]);
        assert!(policy(None, net(&[], &["example.com"])).is_err());
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
