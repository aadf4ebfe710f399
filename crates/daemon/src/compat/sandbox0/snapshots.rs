//! Rootfs snapshots and fork through the Sandbox0 layer, over the daemon's snapshots.
//!
//! A snapshot of a running sandbox is a live daemon snapshot (the sandbox keeps running); of
//! a paused one, the snapshot its pause took, which holds exactly its root filesystem. A
//! fork of a running sandbox is the daemon's fork; of a paused one, a new sandbox started
//! from that snapshot with the source's configuration. A claim with `snapshot_id` starts
//! from any of them. Names and descriptions are the layer's own, kept in memory. Restoring a
//! paused sandbox's root filesystem in place has no counterpart in the daemon yet.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use belljar_api::{
    CreateSandbox, CreateSnapshot, ForkSandbox, ListSnapshotsQuery, Sandbox, Snapshot,
    SnapshotStatus, Source,
};

use super::error::{Result, Sandbox0Error};
use super::sandboxes::{self, view};
use super::wire::{
    CreateSnapshotRequest, Done, ForkData, ForkRequest, SnapshotList, SnapshotView, Status, Success,
};
use super::{S0Json, S0Path, Shared, detached};
use crate::http::AppState;
use crate::sandbox::Reconfigure;
use crate::time::{parse_rfc3339, rfc3339};
use crate::util::now_ms;

/// A snapshot's name and description.
type Label = (Option<String>, Option<String>);

/// Names and descriptions given to snapshots, by snapshot id.
#[derive(Default)]
pub struct Names {
    all: Mutex<HashMap<String, Label>>,
}

impl Names {
    fn get(&self, id: &str) -> Label {
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .unwrap_or_default()
    }
}

fn snapshot_view(names: &Names, s: &Snapshot) -> SnapshotView {
    let (name, description) = names.get(&s.id);
    SnapshotView {
        id: s.id.clone(),
        sandbox_id: s.source_sandbox_id.clone(),
        created_at: rfc3339(s.created_at),
        name,
        description,
        expires_at: s.expires_at.map(rfc3339),
    }
}

/// The sandbox's snapshots, newest first.
fn snapshots_of(st: &AppState, id: &str) -> Result<Vec<Snapshot>> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let page = st.sandboxes.list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(id.to_owned()),
            status: Some(SnapshotStatus::Created),
            limit: Some(200),
            cursor,
            ..ListSnapshotsQuery::default()
        })?;
        all.extend(page.snapshots);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(all),
        }
    }
}

/// The snapshot a paused sandbox's pause took.
fn paused_rootfs(st: &AppState, s: &Sandbox) -> Result<Snapshot> {
    snapshots_of(st, &s.id)?.into_iter().next().ok_or_else(|| {
        Sandbox0Error::Conflict(format!("Sandbox {} has no rootfs checkpoint", s.id))
    })
}

pub async fn create(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<CreateSnapshotRequest>,
) -> Result<Response> {
    let expiration_ms = match req.expires_at.as_deref().filter(|e| !e.is_empty()) {
        None => None,
        Some(at) => {
            let at = parse_rfc3339(at).ok_or_else(|| {
                Sandbox0Error::BadRequest("expires_at: not an RFC 3339 time".into())
            })?;
            Some((at - now_ms()).max(1))
        }
    };
    let s = st.sandboxes.get(&id)?;
    let snapshot = if sandboxes::status_of(&s) == Status::Paused && s.status.is_final() {
        let snap = paused_rootfs(&st, &s)?;
        match expiration_ms {
            Some(ms) => st.sandboxes.set_snapshot_expiration(&snap.id, ms)?,
            None => snap,
        }
    } else {
        let sandboxes = st.sandboxes.clone();
        let req = CreateSnapshot {
            keep_running: Some(true),
            expiration_ms,
            path: None,
        };
        detached(async move { Ok(sandboxes.snapshot(&id, req).await?) }).await?
    };
    layer
        .snapshots
        .all
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(snapshot.id.clone(), (req.name, req.description));
    let body = snapshot_view(&layer.snapshots, &snapshot);
    Ok((StatusCode::CREATED, Json(Success::new(body))).into_response())
}

pub async fn list(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(id): S0Path<String>,
) -> Result<Response> {
    st.sandboxes.get(&id)?;
    let snapshots: Vec<SnapshotView> = snapshots_of(&st, &id)?
        .iter()
        .map(|s| snapshot_view(&layer.snapshots, s))
        .collect();
    let count = snapshots.len();
    Ok(Json(Success::new(SnapshotList { snapshots, count })).into_response())
}

fn live_snapshot(st: &AppState, id: &str) -> Result<Snapshot> {
    let s = st.sandboxes.get_snapshot(id)?;
    if s.status != SnapshotStatus::Created {
        return Err(Sandbox0Error::NotFound(format!("Snapshot {id} not found")));
    }
    Ok(s)
}

pub async fn get_one(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(id): S0Path<String>,
) -> Result<Response> {
    let s = live_snapshot(&st, &id)?;
    Ok(Json(Success::new(snapshot_view(&layer.snapshots, &s))).into_response())
}

pub async fn delete(
    State(st): State<AppState>,
    Extension(layer): Shared,
    S0Path(id): S0Path<String>,
) -> Result<Response> {
    live_snapshot(&st, &id)?;
    let sandboxes = st.sandboxes.clone();
    let sid = id.clone();
    detached(async move { Ok(sandboxes.delete_snapshot(&sid).await?) }).await?;
    layer
        .snapshots
        .all
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    Ok(Json(Success::new(Done {
        deleted: Some(true),
        ..Done::default()
    }))
    .into_response())
}

pub async fn restore(S0Path(_id): S0Path<String>) -> Result<Response> {
    Err(Sandbox0Error::NotImplemented(
        "restoring a sandbox's rootfs in place (claim a sandbox with snapshot_id instead)".into(),
    ))
}

pub async fn fork(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<ForkRequest>,
) -> Result<Response> {
    if req.memory.unwrap_or(false) {
        return Err(Sandbox0Error::NotImplemented("memory fork".into()));
    }
    let config = req.config.unwrap_or_default();
    let ttl = config.ttl;
    let hard = config.hard_ttl;
    if ttl.is_some_and(|t| t < 0) || hard.is_some_and(|t| t < 0) {
        return Err(Sandbox0Error::BadRequest(
            "config.ttl, config.hard_ttl: must be 0 (none) or positive".into(),
        ));
    }
    let source = st.sandboxes.get(&id)?;
    let st2 = st.clone();
    let forked = detached(async move {
        let st = st2;
        let mut forked = if source.status.is_final() {
            let snap = paused_rootfs(&st, &source)?;
            let create = CreateSandbox {
                image: Some(source.image.clone()),
                vcpus: Some(source.vcpus),
                memory_mib: Some(source.memory_mib),
                disk_mib: Some(source.disk_mib),
                timeout_ms: Some(source.timeout_ms),
                env: Some(source.env.clone()),
                tags: Some(source.tags.clone()),
                source: Some(Source::Snapshot {
                    snapshot_id: snap.id,
                }),
                network_policy: source.network_policy.clone(),
                persistent: Some(true),
                hard_ttl_ms: source.lifecycle.hard_ttl_ms,
                auto_resume: Some(source.lifecycle.auto_resume),
                ..CreateSandbox::default()
            };
            st.sandboxes.create(create).await?
        } else {
            st.sandboxes
                .fork(&source.id, ForkSandbox::default())
                .await?
        };
        let mut tags = forked.tags.clone();
        if let Some(t) = ttl {
            tags.insert(sandboxes::TAG_TTL.into(), t.to_string());
        }
        let max = st.sandboxes.settings().max_timeout_ms;
        let timeout = ttl.map(|t| {
            if t == 0 {
                max
            } else {
                t.saturating_mul(1000).min(max)
            }
        });
        let change = Reconfigure {
            timeout_ms: timeout,
            expires_in_ms: timeout,
            hard_ttl_ms: hard.map(|h| (h > 0).then(|| h.saturating_mul(1000))),
            ..Reconfigure::default()
        };
        if change != Reconfigure::default() {
            forked = st.sandboxes.reconfigure(&forked.id, change).await?;
        }
        if tags != forked.tags {
            let update = belljar_api::UpdateSandbox {
                tags: Some(tags),
                ..Default::default()
            };
            forked = st.sandboxes.update(&forked.id, update).await?;
        }
        Ok(forked)
    })
    .await?;
    let body = ForkData {
        source_sandbox_id: id,
        sandbox: view(&forked),
    };
    Ok((StatusCode::CREATED, Json(Success::new(body))).into_response())
}
