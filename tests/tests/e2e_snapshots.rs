//! Snapshots on the namespace backend, through a real daemon: taken with and without stopping
//! the sandbox; sandboxes made from them see the same files, deletions (whiteouts), opaque
//! directories, owners and modes; a snapshot others build on can be deleted without taking
//! their files; bad requests get clear errors; retention and expiry apply across a restart;
//! and a daemon killed with `kill -9` during a snapshot loses nothing.
//!
//! Needs root and the `base` image (as every e2e test).

use std::path::PathBuf;
use std::time::Duration;

use belljar_api::{
    CreateSandbox, CreateSnapshot, KeepLastSnapshots, ListSnapshotsQuery, Sandbox, SandboxStatus,
    Snapshot, SnapshotStatus, Source,
};
use belljar_e2e::{Daemon, eventually, sh_ok, snapshots};

fn from(snapshot_id: &str) -> CreateSandbox {
    CreateSandbox {
        source: Some(Source::Snapshot {
            snapshot_id: snapshot_id.into(),
        }),
        ..Default::default()
    }
}

fn layers_dir(d: &Daemon) -> PathBuf {
    d.paths.data.join("layers")
}

/// The names in the layers directory.
fn layer_names(d: &Daemon) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(layers_dir(d))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

const CHANGES: &str = "set -e
    printf hello > /workspace/new.txt
    chown 1000:1000 /workspace/new.txt
    chmod 640 /workspace/new.txt
    cp /bin/true /usr/local/bin/suid && chmod 4755 /usr/local/bin/suid
    ln -s /workspace/new.txt /workspace/link
    rm /etc/debian_version
    rm -rf /usr/share/doc
    rm -rf /etc/apt && mkdir /etc/apt && echo only > /etc/apt/only
    mkfifo /workspace/fifo";

const CHECKS: &str = "set -e
    test \"$(cat /workspace/new.txt)\" = hello
    test \"$(stat -c '%a %u %g' /workspace/new.txt)\" = '640 1000 1000'
    test \"$(stat -c '%a' /usr/local/bin/suid)\" = 4755
    test \"$(readlink /workspace/link)\" = /workspace/new.txt
    test ! -e /etc/debian_version
    test ! -e /usr/share/doc
    test \"$(ls /etc/apt)\" = only
    test -p /workspace/fifo
    test -e /etc/passwd
    echo checked";

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_keep_files_deletions_and_modes_and_outlive_their_users() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    sh_ok(&c, &a.id, CHANGES).await;

    // Vercel's semantics: the sandbox stops and its writable layer is the snapshot.
    let first = c
        .snapshot_sandbox(&a.id, &CreateSnapshot::default())
        .await
        .unwrap();
    assert_eq!(first.status, SnapshotStatus::Created);
    assert_eq!(first.source_sandbox_id, a.id);
    assert_eq!((first.parent.as_deref(), first.depth), (None, 1));
    assert!(first.size_bytes >= 5, "{first:?}");
    assert!(first.frozen_ms.is_none());
    assert!(first.expires_at.is_some(), "30 days by default");
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Stopped
    );
    assert_eq!(c.snapshot(&first.id).await.unwrap(), first);

    let b = d.create(&c, from(&first.id)).await;
    assert_eq!(sh_ok(&c, &b.id, CHECKS).await.trim(), "checked");

    // A live snapshot: the sandbox keeps running and its processes were frozen a while.
    sh_ok(
        &c,
        &b.id,
        "rm /workspace/new.txt && echo second > /workspace/second.txt",
    )
    .await;
    let second = c
        .snapshot_sandbox(
            &b.id,
            &CreateSnapshot {
                keep_running: Some(true),
                expiration_ms: Some(0),
                path: None,
            },
        )
        .await
        .unwrap();
    assert!(second.frozen_ms.is_some(), "{second:?}");
    assert_eq!(second.parent.as_deref(), Some(first.id.as_str()));
    assert_eq!((second.depth, second.expires_at), (2, None));
    assert_eq!(
        c.sandbox(&b.id).await.unwrap().status,
        SandboxStatus::Running
    );
    sh_ok(&c, &b.id, "echo still-running > /workspace/after.txt").await;

    let c2 = d.create(&c, from(&second.id)).await;
    sh_ok(
        &c,
        &c2.id,
        "test ! -e /workspace/new.txt && test \"$(cat /workspace/second.txt)\" = second \
         && test ! -e /workspace/after.txt && test ! -e /etc/debian_version \
         && test \"$(ls /etc/apt)\" = only",
    )
    .await;

    // Listing: by sandbox, and page by page.
    let of_a = c
        .list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(a.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_a.snapshots.len(), 1);
    assert_eq!(of_a.snapshots[0].id, first.id);
    // Making a sandbox from it restarted its expiration.
    assert!(of_a.snapshots[0].expires_at > first.expires_at, "{of_a:?}");
    let page = c
        .list_snapshots(&ListSnapshotsQuery {
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.snapshots[0].id, second.id);
    let rest = c
        .list_snapshots(&ListSnapshotsQuery {
            cursor: page.next_cursor.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rest.snapshots[0].id, first.id);

    // Bad requests.
    let err = c
        .snapshot_sandbox(&a.id, &CreateSnapshot::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "sandbox_not_running", "{err}");
    let err = c
        .create_sandbox(&from("snap_nosuchthing"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert!(err.to_string().contains("snap_nosuchthing"), "{err}");
    let err = c
        .snapshot_sandbox(
            &b.id,
            &CreateSnapshot {
                expiration_ms: Some(-1),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "bad_request", "{err}");
    assert!(err.to_string().contains("expiration_ms"), "{err}");
    for count in [0, 11] {
        let err = c
            .create_sandbox(&CreateSandbox {
                keep_last_snapshots: Some(KeepLastSnapshots {
                    count,
                    expiration_ms: None,
                    delete_evicted: None,
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), "bad_request", "{err}");
        assert!(
            err.to_string().contains("keep_last_snapshots.count"),
            "{err}"
        );
    }
    let err = c.snapshot("snap_nosuchthing").await.unwrap_err();
    assert_eq!(err.code(), "not_found");

    // Deleting a snapshot that sandboxes and another snapshot build on keeps their files.
    let deleted = c.delete_snapshot(&first.id).await.unwrap();
    assert_eq!(deleted.status, SnapshotStatus::Deleted);
    sh_ok(
        &c,
        &b.id,
        "test -p /workspace/fifo && test ! -e /etc/debian_version && test ! -e /usr/share/doc \
         && test \"$(ls /etc/apt)\" = only && test \"$(stat -c %a /usr/local/bin/suid)\" = 4755",
    )
    .await;
    let err = c.create_sandbox(&from(&first.id)).await.unwrap_err();
    assert_eq!(err.code(), "snapshot_not_usable", "{err}");
    let c3 = d.create(&c, from(&second.id)).await;
    sh_ok(&c, &c3.id, "test \"$(ls /etc/apt)\" = only").await;
    assert_eq!(layer_names(&d).len(), 2, "both layers are still held");

    // Once nothing holds them, the layers go.
    c.delete_snapshot(&second.id).await.unwrap();
    for id in [&b.id, &c2.id] {
        c.delete_sandbox(id).await.unwrap();
    }
    assert_eq!(layer_names(&d).len(), 2, "c3 still builds on both");
    c.delete_sandbox(&c3.id).await.unwrap();
    assert_eq!(layer_names(&d), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_and_expiry_apply_across_a_restart() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d
        .create(
            &c,
            CreateSandbox {
                keep_last_snapshots: Some(KeepLastSnapshots {
                    count: 1,
                    expiration_ms: Some(0),
                    delete_evicted: None,
                }),
                snapshot_expiration_ms: Some(3_600_000),
                ..Default::default()
            },
        )
        .await;
    let live = snapshots::live();
    sh_ok(&c, &a.id, "echo 1 > /workspace/n").await;
    let one = c.snapshot_sandbox(&a.id, &live).await.unwrap();
    sh_ok(&c, &a.id, "echo 2 > /workspace/n").await;
    let two = c.snapshot_sandbox(&a.id, &live).await.unwrap();
    // Keep the last one, and it never expires; the first was evicted.
    assert_eq!(
        c.snapshot(&one.id).await.unwrap().status,
        SnapshotStatus::Deleted
    );
    let two = c.snapshot(&two.id).await.unwrap();
    assert_eq!(
        (two.status, two.expires_at),
        (SnapshotStatus::Created, None)
    );

    // An expiry that passes while the daemon is down is applied when it starts again.
    let b = d.create(&c, CreateSandbox::default()).await;
    sh_ok(&c, &b.id, "echo short > /workspace/n").await;
    let short = c
        .snapshot_sandbox(
            &b.id,
            &CreateSnapshot {
                keep_running: Some(true),
                expiration_ms: Some(1),
                path: None,
            },
        )
        .await
        .unwrap();
    d.kill9();
    d.restart();
    let c = d.unix();
    eventually(Duration::from_secs(20), "the expired snapshot deleted", || {
        let c = c.clone();
        let id = short.id.clone();
        async move {
            (c.snapshot(&id).await.ok()?.status == SnapshotStatus::Deleted).then_some(())
        }
    })
    .await;
    assert_eq!(
        c.snapshot(&two.id).await.unwrap().status,
        SnapshotStatus::Created
    );
}

/// The sandbox's `snapshot_expiration_ms` is a new snapshot's default (a stopping one's
/// too); `keep_last_snapshots` with `delete_evicted: false` keeps what it evicts, uncounted,
/// on the sandbox's own expiration; `since`/`until` pick snapshots by creation time.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_defaults_retention_without_deleting_and_time_filters() {
    let d = Daemon::start();
    let c = d.unix();
    let hour = 3_600_000;
    let a = d
        .create(
            &c,
            CreateSandbox {
                snapshot_expiration_ms: Some(hour),
                ..Default::default()
            },
        )
        .await;
    let stopping = c
        .snapshot_sandbox(&a.id, &CreateSnapshot::default())
        .await
        .unwrap();
    assert_eq!(stopping.expires_at, Some(stopping.created_at + hour));

    let b = d
        .create(
            &c,
            CreateSandbox {
                snapshot_expiration_ms: Some(2 * hour),
                keep_last_snapshots: Some(KeepLastSnapshots {
                    count: 2,
                    expiration_ms: Some(0),
                    delete_evicted: Some(false),
                }),
                ..Default::default()
            },
        )
        .await;
    let live = snapshots::live();
    let mut taken = Vec::new();
    for n in 0..4 {
        sh_ok(&c, &b.id, &format!("echo {n} > /workspace/n")).await;
        taken.push(c.snapshot_sandbox(&b.id, &live).await.unwrap());
    }
    let now: Vec<_> = current(&c, &taken).await;
    // Nothing deleted; the newest two are kept (never expire), the others evicted, each on
    // the sandbox's expiration from when it was evicted (by the third and the fourth).
    assert!(
        now.iter().all(|s| s.status == SnapshotStatus::Created),
        "{now:?}"
    );
    assert_eq!((now[2].expires_at, now[3].expires_at), (None, None));
    for (evicted, by) in [(&now[0], &taken[2]), (&now[1], &taken[3])] {
        assert_eq!(
            evicted.expires_at,
            Some(by.created_at + 2 * hour),
            "{evicted:?}"
        );
    }

    // `since` is inclusive, `until` exclusive, both on `created_at`.
    let times = |since: Option<i64>, until: Option<i64>| {
        let c = c.clone();
        let id = b.id.clone();
        async move {
            let q = ListSnapshotsQuery {
                sandbox_id: Some(id),
                since,
                until,
                ..Default::default()
            };
            let mut ids: Vec<String> = c
                .list_snapshots(&q)
                .await
                .unwrap()
                .snapshots
                .into_iter()
                .map(|s| s.id)
                .collect();
            ids.reverse();
            ids
        }
    };
    let ids = |from: usize, to: usize| -> Vec<String> {
        taken[from..to].iter().map(|s| s.id.clone()).collect()
    };
    // A command ran between each two: they are at least a millisecond apart.
    assert!(taken.windows(2).all(|w| w[0].created_at < w[1].created_at));
    assert_eq!(times(Some(taken[1].created_at), None).await, ids(1, 4));
    assert_eq!(times(None, Some(taken[2].created_at)).await, ids(0, 2));
    assert_eq!(
        times(Some(taken[1].created_at), Some(taken[3].created_at)).await,
        ids(1, 3)
    );
    assert_eq!(times(Some(taken[3].created_at + 1), None).await, ids(0, 0));
    assert_eq!(times(None, Some(taken[0].created_at)).await, ids(0, 0));
    assert_eq!(times(None, None).await, ids(0, 4));
}

/// The snapshots `taken`, as they are now.
async fn current(c: &belljar_client::Client, taken: &[Snapshot]) -> Vec<Snapshot> {
    let mut now = Vec::new();
    for s in taken {
        now.push(c.snapshot(&s.id).await.unwrap());
    }
    now
}

/// Writes 128 MiB into a new sandbox (enough that the copy is still under way when the
/// daemon dies), takes the snapshot `req` of it and kills the daemon with `kill -9` while the
/// layer is being copied, then starts it again; returns the sandbox and the file's hash.
async fn snapshot_cut_by_kill_9(d: &Daemon, req: CreateSnapshot) -> (Sandbox, String) {
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    let sum = sh_ok(
        &c,
        &a.id,
        "head -c 128M /dev/urandom > /workspace/big && sha256sum /workspace/big | cut -c1-64",
    )
    .await;
    let snapshotting = {
        let id = a.id.clone();
        tokio::spawn(async move { c.snapshot_sandbox(&id, &req).await })
    };
    eventually(Duration::from_secs(30), "a layer being copied", || {
        let names = layer_names(d);
        async move { names.iter().any(|n| n.starts_with(".tmp-")).then_some(()) }
    })
    .await;
    d.kill9();
    assert!(
        snapshotting.await.unwrap().is_err(),
        "the daemon died mid-copy"
    );
    d.restart();
    (a, sum)
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_live_snapshot_loses_nothing() {
    let d = Daemon::start();
    let (a, sum) = snapshot_cut_by_kill_9(&d, snapshots::live()).await;
    let c = d.unix();
    // Either the snapshot exists complete or not at all; no half copy is left.
    let all = c
        .list_snapshots(&ListSnapshotsQuery::default())
        .await
        .unwrap();
    assert!(
        all.snapshots
            .iter()
            .all(|s| s.status == SnapshotStatus::Created),
        "{all:?}"
    );
    assert!(
        layer_names(&d).iter().all(|n| !n.starts_with(".tmp-")),
        "{:?}",
        layer_names(&d)
    );
    assert_eq!(layer_names(&d).len(), all.snapshots.len());
    // The sandbox was thawed and runs on with its files.
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Running
    );
    let again = sh_ok(&c, &a.id, "sha256sum /workspace/big | cut -c1-64").await;
    assert_eq!(again, sum);
    // A snapshot now is whole.
    let snap = c
        .snapshot_sandbox(&a.id, &CreateSnapshot::default())
        .await
        .unwrap();
    let b = d.create(&c, from(&snap.id)).await;
    assert_eq!(
        sh_ok(&c, &b.id, "sha256sum /workspace/big | cut -c1-64").await,
        sum
    );
}

/// A stopping snapshot (the default) cut by `kill -9` mid-copy: the sandbox has stopped, so
/// its writable layer is the only copy of its files, and a sandbox that is not persistent
/// never starts again to take another. The next start finishes the snapshot from that layer.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_stopping_snapshot_loses_nothing() {
    let d = Daemon::start();
    // The copy begins once the sandbox has stopped.
    let (a, sum) = snapshot_cut_by_kill_9(&d, CreateSnapshot::default()).await;
    assert!(!a.lifecycle.persistent);
    let c = d.unix();
    // The snapshot exists, complete, and no half copy is left.
    let all = c
        .list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(a.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let [snap] = all.snapshots.as_slice() else {
        panic!("one snapshot of {}: {all:?}\n{}", a.id, d.log())
    };
    assert_eq!(snap.status, SnapshotStatus::Created, "{snap:?}");
    assert!(snap.expires_at.is_some(), "the default expiration");
    assert_eq!(layer_names(&d).len(), 1, "{:?}", layer_names(&d));
    let stopped = c.sandbox(&a.id).await.unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    let b = d.create(&c, from(&snap.id)).await;
    assert_eq!(
        sh_ok(&c, &b.id, "sha256sum /workspace/big | cut -c1-64").await,
        sum
    );
    // The two other cuts, made by hand: the daemon died after the snapshot's row was
    // committed (a's intent names it), or before the sandbox began to stop (b runs on).
    let intent = |id: &str, snapshot_id: &str| {
        let path = d
            .paths
            .data
            .join("sandboxes")
            .join(id)
            .join("snapshot-stopping");
        let json = format!(r#"{{"snapshot_id":"{snapshot_id}","expiration_ms":null}}"#);
        std::fs::write(&path, json).unwrap();
        path
    };
    let cut = [
        intent(&a.id, &snap.id),
        intent(&b.id, "snap_neverrecorded0"),
    ];
    d.kill9();
    d.restart();
    let c = d.unix();
    let all = c
        .list_snapshots(&ListSnapshotsQuery::default())
        .await
        .unwrap();
    assert_eq!(all.snapshots.len(), 1, "{all:?}");
    assert!(cut.iter().all(|p| !p.exists()), "the intents are settled");
    assert_eq!(
        c.sandbox(&b.id).await.unwrap().status,
        SandboxStatus::Running
    );
}

/// The CLI: `belljar snapshot`, `belljar snapshots [ls|rm]`, `belljar create --from`.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_takes_lists_uses_and_deletes_snapshots() {
    use belljar_e2e::{stderr, stdout};
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    sh_ok(&c, &a.id, "echo from-cli > /workspace/cli.txt").await;

    let out = d.cli(["snapshot", &a.id, "--keep-running", "--expiration", "none"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = stdout(&out);
    let snap_id = printed.split_whitespace().next().unwrap().to_string();
    assert!(snap_id.starts_with("snap_"), "{printed}");
    assert!(printed.contains("frozen for"), "{printed}");

    let out = d.cli(["snapshots", "ls", "--sandbox", &a.id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.starts_with("ID"), "{table}");
    assert!(
        table.contains(&snap_id) && table.contains("never"),
        "{table}"
    );
    let out = d.cli(["snapshots", "--json"]);
    let all: Vec<belljar_api::Snapshot> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.len(), 1);

    let out = d.cli(["create", "--backend", "namespace", "--from", &snap_id]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let b = stdout(&out).trim().to_string();
    assert_eq!(sh_ok(&c, &b, "cat /workspace/cli.txt").await, "from-cli\n");

    let out = d.cli(["snapshots", "rm", &snap_id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        c.snapshot(&snap_id).await.unwrap().status,
        SnapshotStatus::Deleted
    );
    let out = d.cli(["create", "--backend", "namespace", "--from", &snap_id]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("deleted"), "{}", stderr(&out));
    let out = d.cli(["snapshot", &a.id, "--expiration", "soon"]);
    assert!(!out.status.success());
}
