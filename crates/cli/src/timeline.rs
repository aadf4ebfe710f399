//! The commands that move sandboxes through time: `snapshot`, `snapshots [ls|rm|diff]`,
//! `fork`, `pause`, `resume`, `start`, and `mount`/`unmount` of directory snapshots.

use anyhow::Result;
use belljar_client::Client;

use crate::args::{ForkArgs, SnapshotsCmd};
use crate::commands::{key_values, print_json, resolve};
use belljar_cli::duration::parse_ms;
use belljar_cli::output::now_ms;

/// `belljar snapshot ID [--keep-running | --path DIR] [--expiration D]`.
pub(crate) async fn snapshot(
    client: &Client,
    id: &str,
    (keep_running, path): (bool, Option<String>),
    expiration: Option<String>,
    json: bool,
) -> Result<i32> {
    let id = resolve(client, id).await?;
    let mut req = belljar_cli::snapshots::request(keep_running, expiration.as_deref())?;
    req.path = path;
    let snap = client.snapshot_sandbox(&id, &req).await?;
    if json {
        print_json(&snap)?;
    } else {
        outln!("{}", belljar_cli::snapshots::taken(&snap))?;
    }
    Ok(0)
}

/// `belljar mount ID [SNAPSHOT PATH]`: mounts a directory snapshot into the running
/// sandbox, or lists its mounts (`SNAPSHOT PATH` per line).
pub(crate) async fn mount(
    client: &Client,
    id: &str,
    what: Option<(String, String)>,
    json: bool,
) -> Result<i32> {
    let id = resolve(client, id).await?;
    if let Some((snapshot_id, path)) = what {
        let m = client
            .mount_snapshot(&id, &belljar_api::SnapshotMount { snapshot_id, path })
            .await?;
        if json {
            print_json(&m)?;
        }
        return Ok(0);
    }
    let mounts = client.sandbox_mounts(&id).await?;
    if json {
        print_json(&mounts)?;
    } else {
        for m in mounts.mounts {
            outln!("{} {}", m.snapshot_id, m.path)?;
        }
    }
    Ok(0)
}

/// `belljar unmount ID PATH`.
pub(crate) async fn unmount(client: &Client, id: &str, path: &str) -> Result<i32> {
    let id = resolve(client, id).await?;
    client.unmount_snapshot(&id, path).await?;
    Ok(0)
}

pub(crate) async fn pause_or_resume(
    client: &Client,
    ids: Vec<String>,
    pause: bool,
    json: bool,
) -> Result<i32> {
    for id in ids {
        let id = resolve(client, &id).await?;
        let s = if pause {
            client.pause_sandbox(&id).await?
        } else {
            client.resume_sandbox(&id).await?
        };
        if json {
            print_json(&s)?;
        }
    }
    Ok(0)
}

/// `belljar start ID...`: each stopped persistent sandbox again, from its latest snapshot.
pub(crate) async fn start(client: &Client, ids: Vec<String>, json: bool) -> Result<i32> {
    for id in ids {
        let id = resolve(client, &id).await?;
        let s = client.start_sandbox(&id).await?;
        if json {
            print_json(&s)?;
        } else {
            outln!("{}", s.id)?;
        }
    }
    Ok(0)
}

pub(crate) async fn snapshots(
    client: &Client,
    action: Option<SnapshotsCmd>,
    json: bool,
) -> Result<i32> {
    match action.unwrap_or(SnapshotsCmd::Ls { sandbox: None }) {
        SnapshotsCmd::Ls { sandbox } => {
            let all = belljar_cli::snapshots::all(client, sandbox).await?;
            if json {
                print_json(&all)?;
            } else {
                out!("{}", belljar_cli::snapshots::list(&all, now_ms()))?;
            }
            Ok(0)
        }
        SnapshotsCmd::Diff { a, b } => {
            let to = match b {
                Some(b) if !b.starts_with("snap_") => Some(resolve(client, &b).await?),
                b => b,
            };
            let d = client.snapshot_diff(&a, to.as_deref()).await?;
            if json {
                print_json(&d)?;
            } else {
                out!("{}", belljar_cli::snapshots::diff(&d))?;
            }
            Ok(0)
        }
        SnapshotsCmd::Rm { ids } => {
            for id in ids {
                let snap = client.delete_snapshot(&id).await?;
                if json {
                    print_json(&snap)?;
                }
            }
            Ok(0)
        }
    }
}

/// `belljar fork ID [--name N] [--env K=V]... [--tag k=v]... [--timeout D]`.
pub(crate) async fn fork(client: &Client, a: ForkArgs, json: bool) -> Result<i32> {
    let id = resolve(client, &a.id).await?;
    let env = key_values("--env", &a.env)?;
    let tags = key_values("--tag", &a.tags)?;
    let req = belljar_api::ForkSandbox {
        name: a.name,
        // None keeps the source's: an empty map from no flags would wipe them.
        env: (!env.is_empty()).then_some(env),
        tags: (!tags.is_empty()).then_some(tags),
        timeout_ms: a.timeout.as_deref().map(parse_ms).transpose()?,
    };
    let s = client.fork_sandbox(&id, &req).await?;
    if json {
        print_json(&s)?;
    } else {
        outln!("{}", s.id)?;
    }
    Ok(0)
}
