//! A sandbox's tags (`set_tags`, `get_tags`), its name (`Sandbox.create(name=)`,
//! `Sandbox.from_name`) and `Sandbox.list(app_id=, tags=)`.
//!
//! Modal's tags are the daemon sandbox's own tags, beside the layer's under `modal.`, which
//! the client neither sees nor may set. `list` answers the running sandboxes, newest first,
//! a page at a time: the client asks for the next page with the creation time of the last.
//! A name is a tag of the layer's (`modal.name`), unique among the app's running sandboxes.

use std::collections::BTreeMap;

use belljar_api::{ListSandboxesQuery, UpdateSandbox};

use super::error::{ModalError, Result};
use belljar_api::Sandbox;

use super::sandboxes::{self, TAG_APP, TAG_NAME};
use super::wire::{
    Empty, SandboxGetFromNameRequest, SandboxGetFromNameResponse, SandboxInfo, SandboxListRequest,
    SandboxListResponse, SandboxTag, SandboxTagsGetRequest, SandboxTagsGetResponse,
    SandboxTagsSetRequest, TaskInfo,
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

/// Refuses a name Modal would refuse: 1 to 64 letters, digits, `-`, `_` and `.`.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ModalError::BadRequest(format!(
            "Invalid Sandbox name {name:?}: 1 to 64 letters, digits, '-', '_' and '.'"
        )))
    }
}

/// The newest sandbox of app `app_id` named `name`: one that runs, or with `ended` also one
/// that has ended.
pub fn named(m: &Modal, app_id: &str, name: &str, ended: bool) -> Result<Option<Sandbox>> {
    let mut query = ListSandboxesQuery {
        tag: Some(format!("{TAG_NAME}={name}")),
        limit: Some(200),
        ..ListSandboxesQuery::default()
    };
    loop {
        let page = m.st().sandboxes.list(&query)?;
        for s in page.sandboxes {
            if s.tags.get(TAG_APP).map(String::as_str) != Some(app_id) {
                continue;
            }
            if ended || sandboxes::result_of(m, &s)?.is_none() {
                return Ok(Some(s));
            }
        }
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return Ok(None),
        }
    }
}

/// `Sandbox.from_name(app_name, name)`.
pub async fn from_name(
    m: Modal,
    req: SandboxGetFromNameRequest,
) -> Result<SandboxGetFromNameResponse> {
    let environment = if req.environment_name.is_empty() {
        "main"
    } else {
        req.environment_name.as_str()
    };
    let app_id = ids::app(environment, &req.app_name);
    let found = match named(&m, &app_id, &req.sandbox_name, false)? {
        Some(s) => Some(s),
        None if req.include_terminated => named(&m, &app_id, &req.sandbox_name, true)?,
        None => None,
    };
    let s = found.ok_or_else(|| {
        ModalError::NotFound(format!(
            "Sandbox with name '{}' not found in app '{}'",
            req.sandbox_name, req.app_name
        ))
    })?;
    let result = sandboxes::result_of(&m, &s)?;
    Ok(SandboxGetFromNameResponse {
        sandbox_id: ids::sandbox(&s.id),
        metadata: Some(sandboxes::metadata(&s, result)),
    })
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

/// Modal's float seconds as milliseconds (a NaN is 0, a huge value `i64::MAX`).
#[expect(
    clippy::cast_possible_truncation,
    reason = "float to int saturates, which is what is wanted"
)]
fn seconds_to_ms(seconds: f64) -> i64 {
    (seconds * 1000.0) as i64
}

/// A page of the sandboxes of `app_id` (any app when empty) that carry every tag asked for.
pub async fn list(m: Modal, req: SandboxListRequest) -> Result<SandboxListResponse> {
    let wanted: Vec<(String, String)> = req
        .tags
        .into_iter()
        .map(|t| (t.tag_name, t.tag_value))
        .collect();
    let until = (req.before_timestamp > 0.0).then(|| seconds_to_ms(req.before_timestamp) - 1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_modals_and_own_tags_are_hidden() {
        assert!(check_name("worker-1.a_b").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let tags = BTreeMap::from([
            ("modal.app".to_owned(), "ap-x".to_owned()),
            ("role".to_owned(), "web".to_owned()),
        ]);
        assert_eq!(
            shown(&tags),
            [SandboxTag {
                tag_name: "role".into(),
                tag_value: "web".into()
            }]
        );
    }
}
