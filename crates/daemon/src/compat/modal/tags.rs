//! A sandbox's tags (`set_tags`, `get_tags`) and `Sandbox.list(app_id=, tags=)`.
//!
//! Modal's tags are the daemon sandbox's own tags, beside the layer's under `modal.`, which
//! the client neither sees nor may set. `list` answers the running sandboxes, newest first,
//! a page at a time: the client asks for the next page with the creation time of the last.

use std::collections::BTreeMap;

use belljar_api::{ListSandboxesQuery, UpdateSandbox};

use super::error::{ModalError, Result};
use super::sandboxes::{self, TAG_APP};
use super::wire::{
    Empty, SandboxInfo, SandboxListRequest, SandboxListResponse, SandboxTag, SandboxTagsGetRequest,
    SandboxTagsGetResponse, SandboxTagsSetRequest, TaskInfo,
};
use super::{Modal, detached, ids};

/// The most sandboxes one page of `list` answers.
const PAGE: usize = 100;

fn is_own(name: &str) -> bool {
    name.starts_with("modal.")
}

fn shown(tags: &BTreeMap<String, String>) -> Vec<SandboxTag> {
    tags.iter()
        .filter(|(k, _)| !is_own(k))
        .map(|(k, v)| SandboxTag {
            tag_name: k.clone(),
            tag_value: v.clone(),
        })
        .collect()
}

/// Replaces the sandbox's tags (the layer's own stay).
pub async fn set(m: Modal, req: SandboxTagsSetRequest) -> Result<Empty> {
    let s = sandboxes::get(&m, &req.sandbox_id)?;
    if req.tags.iter().any(|t| is_own(&t.tag_name)) {
        return Err(ModalError::BadRequest(
            "tags: names under `modal.` are Belljar's own".into(),
        ));
    }
    let mut tags: BTreeMap<String, String> = s
        .tags
        .iter()
        .filter(|(k, _)| is_own(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    tags.extend(req.tags.into_iter().map(|t| (t.tag_name, t.tag_value)));
    let sandboxes = m.st().sandboxes.clone();
    detached(async move {
        let update = UpdateSandbox {
            tags: Some(tags),
            ..UpdateSandbox::default()
        };
        sandboxes.update(&s.id, update).await?;
        Ok(())
    })
    .await?;
    Ok(Empty {})
}

pub async fn get(m: Modal, req: SandboxTagsGetRequest) -> Result<SandboxTagsGetResponse> {
    let s = sandboxes::get(&m, &req.sandbox_id)?;
    Ok(SandboxTagsGetResponse {
        tags: shown(&s.tags),
    })
}

/// A page of the sandboxes of `app_id` (any app when empty) that carry every tag asked for.
pub async fn list(m: Modal, req: SandboxListRequest) -> Result<SandboxListResponse> {
    let wanted: Vec<(String, String)> = req
        .tags
        .into_iter()
        .map(|t| (t.tag_name, t.tag_value))
        .collect();
    let until = (req.before_timestamp > 0.0).then(|| (req.before_timestamp * 1000.0) as i64 - 1);
    let mut query = ListSandboxesQuery {
        tag: (!req.app_id.is_empty()).then(|| format!("{TAG_APP}={}", req.app_id)),
        until,
        limit: Some(200),
        ..ListSandboxesQuery::default()
    };
    let mut out = Vec::new();
    loop {
        let page = m.st().sandboxes.list(&query)?;
        for s in page.sandboxes {
            let Some(app) = s.tags.get(TAG_APP).cloned() else {
                continue;
            };
            if !wanted.iter().all(|(k, v)| s.tags.get(k) == Some(v)) {
                continue;
            }
            let result = sandboxes::result_of(&m, &s)?;
            if result.is_some() && !req.include_finished {
                continue;
            }
            out.push(SandboxInfo {
                id: ids::sandbox(&s.id),
                created_at: s.created_at as f64 / 1000.0,
                task_info: Some(TaskInfo {
                    id: ids::task(&s.id),
                    result: result.clone(),
                    sandbox_id: ids::sandbox(&s.id),
                }),
                app_id: app,
                tags: shown(&s.tags),
                metadata: Some(sandboxes::metadata(&s, result)),
            });
            if out.len() == PAGE {
                return Ok(SandboxListResponse { sandboxes: out });
            }
        }
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return Ok(SandboxListResponse { sandboxes: out }),
        }
    }
}
