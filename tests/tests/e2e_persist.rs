//! Persistent sandboxes on the namespace backend, through a real daemon and the CLI: stopping
//! one (by request or by its timeout) snapshots it, and `start` (by id or by name) brings the
//! same sandbox back with its files, deletions, name, tags, network policy and settings; `keep_last_snapshots`
//! bounds its timeline; the snapshot events reach the event stream; a sandbox that is not
//! persistent cannot be started again.
//!
//! Needs root and the `base` image (as every e2e test).

use std::collections::BTreeMap;
use std::time::Duration;

use belljar_api::{
    CreateSandbox, DomainAllow, Event, KeepLastSnapshots, ListSnapshotsQuery, NetworkPolicy,
    NetworkRules, SandboxStatus, SnapshotStatus,
};
use belljar_client::Client;
use belljar_e2e::events::{status_of, wait_event};
use belljar_e2e::{Daemon, sh_ok, stderr, stdout};

/// The options of the overlay at a sandbox's `/`, as its kernel shows them.
async fn root_overlay(c: &Client, id: &str) -> String {
    sh_ok(c, id, "awk '$5 == \"/\"' /proc/self/mountinfo").await
}

async fn created_snapshots(c: &Client, id: &str) -> Vec<belljar_api::Snapshot> {
    c.list_snapshots(&ListSnapshotsQuery {
        sandbox_id: Some(id.into()),
        status: Some(SnapshotStatus::Created),
        ..Default::default()
    })
    .await
    .unwrap()
    .snapshots
}

#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_sandbox_stops_and_starts_again_with_its_files_and_identity() {
    let d = Daemon::start();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let tags = BTreeMap::from([("team".to_owned(), "blue".to_owned())]);
    let a = d
        .create(
            &c,
            CreateSandbox {
                name: Some("keeper".into()),
                tags: Some(tags.clone()),
                env: Some(BTreeMap::from([("K".to_owned(), "v".to_owned())])),
                persistent: Some(true),
                keep_last_snapshots: Some(KeepLastSnapshots {
                    count: 1,
                    expiration_ms: None,
                    delete_evicted: None,
                }),
                ..Default::default()
            },
        )
        .await;
    assert!(a.lifecycle.persistent);
    sh_ok(
        &c,
        &a.id,
        "set -e; echo one > /workspace/one; chmod 600 /workspace/one; rm /etc/issue",
    )
    .await;
    // A policy replaced while it runs is the one it starts again with.
    let policy = NetworkPolicy::Rules(NetworkRules {
        allow: Some(DomainAllow::List(vec!["example.com".into()])),
        subnets: None,
    });
    c.set_network_policy(&a.id, &policy).await.unwrap();

    let stopped = c.stop_sandbox(&a.id).await.unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    let first = wait_event(&mut events, 30, "the stop's snapshot", |e| match e {
        Event::Snapshot { snapshot, .. }
            if snapshot.source_sandbox_id == a.id && snapshot.status == SnapshotStatus::Created =>
        {
            Some(*snapshot)
        }
        _ => None,
    })
    .await;
    assert_eq!(created_snapshots(&c, &a.id).await, vec![first.clone()]);

    // Started again by name through the CLI: the same sandbox, its files, its deletion.
    let out = d.cli(["start", "keeper"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), a.id);
    let b = c.sandbox(&a.id).await.unwrap();
    assert_eq!(b.status, SandboxStatus::Running);
    assert_eq!(
        (&b.name, &b.tags, &b.env, b.lifecycle.persistent),
        (&a.name, &a.tags, &a.env, true)
    );
    assert_eq!(b.network_policy.as_ref(), Some(&policy));
    assert_eq!(
        sh_ok(
            &c,
            &a.id,
            "cat /workspace/one; stat -c %a /workspace/one; test ! -e /etc/issue && echo gone"
        )
        .await,
        "one\n600\ngone\n"
    );

    // A second session: `keep_last` 1 keeps only the newest snapshot, which builds on the
    // first.
    sh_ok(&c, &a.id, "echo two > /workspace/two").await;
    let stopped = c.stop_sandbox(&a.id).await.unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    let kept = created_snapshots(&c, &a.id).await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].parent.as_deref(), Some(first.id.as_str()));
    assert_eq!(
        c.snapshot(&first.id).await.unwrap().status,
        SnapshotStatus::Deleted
    );
    let again = c.start_sandbox(&a.id).await.unwrap();
    assert_eq!(again.status, SandboxStatus::Running);
    assert_eq!(
        sh_ok(&c, &a.id, "cat /workspace/one /workspace/two").await,
        "one\ntwo\n"
    );
    // Every start hands the agent the same broker CA, which the system bundle holds once.
    assert_eq!(
        sh_ok(
            &c,
            &a.id,
            "grep -cxF \"$(sed -n 2p /usr/local/share/ca-certificates/belljar-sandbox-ca.crt)\" \
             /etc/ssl/certs/ca-certificates.crt"
        )
        .await,
        "1\n"
    );
    // Starting a running sandbox is a no-op.
    assert_eq!(
        c.start_sandbox(&a.id).await.unwrap().started_at,
        again.started_at
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_snapshots_a_persistent_sandbox_and_others_cannot_start_again() {
    let d = Daemon::start();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let short = d
        .create(
            &c,
            CreateSandbox {
                persistent: Some(true),
                timeout_ms: Some(4_000),
                ..Default::default()
            },
        )
        .await;
    sh_ok(&c, &short.id, "echo soon > /workspace/f").await;
    // A persistent sandbox's writable layer keeps its syncs; a disposable one's skips them
    // (a `volatile` overlay).
    assert!(!root_overlay(&c, &short.id).await.contains("volatile"));
    let stopped = wait_event(
        &mut events,
        60,
        "the timeout",
        status_of(&short.id, SandboxStatus::Stopped),
    )
    .await;
    assert_eq!(stopped.status_reason.as_deref(), Some("timeout"));
    let snaps = created_snapshots(&c, &short.id).await;
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    c.start_sandbox(&short.id).await.unwrap();
    c.extend_sandbox(&short.id, 60_000).await.unwrap();
    assert_eq!(sh_ok(&c, &short.id, "cat /workspace/f").await, "soon\n");

    // Not persistent: stopping loses its files, and it cannot be started again.
    let plain = d.create(&c, CreateSandbox::default()).await;
    assert!(root_overlay(&c, &plain.id).await.contains("volatile"));
    c.stop_sandbox(&plain.id).await.unwrap();
    assert!(created_snapshots(&c, &plain.id).await.is_empty());
    let err = c.start_sandbox(&plain.id).await.unwrap_err();
    assert_eq!(err.code(), "conflict", "{err}");
    assert!(err.to_string().contains("not persistent"), "{err}");
    let err = c.start_sandbox("sbx_nosuchsandbox").await.unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
}

/// A persistent sandbox with one good snapshot (`/workspace/n` is `one`) and an unsaved
/// session (`n` is `two`, `/etc/issue` deleted) whose capture fails: a file stands where the
/// layers directory belongs. Returns the sandbox, the layers path and where the real directory
/// was moved (rename it back to mend).
async fn unsaved_session_that_cannot_be_captured(
    d: &Daemon,
    c: &Client,
) -> (belljar_api::Sandbox, std::path::PathBuf, std::path::PathBuf) {
    let a = d
        .create(
            c,
            CreateSandbox {
                persistent: Some(true),
                ..Default::default()
            },
        )
        .await;
    sh_ok(c, &a.id, "echo one > /workspace/n").await;
    c.stop_sandbox(&a.id).await.unwrap();
    c.start_sandbox(&a.id).await.unwrap();
    sh_ok(c, &a.id, "echo two > /workspace/n; rm /etc/issue").await;
    let layers = d.paths.data.join("layers");
    let away = d.paths.data.join("layers.away");
    std::fs::rename(&layers, &away).unwrap();
    std::fs::write(&layers, b"").unwrap();
    (a, layers, away)
}

/// A stop whose snapshot failed leaves the last session only in the sandbox's state: the next
/// start takes the snapshot again (the session's files are back) instead of starting from the
/// older snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_persistent_snapshot_is_taken_again_at_the_next_start() {
    let d = Daemon::start();
    let c = d.unix();
    let (a, layers, away) = unsaved_session_that_cannot_be_captured(&d, &c).await;
    assert_eq!(
        c.stop_sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Stopped
    );
    let newest = c
        .list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(a.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .snapshots;
    assert_eq!(newest[0].status, SnapshotStatus::Failed, "{newest:?}");
    std::fs::remove_file(&layers).unwrap();
    std::fs::rename(&away, &layers).unwrap();

    let b = c.start_sandbox(&a.id).await.unwrap();
    assert_eq!(b.status, SandboxStatus::Running);
    assert_eq!(
        sh_ok(
            &c,
            &a.id,
            "cat /workspace/n; test ! -e /etc/issue && echo gone"
        )
        .await,
        "two\ngone\n"
    );
    assert_eq!(created_snapshots(&c, &a.id).await.len(), 2);
}

/// A persistent sandbox whose capture keeps failing does not start (the retry at start fails
/// too), and the error names the failed snapshot; deleting that snapshot discards the unsaved
/// session, and the next start resumes from the last good snapshot. A failed snapshot, which
/// once could not be deleted, goes to `deleted`.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_failed_snapshot_discards_the_session_and_starts_from_the_last_good_one() {
    let d = Daemon::start();
    let c = d.unix();
    let (a, layers, away) = unsaved_session_that_cannot_be_captured(&d, &c).await;
    c.stop_sandbox(&a.id).await.unwrap();
    let err = c.start_sandbox(&a.id).await.unwrap_err();
    assert_eq!(err.code(), "conflict", "{err}");
    let newest = c
        .list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(a.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .snapshots;
    let failed = &newest[0];
    assert_eq!(failed.status, SnapshotStatus::Failed, "{newest:?}");
    assert!(err.to_string().contains(&failed.id), "{err}");
    std::fs::remove_file(&layers).unwrap();
    std::fs::rename(&away, &layers).unwrap();

    let deleted = c.delete_snapshot(&failed.id).await.unwrap();
    assert_eq!(deleted.status, SnapshotStatus::Deleted);
    assert_eq!(
        c.snapshot(&failed.id).await.unwrap().status,
        SnapshotStatus::Deleted
    );
    let b = c.start_sandbox(&a.id).await.unwrap();
    assert_eq!(b.status, SandboxStatus::Running);
    assert_eq!(
        sh_ok(
            &c,
            &a.id,
            "cat /workspace/n; test -e /etc/issue && echo kept"
        )
        .await,
        "one\nkept\n",
        "the last good snapshot's files, the discarded session's are gone"
    );
    assert_eq!(created_snapshots(&c, &a.id).await.len(), 1);
}

/// `kill -9` of the daemon while a persistent stop copies the sandbox's layer: the next start
/// of the daemon finishes the stop, the snapshot is complete (or was never recorded and is
/// taken then), and the sandbox starts again with its files.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_persistent_stop_loses_nothing() {
    let d = Daemon::start();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let a = d
        .create(
            &c,
            CreateSandbox {
                persistent: Some(true),
                ..Default::default()
            },
        )
        .await;
    // Enough data that the copy is still under way when the daemon dies.
    let sum = sh_ok(
        &c,
        &a.id,
        "head -c 128M /dev/urandom > /workspace/big && sha256sum /workspace/big | cut -c1-64",
    )
    .await;
    let stopping = {
        let c = c.clone();
        let id = a.id.clone();
        tokio::spawn(async move { c.stop_sandbox(&id).await })
    };
    wait_event(
        &mut events,
        30,
        "the stop",
        status_of(&a.id, SandboxStatus::Stopping),
    )
    .await;
    let layers = d.paths.data.join("layers");
    belljar_e2e::eventually(Duration::from_secs(30), "a layer being copied", || {
        let copying = std::fs::read_dir(&layers)
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            })
            .unwrap_or(false);
        async move { copying.then_some(()) }
    })
    .await;
    d.kill9();
    assert!(stopping.await.unwrap().is_err(), "the daemon died mid-copy");
    d.restart();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    if c.sandbox(&a.id).await.unwrap().status != SandboxStatus::Stopped {
        wait_event(
            &mut events,
            60,
            "the stop finished",
            status_of(&a.id, SandboxStatus::Stopped),
        )
        .await;
    }
    let all = c
        .list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(a.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .snapshots;
    assert!(
        all.iter().all(|s| s.status == SnapshotStatus::Created),
        "{all:?}"
    );
    assert!(!all.is_empty(), "the stop was finished with a snapshot");
    c.start_sandbox(&a.id).await.unwrap();
    assert_eq!(
        sh_ok(&c, &a.id, "sha256sum /workspace/big | cut -c1-64").await,
        sum
    );
}
