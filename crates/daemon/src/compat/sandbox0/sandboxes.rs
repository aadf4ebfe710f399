//! Sandboxes through the Sandbox0 layer: claim, get, status, list, update, refresh, pause,
//! resume and delete, over the daemon's sandbox service.
//!
//! A Sandbox0 sandbox is a persistent daemon sandbox: its pause is the daemon's stop, which
//! snapshots the writable root filesystem and ends the processes, and its resume the
//! daemon's start from that snapshot, as Sandbox0's checkpointed pause does (`memory: true`
//! asks for the processes to be kept too: the daemon's freezer pause). The soft `ttl` is the
//! daemon's timeout of each session (its end pauses the sandbox; `0` means the daemon's
//! longest timeout), the `hard_ttl` its hard TTL (deletion), `auto_resume` the daemon's.
//!
//! What Sandbox0 keeps that the daemon has no field for (the template, the configured TTL,
//! the services) is in the sandbox's tags under `sandbox0.`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use belljar_api::{
    CreateSandbox, ListSandboxesQuery, Sandbox, SandboxStatus, Source, UpdateSandbox,
};

use super::error::{Result, Sandbox0Error};
use super::wire::{
    ClaimRequest, ClaimResponse, ExecutionStateRequest, ListData, ListQuery, MessageData,
    PauseData, RefreshData, RefreshRequest, ResumeData, SandboxView, Status, StatusView, Success,
    SummaryView, UpdateRequest,
};
use super::{S0Json, S0Path, S0Query, Shared, detached, network};
use crate::http::AppState;
use crate::sandbox::Reconfigure;
use crate::time::rfc3339;

/// The template a sandbox was claimed from.
pub const TAG_TEMPLATE: &str = "sandbox0.template";
/// The configured soft TTL, seconds (`0`: none).
pub const TAG_TTL: &str = "sandbox0.ttl";
/// Sandbox0's default template, and the image it runs.
const DEFAULT_TEMPLATE: &str = "default";
const DEFAULT_IMAGE: &str = "base";
/// The team and user every local sandbox belongs to.
const TEAM: &str = "local";
const USER: &str = "local";
/// Sandbox0's smallest memory limit.
const MIN_MEMORY_MIB: u64 = 128;
/// Memory per vCPU: the ratio from which a sandbox's CPUs follow its memory.
pub const MEMORY_PER_VCPU_MIB: u64 = 1024;

/// The image a template runs.
fn image_of(template: &str) -> Result<String> {
    match template.trim() {
        "" => Err(Sandbox0Error::BadRequest(
            "template: must not be empty".into(),
        )),
        DEFAULT_TEMPLATE => Ok(DEFAULT_IMAGE.to_owned()),
        t => Ok(t.to_owned()),
    }
}

/// The template a sandbox shows: the one it was claimed from, else its image's.
pub fn template_of(s: &Sandbox) -> String {
    match s.tags.get(TAG_TEMPLATE) {
        Some(t) => t.clone(),
        None if s.image == DEFAULT_IMAGE => DEFAULT_TEMPLATE.to_owned(),
        None => s.image.clone(),
    }
}

/// A Kubernetes memory quantity (`512Mi`, `2Gi`, `1G`, bytes) in MiB.
pub fn memory_mib(quantity: &str) -> Result<u64> {
    let bad = || {
        Sandbox0Error::BadRequest(format!(
            "resources.memory: {quantity:?} is not a memory quantity such as 512Mi or 2Gi"
        ))
    };
    let q = quantity.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, unit) = q.split_at(split);
    let n: u128 = digits.parse().map_err(|_| bad())?;
    let bytes: u128 = match unit {
        "" => n,
        "Ki" => n << 10,
        "Mi" => n << 20,
        "Gi" => n << 30,
        "Ti" => n << 40,
        "k" | "K" => n * 1_000,
        "M" => n * 1_000_000,
        "G" => n * 1_000_000_000,
        "T" => n * 1_000_000_000_000,
        _ => return Err(bad()),
    };
    let mib = u64::try_from(bytes >> 20).map_err(|_| bad())?;
    let max = belljar_api::limits::MAX_MEMORY_MIB;
    if !(MIN_MEMORY_MIB..=max).contains(&mib) {
        return Err(Sandbox0Error::BadRequest(format!(
            "resources.memory: must be at least {MIN_MEMORY_MIB}Mi and at most {}Gi",
            max / 1024
        )));
    }
    Ok(mib)
}

/// The vCPUs that go with a memory limit.
pub fn vcpus_for(memory_mib: u64) -> u32 {
    let n = memory_mib.div_ceil(MEMORY_PER_VCPU_MIB);
    u32::try_from(n)
        .unwrap_or(u32::MAX)
        .clamp(1, belljar_api::limits::MAX_VCPUS)
}

/// The timeout of a session for a soft TTL in seconds (`0`: the daemon's longest).
fn timeout_for(st: &AppState, ttl: i64, field: &str) -> Result<i64> {
    let max = st.sandboxes.settings().max_timeout_ms;
    match ttl {
        t if t < 0 => Err(Sandbox0Error::BadRequest(format!(
            "{field}: must be 0 (none) or positive"
        ))),
        0 => Ok(max),
        t if t.saturating_mul(1000) > max => Err(Sandbox0Error::BadRequest(format!(
            "{field}: at most {} seconds here",
            max / 1000
        ))),
        t => Ok(t * 1000),
    }
}

/// A hard TTL in seconds as the daemon's (`0`: none).
fn hard_ttl_for(ttl: i64) -> Result<Option<i64>> {
    match ttl {
        t if t < 0 => Err(Sandbox0Error::BadRequest(
            "hard_ttl: must be 0 (none) or positive".into(),
        )),
        0 => Ok(None),
        t if t.saturating_mul(1000) > belljar_api::MAX_EXPIRATION_MS => Err(
            Sandbox0Error::BadRequest("hard_ttl: at most ten years".into()),
        ),
        t => Ok(Some(t * 1000)),
    }
}

/// The configured soft TTL, seconds.
pub fn ttl_of(s: &Sandbox) -> i64 {
    s.tags
        .get(TAG_TTL)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// A daemon status as Sandbox0's.
pub fn status_of(s: &Sandbox) -> Status {
    match s.status {
        SandboxStatus::Pending => Status::Starting,
        SandboxStatus::Running | SandboxStatus::Stopping => Status::Running,
        SandboxStatus::Paused => Status::Paused,
        SandboxStatus::Stopped if s.lifecycle.persistent => Status::Paused,
        SandboxStatus::Stopped | SandboxStatus::Failed => Status::Failed,
    }
}

/// Increases with each start: the start time of the current (or last) session.
fn generation(s: &Sandbox) -> i64 {
    s.started_at.unwrap_or(s.created_at)
}

fn runtime_id(s: &Sandbox) -> String {
    match status_of(s) {
        Status::Running | Status::Starting => format!("{}-{}", s.id, generation(s)),
        _ => String::new(),
    }
}

fn updated_at(s: &Sandbox) -> i64 {
    [Some(s.created_at), s.started_at, s.stopped_at]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(s.created_at)
}

/// When the soft TTL pauses the sandbox, if it has one and runs.
fn expires_at(s: &Sandbox) -> Option<String> {
    (ttl_of(s) > 0 && status_of(s) == Status::Running)
        .then_some(s.expires_at)
        .flatten()
        .map(rfc3339)
}

fn hard_expires_at(s: &Sandbox) -> Option<String> {
    s.lifecycle.deletes_at.map(rfc3339)
}

pub fn view(s: &Sandbox) -> SandboxView {
    let status = status_of(s);
    SandboxView {
        id: s.id.clone(),
        template_id: template_of(s),
        team_id: TEAM.into(),
        user_id: USER.into(),
        status,
        paused: status == Status::Paused,
        auto_resume: s.lifecycle.auto_resume,
        runtime_id: runtime_id(s),
        runtime_generation: generation(s),
        claimed_at: rfc3339(s.created_at),
        created_at: rfc3339(s.created_at),
        updated_at: rfc3339(updated_at(s)),
        services: network::services_of(s),
        resources: super::wire::Resources {
            memory: Some(format!("{}Mi", s.memory_mib)),
        },
        expires_at: expires_at(s),
        hard_expires_at: hard_expires_at(s),
    }
}

fn summary(s: &Sandbox) -> SummaryView {
    let status = status_of(s);
    SummaryView {
        id: s.id.clone(),
        template_id: template_of(s),
        status,
        paused: status == Status::Paused,
        runtime_generation: generation(s),
        created_at: rfc3339(s.created_at),
        updated_at: rfc3339(updated_at(s)),
        expires_at: expires_at(s),
        hard_expires_at: hard_expires_at(s),
    }
}

fn ok<T: serde::Serialize>(data: T) -> Response {
    Json(Success::new(data)).into_response()
}

pub async fn claim(
    State(st): State<AppState>,
    S0Json(req): S0Json<ClaimRequest>,
) -> Result<Response> {
    let template = req.template.trim().to_owned();
    let image = image_of(&template)?;
    let config = req.config.unwrap_or_default();
    if config
        .webhook
        .as_ref()
        .is_some_and(|w| w.url.as_deref().is_some_and(|u| !u.is_empty()))
    {
        return Err(Sandbox0Error::NotImplemented("webhook".into()));
    }
    let memory = config
        .resources
        .as_ref()
        .and_then(|r| r.memory.as_deref())
        .map(memory_mib)
        .transpose()?;
    let ttl = config.ttl.unwrap_or(0);
    let timeout_ms = timeout_for(&st, ttl, "ttl")?;
    let hard_ttl_ms = hard_ttl_for(config.hard_ttl.unwrap_or(0))?;
    let policy = config
        .network
        .as_ref()
        .map(network::policy_to_daemon)
        .transpose()?;
    let services = config.services.unwrap_or_default();
    let mut tags = BTreeMap::from([
        (TAG_TEMPLATE.to_owned(), template.clone()),
        (TAG_TTL.to_owned(), ttl.to_string()),
    ]);
    tags.extend(network::service_tags(&services)?);
    let ports: Vec<u32> = services.iter().filter_map(|s| s.port).collect();
    let create = CreateSandbox {
        image: (req.snapshot_id.is_none() || template != DEFAULT_TEMPLATE).then_some(image),
        vcpus: memory.map(vcpus_for),
        memory_mib: memory,
        timeout_ms: Some(timeout_ms),
        env: config.env_vars,
        tags: Some(tags),
        source: req
            .snapshot_id
            .map(|snapshot_id| Source::Snapshot { snapshot_id }),
        network_policy: policy,
        ports: (!ports.is_empty()).then_some(ports),
        persistent: Some(true),
        hard_ttl_ms,
        auto_resume: Some(config.auto_resume.unwrap_or(true)),
        ..CreateSandbox::default()
    };
    // A user's template of that name wins over the built-in mapping (not under a snapshot,
    // which brings its own image).
    let create = match create.source {
        None => st.sandboxes.prefer_template(create, &template)?,
        Some(_) => create,
    };
    let sandboxes = st.sandboxes.clone();
    let s = detached(async move { Ok(sandboxes.create(create).await?) }).await?;
    let body = ClaimResponse {
        sandbox_id: s.id.clone(),
        status: status_of(&s),
        runtime_id: runtime_id(&s),
        template: template_of(&s),
    };
    Ok((StatusCode::CREATED, Json(Success::new(body))).into_response())
}

/// Wakes a sandbox that its soft TTL or a pause left without a runtime, when it has
/// `auto_resume`, before a use of its processes or files (the daemon itself resumes only a
/// frozen one).
pub async fn wake(st: &AppState, id: &str) -> Result<()> {
    let s = st.sandboxes.get(id)?;
    if s.status == SandboxStatus::Stopped && s.lifecycle.persistent && s.lifecycle.auto_resume {
        let (sandboxes, id) = (st.sandboxes.clone(), id.to_owned());
        detached(async move { Ok(sandboxes.start(&id).await?) }).await?;
    }
    Ok(())
}

pub async fn get_one(State(st): State<AppState>, S0Path(id): S0Path<String>) -> Result<Response> {
    Ok(ok(view(&st.sandboxes.get(&id)?)))
}

pub async fn status(State(st): State<AppState>, S0Path(id): S0Path<String>) -> Result<Response> {
    let s = st.sandboxes.get(&id)?;
    Ok(ok(StatusView {
        sandbox_id: s.id.clone(),
        template_id: template_of(&s),
        team_id: TEAM.into(),
        user_id: USER.into(),
        runtime_id: runtime_id(&s),
        status: status_of(&s),
        claimed_at: rfc3339(s.created_at),
        created_at: rfc3339(s.created_at),
        expires_at: expires_at(&s),
        hard_expires_at: hard_expires_at(&s),
    }))
}

/// Every sandbox claimed through the layer, newest first.
fn claimed(st: &AppState) -> Result<Vec<Sandbox>> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = st.sandboxes.list(&ListSandboxesQuery {
            limit: Some(200),
            cursor,
            ..ListSandboxesQuery::default()
        })?;
        all.extend(
            page.sandboxes
                .into_iter()
                .filter(|s| s.tags.contains_key(TAG_TEMPLATE)),
        );
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(all),
        }
    }
}

pub async fn list(State(st): State<AppState>, S0Query(q): S0Query<ListQuery>) -> Result<Response> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            [
                Status::Starting,
                Status::Running,
                Status::Paused,
                Status::Terminating,
                Status::Failed,
            ]
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                Sandbox0Error::BadRequest(format!(
                    "status: {s:?} is not one of starting, running, paused, terminating, failed"
                ))
            })?,
        ),
    };
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(Sandbox0Error::BadRequest("limit: must be 1..=200".into()));
    }
    let offset = q.offset.unwrap_or(0) as usize;
    let matching: Vec<Sandbox> = claimed(&st)?
        .into_iter()
        .filter(|s| status.is_none_or(|v| status_of(s) == v))
        .filter(|s| {
            q.template_id
                .as_deref()
                .is_none_or(|t| t.is_empty() || template_of(s) == t)
        })
        .filter(|s| {
            q.paused
                .is_none_or(|p| (status_of(s) == Status::Paused) == p)
        })
        .collect();
    let count = matching.len();
    let page: Vec<SummaryView> = matching
        .iter()
        .skip(offset)
        .take(limit as usize)
        .map(summary)
        .collect();
    let has_more = offset.saturating_add(page.len()) < count;
    Ok(ok(ListData {
        sandboxes: page,
        count,
        has_more,
    }))
}

/// Replaces tags of the sandbox's, keeping the others.
async fn set_tags(
    st: &AppState,
    s: &Sandbox,
    set: BTreeMap<String, String>,
    drop_prefix: Option<&str>,
) -> Result<Sandbox> {
    let mut tags = s.tags.clone();
    if let Some(prefix) = drop_prefix {
        tags.retain(|k, _| !k.starts_with(prefix));
    }
    tags.extend(set);
    let req = UpdateSandbox {
        tags: Some(tags),
        ..UpdateSandbox::default()
    };
    Ok(st.sandboxes.update(&s.id, req).await?)
}

pub async fn update(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<UpdateRequest>,
) -> Result<Response> {
    let Some(config) = req.config else {
        return Ok(ok(view(&st.sandboxes.get(&id)?)));
    };
    if config.env_vars.is_some() || config.webhook.is_some() {
        return Err(Sandbox0Error::BadRequest(
            "config: env_vars and webhook take effect at the claim only; claim a new sandbox"
                .into(),
        ));
    }
    // Everything is checked before anything changes.
    let s = st.sandboxes.get(&id)?;
    let timeout = config.ttl.map(|t| timeout_for(&st, t, "ttl")).transpose()?;
    let hard = config.hard_ttl.map(hard_ttl_for).transpose()?;
    let memory = config
        .resources
        .as_ref()
        .and_then(|r| r.memory.as_deref())
        .map(memory_mib)
        .transpose()?;
    let policy = config
        .network
        .as_ref()
        .map(network::policy_to_daemon)
        .transpose()?;
    let services = config
        .services
        .as_ref()
        .map(|s| network::service_tags(s).map(|t| (s.clone(), t)))
        .transpose()?;
    let (st2, id2) = (st.clone(), id.clone());
    let s = detached(async move {
        let (st, id) = (st2, id2);
        let mut s = s;
        if let Some(policy) = &policy {
            st.sandboxes.put_network_policy(&id, policy).await?;
        }
        if let Some((list, tags)) = services {
            network::apply_ports(&st, &s, &list).await?;
            s = set_tags(&st, &s, tags, Some(network::TAG_SERVICE)).await?;
        }
        if let Some(ttl) = config.ttl {
            s = set_tags(
                &st,
                &s,
                BTreeMap::from([(TAG_TTL.to_owned(), ttl.to_string())]),
                None,
            )
            .await?;
        }
        let change = Reconfigure {
            timeout_ms: timeout,
            expires_in_ms: timeout,
            hard_ttl_ms: hard,
            auto_resume: config.auto_resume,
            ..Reconfigure::default()
        };
        if change != Reconfigure::default() {
            s = st.sandboxes.reconfigure(&id, change).await?;
        }
        if let Some(m) = memory.filter(|m| *m != s.memory_mib) {
            s = resize(&st, &s, m).await?;
        }
        Ok(s)
    })
    .await?;
    Ok(ok(view(&s)))
}

/// A new memory limit (and the vCPUs that go with it): a running sandbox is paused, resized
/// and resumed, as Sandbox0 restarts its processes through a filesystem pause; a paused one
/// stays paused with the new size for its next start.
async fn resize(st: &AppState, s: &Sandbox, memory: u64) -> Result<Sandbox> {
    let was_live = !s.status.is_final();
    if was_live {
        st.sandboxes.stop(&s.id).await?;
    }
    let change = Reconfigure {
        memory_mib: Some(memory),
        vcpus: Some(vcpus_for(memory)),
        ..Reconfigure::default()
    };
    let resized = st.sandboxes.reconfigure(&s.id, change).await?;
    if was_live {
        return Ok(st.sandboxes.start(&s.id).await?);
    }
    Ok(resized)
}

pub async fn refresh(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<RefreshRequest>,
) -> Result<Response> {
    let s = st.sandboxes.get(&id)?;
    if status_of(&s) != Status::Running {
        return Err(Sandbox0Error::Conflict(format!(
            "Sandbox {id} has no runtime ({}): resume it before refreshing its TTL",
            status_of(&s).as_str()
        )));
    }
    let soft = match req.duration {
        Some(d) if d <= 0 => {
            return Err(Sandbox0Error::BadRequest(
                "duration: must be positive".into(),
            ));
        }
        Some(d) => Some(timeout_for(&st, d, "duration")?),
        None => (ttl_of(&s) > 0).then_some(s.timeout_ms),
    };
    let change = Reconfigure {
        expires_in_ms: soft,
        hard_ttl_ms: s.lifecycle.hard_ttl_ms.map(Some),
        ..Reconfigure::default()
    };
    let s = st.sandboxes.reconfigure(&id, change).await?;
    Ok(ok(RefreshData {
        sandbox_id: s.id.clone(),
        expires_at: soft.and(s.expires_at).map(rfc3339),
        hard_expires_at: hard_expires_at(&s),
    }))
}

pub async fn pause(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<ExecutionStateRequest>,
) -> Result<Response> {
    let s = st.sandboxes.get(&id)?;
    let keep_memory = req.memory.unwrap_or(false);
    let sandboxes = st.sandboxes.clone();
    let s = match (status_of(&s), s.status) {
        (Status::Paused, _) => s,
        (_, SandboxStatus::Running) if keep_memory => {
            detached(async move { Ok(sandboxes.pause(&id).await?) }).await?
        }
        (_, SandboxStatus::Running) => {
            layer.contexts.forget_sandbox(&s.id);
            detached(async move { Ok(sandboxes.stop(&id).await?) }).await?
        }
        (status, _) => {
            return Err(Sandbox0Error::Conflict(format!(
                "Sandbox {id} is {}; only a running sandbox pauses",
                status.as_str()
            )));
        }
    };
    Ok(ok(PauseData {
        sandbox_id: s.id.clone(),
        paused: status_of(&s) == Status::Paused,
        status: status_of(&s),
    }))
}

pub async fn resume(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(_req): S0Json<ExecutionStateRequest>,
) -> Result<Response> {
    let s = st.sandboxes.get(&id)?;
    let sandboxes = st.sandboxes.clone();
    let s = match s.status {
        SandboxStatus::Running => s,
        SandboxStatus::Paused => detached(async move { Ok(sandboxes.resume(&id).await?) }).await?,
        _ => detached(async move { Ok(sandboxes.start(&id).await?) }).await?,
    };
    Ok(ok(ResumeData {
        sandbox_id: s.id.clone(),
        resumed: status_of(&s) == Status::Running,
    }))
}

pub async fn delete(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(id): S0Path<String>,
) -> Result<Response> {
    st.sandboxes.get(&id)?;
    layer.contexts.forget_sandbox(&id);
    let sandboxes = st.sandboxes.clone();
    let sid = id.clone();
    detached(async move { Ok(sandboxes.delete(&sid).await?) }).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Success::new(MessageData {
            message: format!("Sandbox {id} deleted"),
        })),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_quantities_and_the_cpus_that_follow() {
        assert_eq!(memory_mib("512Mi").unwrap(), 512);
        assert_eq!(memory_mib("2Gi").unwrap(), 2048);
        assert_eq!(memory_mib("1G").unwrap(), 953);
        assert_eq!(memory_mib("268435456").unwrap(), 256);
        for bad in ["", "Mi", "12x", "64Mi", "-1Gi", "1.5Gi", "9999999Ti"] {
            assert!(memory_mib(bad).is_err(), "{bad}");
        }
        assert_eq!(vcpus_for(128), 1);
        assert_eq!(vcpus_for(1024), 1);
        assert_eq!(vcpus_for(1025), 2);
        assert_eq!(vcpus_for(4096), 4);
        assert_eq!(vcpus_for(1 << 20), 32);
    }

    #[test]
    fn templates_are_images() {
        assert_eq!(image_of("default").unwrap(), "base");
        assert_eq!(image_of("python3.13").unwrap(), "python3.13");
        assert!(image_of(" ").is_err());
    }
}
