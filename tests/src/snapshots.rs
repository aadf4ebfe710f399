//! Snapshot requests and checks the snapshot suites share (live and directory snapshots,
//! mounts, the layers the daemon holds).

use belljar_api::{CreateSandbox, CreateSnapshot, Sandbox, Snapshot, SnapshotMount};
use belljar_client::Client;

use crate::{Daemon, sh_ok};

/// A live snapshot: the sandbox keeps running.
pub fn live() -> CreateSnapshot {
    CreateSnapshot {
        keep_running: Some(true),
        ..Default::default()
    }
}

/// A snapshot of one directory of a running sandbox.
pub fn of_directory(path: &str) -> CreateSnapshot {
    CreateSnapshot {
        path: Some(path.into()),
        ..Default::default()
    }
}

/// Snapshot `snapshot_id` mounted at `path`.
pub fn mount(snapshot_id: &str, path: &str) -> SnapshotMount {
    SnapshotMount {
        snapshot_id: snapshot_id.into(),
        path: path.into(),
    }
}

/// How many layers the daemon keeps (each snapshot's, until its last holder is gone).
pub fn layer_count(d: &Daemon) -> usize {
    std::fs::read_dir(d.paths.data.join("layers"))
        .map(|r| r.count())
        .unwrap_or(0)
}

/// A new sandbox that ran `script`, and a snapshot of its directory `path`.
pub async fn directory_of_new_sandbox(
    d: &Daemon,
    c: &Client,
    script: &str,
    path: &str,
) -> (Sandbox, Snapshot) {
    let a = d.create(c, CreateSandbox::default()).await;
    sh_ok(c, &a.id, script).await;
    let snap = c
        .snapshot_sandbox(&a.id, &of_directory(path))
        .await
        .unwrap_or_else(|e| panic!("directory snapshot of {path}: {e}"));
    (a, snap)
}
