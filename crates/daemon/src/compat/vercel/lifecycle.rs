//! Sandboxes through the Vercel layer: create (runtime → image, the user and working
//! directory Vercel documents), find by id or name, list, extend, stop, snapshot and fork,
//! over the daemon's sandbox and snapshot services.
//!
//! Network policies and exposed ports map onto the daemon's network ([`super::policy`]);
//! `persistent` onto the daemon's persistent sandboxes, whose stop snapshots them and whose
//! start resumes them ([`resume`]). What Vercel offers and the daemon does not yet (drives,
//! tarball sources, private networks) is refused as `not_implemented` rather than ignored.

use belljar_api::{
    AddPort, CreateSandbox, CreateSnapshot, ExtendSandbox, ForkSandbox, ListSandboxesQuery,
    ListSnapshotsQuery, RunCommand, Sandbox, Snapshot, Source, UpdateSandbox, Validate,
};

use super::error::{Result, VercelError};
use super::runtime;
use super::wire::{CreateRequest, Route, SourceRequest};
use crate::http::AppState;
use crate::http::error::ApiError;

/// Runs `fut` in its own task, so that a client that goes away cannot leave a change half
/// done.
async fn detached<T: Send + 'static>(
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(fut)
        .await
        .map_err(|e| VercelError::Api(ApiError::Internal(e.to_string())))?
}

/// Refuses the parts of a request the daemon has no counterpart for yet.
fn refuse_unsupported(req: &CreateRequest) -> Result<()> {
    if req.network_id.is_some() {
        return Err(VercelError::NotImplemented("networkId".into()));
    }
    if req
        .mounts
        .as_ref()
        .is_some_and(|m| !m.is_null() && m.as_object().is_none_or(|o| !o.is_empty()))
    {
        return Err(VercelError::NotImplemented("mounts (drives)".into()));
    }
    Ok(())
}

fn source(req: Option<SourceRequest>) -> Result<Option<Source>> {
    Ok(match req {
        None => None,
        Some(SourceRequest::Snapshot { snapshot_id }) => Some(Source::Snapshot { snapshot_id }),
        Some(SourceRequest::Git {
            username: Some(_), ..
        })
        | Some(SourceRequest::Git {
            password: Some(_), ..
        }) => {
            return Err(VercelError::NotImplemented(
                "git sources with credentials".into(),
            ));
        }
        // A full clone is a superset of a shallow one, so `depth` only saves time.
        Some(SourceRequest::Git { url, revision, .. }) => Some(Source::Git { url, revision }),
        Some(SourceRequest::Tarball { .. }) => {
            return Err(VercelError::NotImplemented("tarball sources".into()));
        }
    })
}

/// Creates a running sandbox set up as Vercel documents.
pub async fn create(st: &AppState, req: CreateRequest) -> Result<Sandbox> {
    refuse_unsupported(&req)?;
    if let Some(name) = &req.name
        && find_named(st, name)?.is_some_and(|s| !s.status.is_final())
    {
        return Err(VercelError::NameTaken(name.clone()));
    }
    let source = source(req.source)?;
    let cloned = matches!(source, Some(Source::Git { .. }));
    // A snapshot brings its own image.
    let image = match source {
        Some(Source::Snapshot { .. }) if req.runtime.is_none() && req.image.is_none() => None,
        _ => runtime::image_for(&st.images, req.runtime.as_deref(), req.image.as_deref())?,
    };
    let network_policy = req
        .network_policy
        .as_ref()
        .map(super::policy::from_vercel)
        .transpose()?;
    let ports = req
        .ports
        .filter(|p| !p.is_empty())
        .map(|p| p.into_iter().map(u32::from).collect());
    let create = CreateSandbox {
        image,
        network_policy,
        ports,
        vcpus: req.resources.and_then(|r| r.vcpus),
        timeout_ms: req.timeout,
        env: req.env,
        tags: req.tags,
        name: req.name,
        source,
        snapshot_expiration_ms: req.snapshot_expiration,
        keep_last_snapshots: req.keep_last_snapshots.map(Into::into),
        persistent: req.persistent,
        ..CreateSandbox::default()
    };
    create
        .validate()
        .map_err(|e| VercelError::BadRequest(e.to_string()))?;
    let sandboxes = st.sandboxes.clone();
    detached(async move {
        let sandbox = sandboxes.create(create).await?;
        let mut argv = vec!["sh".into(), "-c".into(), runtime::SETUP.into(), "sh".into()];
        if cloned {
            argv.push("copy-workspace".into());
        }
        Ok(crate::compat::set_up(&sandboxes, &sandbox, argv, "the vercel-sandbox user").await?)
    })
    .await
}

/// A sandbox by its id (`sbx_...`) or, for 3.x, its name: the newest sandbox of that name.
pub fn find_named(st: &AppState, name: &str) -> Result<Option<Sandbox>> {
    if name.starts_with("sbx_")
        && let Ok(s) = st.sandboxes.get(name)
    {
        return Ok(Some(s));
    }
    let mut query = ListSandboxesQuery {
        limit: Some(200),
        ..ListSandboxesQuery::default()
    };
    loop {
        let page = st.sandboxes.list(&query)?;
        if let Some(s) = page
            .sandboxes
            .into_iter()
            .find(|s| s.name.as_deref() == Some(name))
        {
            return Ok(Some(s));
        }
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return Ok(None),
        }
    }
}

/// The ids of every session of `s`'s name (`s` itself when it has none), newest first.
pub fn sessions_of(st: &AppState, s: &Sandbox) -> Result<Vec<String>> {
    let Some(name) = &s.name else {
        return Ok(vec![s.id.clone()]);
    };
    let mut ids = Vec::new();
    let mut query = ListSandboxesQuery {
        limit: Some(200),
        ..ListSandboxesQuery::default()
    };
    loop {
        let page = st.sandboxes.list(&query)?;
        ids.extend(
            page.sandboxes
                .into_iter()
                .filter(|x| x.name.as_ref() == Some(name))
                .map(|x| x.id),
        );
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return Ok(ids),
        }
    }
}

/// [`find_named`], or 404.
pub fn named(st: &AppState, name: &str) -> Result<Sandbox> {
    find_named(st, name)?.ok_or_else(|| VercelError::NotFound(format!("No sandbox named {name:?}")))
}

/// Stops a sandbox and answers once it has stopped (so `stop({ blocking })` and a plain
/// `stop()` both see the end).
pub async fn stop(st: &AppState, id: &str) -> Result<Sandbox> {
    let (sandboxes, id) = (st.sandboxes.clone(), id.to_owned());
    detached(async move { Ok(sandboxes.stop(&id).await?) }).await
}

/// Resumes a paused sandbox, or starts a stopped persistent one again from its latest
/// snapshot (same id, name, tags, env and network policy), as Vercel resumes a persistent
/// sandbox into a new session.
pub async fn resume(st: &AppState, id: &str) -> Result<Sandbox> {
    let (sandboxes, id) = (st.sandboxes.clone(), id.to_owned());
    detached(async move { Ok(sandboxes.start(&id).await?) }).await
}

/// Adds `duration` ms to the sandbox's timeout.
pub async fn extend(st: &AppState, id: &str, duration: i64) -> Result<Sandbox> {
    let (sandboxes, id) = (st.sandboxes.clone(), id.to_owned());
    detached(async move {
        Ok(sandboxes
            .extend(
                &id,
                ExtendSandbox {
                    duration_ms: duration,
                },
            )
            .await?)
    })
    .await
}

/// The sandbox's exposed ports as Vercel's routes; `url` is the forwarded local URL. The SDK's
/// `domain()` makes `https://<subdomain>.vercel.run` of a route, so the subdomain ends in
/// `-belljar-<host port>`, which `belljar vercel`'s preload sends to that local port.
pub fn routes(st: &AppState, s: &Sandbox) -> Vec<Route> {
    let ports = st
        .sandboxes
        .ports(&s.id)
        .map(|l| l.ports)
        .unwrap_or_default();
    ports
        .into_iter()
        .map(|p| Route {
            url: p.url.trim_end_matches('/').to_owned(),
            subdomain: format!(
                "{}-p{}-belljar-{}",
                s.id.replace('_', "-"),
                p.port,
                p.host_port
            ),
            port: p.port,
        })
        .collect()
}

/// Replaces the sandbox's network policy.
pub async fn set_policy(st: &AppState, id: &str, policy: &serde_json::Value) -> Result<Sandbox> {
    let update = UpdateSandbox {
        network_policy: Some(super::policy::from_vercel(policy)?),
        ..UpdateSandbox::default()
    };
    update
        .validate()
        .map_err(|e| VercelError::BadRequest(e.to_string()))?;
    let (sandboxes, id) = (st.sandboxes.clone(), id.to_owned());
    detached(async move { Ok(sandboxes.update(&id, update).await?) }).await
}

/// Exposes the ports of `ports` that are not exposed yet.
pub async fn add_ports(st: &AppState, s: &Sandbox, ports: &[u16]) -> Result<()> {
    let have: Vec<u16> = routes(st, s).iter().map(|r| r.port).collect();
    for port in ports.iter().filter(|p| !have.contains(p)) {
        let req = AddPort {
            port: u32::from(*port),
            host_port: None,
        };
        st.sandboxes.add_port(&s.id, req).await?;
    }
    Ok(())
}

/// Takes a snapshot and stops the sandbox, as Vercel's `snapshot()` does.
pub async fn snapshot(
    st: &AppState,
    id: &str,
    expiration: Option<i64>,
) -> Result<(Snapshot, Sandbox)> {
    let (sandboxes, id) = (st.sandboxes.clone(), id.to_owned());
    detached(async move {
        let req = CreateSnapshot {
            keep_running: Some(false),
            expiration_ms: expiration,
            path: None,
        };
        req.validate()
            .map_err(|e| VercelError::BadRequest(e.to_string()))?;
        let snap = sandboxes.snapshot(&id, req).await?;
        let sandbox = sandboxes.get(&id)?;
        Ok((snap, sandbox))
    })
    .await
}

/// A new running sandbox from another's current files (3.x `Sandbox.fork`), set up again
/// (idempotent) so that a fork of any sandbox has the user and directory.
pub async fn fork(st: &AppState, source: &str, req: CreateRequest) -> Result<Sandbox> {
    refuse_unsupported(&req)?;
    if req.image.is_some() || req.runtime.is_some() {
        return Err(VercelError::BadRequest(
            "image: a fork keeps its source's image".into(),
        ));
    }
    // A fork inherits its source's persistence; the daemon cannot give it another.
    if let Some(p) = req.persistent
        && p != st.sandboxes.get(source)?.lifecycle.persistent
    {
        return Err(VercelError::NotImplemented(format!(
            "persistent: {p} on a fork of a sandbox that is {}persistent",
            if p { "not " } else { "" }
        )));
    }
    let fork = ForkSandbox {
        name: req.name,
        tags: req.tags,
        env: req.env,
        timeout_ms: req.timeout,
    };
    fork.validate()
        .map_err(|e| VercelError::BadRequest(e.to_string()))?;
    let (sandboxes, source) = (st.sandboxes.clone(), source.to_owned());
    detached(async move {
        let sandbox = sandboxes.fork(&source, fork).await?;
        let setup = RunCommand {
            argv: vec!["sh".into(), "-c".into(), runtime::SETUP.into()],
            sudo: true,
            ..RunCommand::default()
        };
        sandboxes.run_command(&sandbox.id, setup, None).await?;
        Ok(sandboxes.get(&sandbox.id)?)
    })
    .await
}

/// One page of snapshots, newest first.
pub fn snapshots(
    st: &AppState,
    query: ListSnapshotsQuery,
) -> Result<(Vec<Snapshot>, Option<String>)> {
    query
        .validate()
        .map_err(|e| VercelError::BadRequest(e.to_string()))?;
    let page = st.sandboxes.list_snapshots(&query)?;
    Ok((page.snapshots, page.next_cursor))
}

/// One page of sandboxes, newest first.
pub fn sandboxes(
    st: &AppState,
    query: ListSandboxesQuery,
) -> Result<(Vec<Sandbox>, Option<String>)> {
    query
        .validate()
        .map_err(|e| VercelError::BadRequest(e.to_string()))?;
    let page = st.sandboxes.list(&query)?;
    Ok((page.sandboxes, page.next_cursor))
}
