//! Pause and resume on the namespace backend, through a real daemon and the CLI: a paused
//! sandbox's processes are frozen (the cgroup freezer says so) and keep their state, so a
//! counter goes on from where it was after `resume`, also across a daemon `kill -9`; and a
//! paused sandbox can be snapshotted and forked: resumed first with `auto_resume`, as it
//! stands (and left paused) without.

use std::path::PathBuf;
use std::time::Duration;

use belljar_api::{
    CreateSandbox, CreateSnapshot, ForkSandbox, RunCommand, SandboxStatus, SnapshotStatus,
};
use belljar_client::Client;
use belljar_e2e::{Daemon, eventually, snapshots, stderr};

/// The counter the sandbox's loop writes, read from the host's side of its writable layer.
fn counter(d: &Daemon, id: &str) -> Option<u64> {
    let path = d
        .paths
        .data
        .join("sandboxes")
        .join(id)
        .join("namespace/fs/upper/workspace/c");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether the sandbox's cgroup reports its processes frozen (cgroup v2 `cgroup.events`, or
/// v1 `freezer.state`).
fn frozen(d: &Daemon, id: &str) -> bool {
    let state = d
        .paths
        .data
        .join("sandboxes")
        .join(id)
        .join("namespace/sandbox.json");
    let Ok(text) = std::fs::read_to_string(state) else {
        return false;
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    if let Some(v2) = v["groups"]["v2"].as_str() {
        let events = std::fs::read_to_string(PathBuf::from(v2).join("cgroup.events"));
        return events.is_ok_and(|e| e.lines().any(|l| l == "frozen 1"));
    }
    let v1 = v["groups"]["v1"]["freezer"].as_str().unwrap_or_default();
    std::fs::read_to_string(PathBuf::from(v1).join("freezer.state"))
        .is_ok_and(|s| s.trim() == "FROZEN")
}

/// A sandbox whose loop counts in `/workspace/c`, once the count has begun.
async fn counting(d: &Daemon, c: &Client, req: CreateSandbox) -> String {
    let a = d.create(c, req).await;
    c.run_command(
        &a.id,
        &RunCommand {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "i=0; while :; do i=$((i+1)); echo $i > /workspace/c; sleep 0.02; done".into(),
            ],
            detached: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    wait_counter_above(d, &a.id, 2).await;
    a.id
}

async fn wait_counter_above(d: &Daemon, id: &str, floor: u64) -> u64 {
    eventually(Duration::from_secs(20), "the counter to move on", || {
        let v = counter(d, id);
        async move { v.filter(|v| *v > floor) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_keeps_its_processes_and_their_state() {
    let d = Daemon::start();
    let c: Client = d.unix();
    // Without auto-resume, so that a command shows it paused (e2e_pause_idle covers resuming
    // on use).
    let id = counting(
        &d,
        &c,
        CreateSandbox {
            auto_resume: Some(false),
            ..Default::default()
        },
    )
    .await;

    let paused = c.pause_sandbox(&id).await.unwrap();
    assert_eq!(paused.status, SandboxStatus::Paused);
    eventually(Duration::from_secs(10), "the cgroup frozen", || {
        let f = frozen(&d, &id);
        async move { f.then_some(()) }
    })
    .await;
    let at_pause = counter(&d, &id).unwrap();
    // Pausing twice is a no-op; a paused sandbox without auto-resume runs no commands.
    assert_eq!(
        c.pause_sandbox(&id).await.unwrap().status,
        SandboxStatus::Paused
    );
    let err = c
        .run_command(
            &id,
            &RunCommand {
                argv: vec!["true".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "sandbox_not_running", "{err}");

    // The pause survives a daemon kill -9 and restart.
    d.kill9();
    d.restart();
    let c = d.unix();
    assert_eq!(c.sandbox(&id).await.unwrap().status, SandboxStatus::Paused);
    assert!(frozen(&d, &id));
    assert_eq!(counter(&d, &id), Some(at_pause), "nothing ran while paused");

    // Through the CLI: resume, and the same loop counts on from where it was.
    let out = d.cli(["resume", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.sandbox(&id).await.unwrap().status, SandboxStatus::Running);
    assert!(!frozen(&d, &id));
    let after = wait_counter_above(&d, &id, at_pause).await;
    assert!(after > at_pause);

    let out = d.cli(["pause", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.sandbox(&id).await.unwrap().status, SandboxStatus::Paused);
    // A paused sandbox can be stopped (its processes are thawed to die).
    let stopped = c.stop_sandbox(&id).await.unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    let err = c.resume_sandbox(&id).await.unwrap_err();
    assert_eq!(err.code(), "sandbox_not_running", "{err}");
}

/// Fork while a process writes: the fork has the files as they were at the fork, on its own
/// writable layer, and the source runs on, undisturbed.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_takes_the_files_of_a_busy_sandbox_which_runs_on() {
    let d = Daemon::start();
    let c: Client = d.unix();
    let a = d
        .create(
            &c,
            CreateSandbox {
                tags: Some([("team".to_string(), "x".to_string())].into()),
                ..Default::default()
            },
        )
        .await;
    c.run_command(
        &a.id,
        &RunCommand {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo kept > /workspace/kept; i=0; \
                 while :; do i=$((i+1)); echo $i > /workspace/c; sleep 0.02; done"
                    .into(),
            ],
            detached: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    wait_counter_above(&d, &a.id, 2).await;

    let out = d.cli(["fork", &a.id, "--name", "forked"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let b = belljar_e2e::stdout(&out).trim().to_string();
    let forked = c.sandbox(&b).await.unwrap();
    assert_eq!(forked.status, SandboxStatus::Running);
    assert_eq!(forked.name.as_deref(), Some("forked"));
    assert_eq!(forked.tags.get("team").map(String::as_str), Some("x"));
    assert_eq!(
        (forked.env.clone(), forked.timeout_ms),
        (a.env.clone(), a.timeout_ms)
    );
    // The API's overrides: tags and environment replace the source's; the timeout is its own.
    let out = d.cli([
        "fork",
        &a.id,
        "--tag",
        "team=y",
        "--tag",
        "kind=fork",
        "-e",
        "WHO=fork",
        "--timeout",
        "10m",
    ]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let other = c.sandbox(belljar_e2e::stdout(&out).trim()).await.unwrap();
    let tags: Vec<(&str, &str)> = other
        .tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(tags, [("kind", "fork"), ("team", "y")]);
    assert_eq!(other.timeout_ms, 600_000);
    assert_eq!(
        belljar_e2e::sh_ok(&c, &other.id, "echo $WHO").await,
        "fork\n"
    );
    let out = d.cli(["fork", &a.id, "--tag", "novalue"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--tag"), "{}", stderr(&out));
    let Some(belljar_api::Source::Snapshot { snapshot_id }) = &forked.source else {
        panic!("{forked:?}")
    };
    let snap = c.snapshot(snapshot_id).await.unwrap();
    assert_eq!(snap.source_sandbox_id, a.id);
    assert!(snap.frozen_ms.is_some());

    // The source ran on; the fork has the files of the moment, not its processes.
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Running
    );
    let read = |id: &str, path: &str| {
        let c = c.clone();
        let (id, path) = (id.to_string(), path.to_string());
        async move {
            let bytes = c.read_file_bytes(&id, &path).await.unwrap();
            String::from_utf8(bytes.to_vec()).unwrap()
        }
    };
    assert_eq!(read(&b, "/workspace/kept").await, "kept\n");
    let in_fork: u64 = read(&b, "/workspace/c").await.trim().parse().unwrap();
    wait_counter_above(&d, &a.id, in_fork).await;
    // Writes in the fork stay in the fork.
    c.write_file(&b, "/workspace/only-b", None, belljar_client::full("b"))
        .await
        .unwrap();
    assert!(
        c.try_stat(&a.id, "/workspace/only-b")
            .await
            .unwrap()
            .is_none()
    );
}

/// `auto_resume` (the default): a snapshot or a fork of a paused sandbox is a use of it, which
/// resumes it first, as a command does.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_or_fork_resumes_a_paused_sandbox_with_auto_resume() {
    let d = Daemon::start();
    let c: Client = d.unix();
    let a = counting(&d, &c, CreateSandbox::default()).await;
    let status = |id: &str| {
        let (c, id) = (c.clone(), id.to_string());
        async move { c.sandbox(&id).await.unwrap().status }
    };

    c.pause_sandbox(&a).await.unwrap();
    let at_pause = counter(&d, &a).unwrap();
    let live = c.snapshot_sandbox(&a, &snapshots::live()).await.unwrap();
    assert_eq!(live.status, SnapshotStatus::Created);
    assert_eq!(status(&a).await, SandboxStatus::Running);
    assert!(!frozen(&d, &a));
    wait_counter_above(&d, &a, at_pause).await;

    c.pause_sandbox(&a).await.unwrap();
    let fork = c.fork_sandbox(&a, &ForkSandbox::default()).await.unwrap();
    assert_eq!(fork.status, SandboxStatus::Running);
    assert_eq!(status(&a).await, SandboxStatus::Running);

    c.pause_sandbox(&a).await.unwrap();
    let stopping = c
        .snapshot_sandbox(&a, &CreateSnapshot::default())
        .await
        .unwrap();
    assert_eq!(stopping.status, SnapshotStatus::Created);
    assert_eq!(status(&a).await, SandboxStatus::Stopped);
}

/// Without `auto_resume`, a paused sandbox is snapshotted and forked as it stands: it is
/// frozen already, so a live snapshot holds it for no time at all (`frozen_ms` 0) and it stays
/// paused, its processes where they were; a stopping snapshot stops it, as `stop` does.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_without_auto_resume_is_snapshotted_and_forked_as_it_stands() {
    let d = Daemon::start();
    let c: Client = d.unix();
    let req = CreateSandbox {
        auto_resume: Some(false),
        ..Default::default()
    };
    let a = counting(&d, &c, req).await;
    c.pause_sandbox(&a).await.unwrap();
    eventually(Duration::from_secs(10), "the cgroup frozen", || {
        let f = frozen(&d, &a);
        async move { f.then_some(()) }
    })
    .await;
    let at_pause = counter(&d, &a).unwrap();
    let still_paused = || async {
        assert_eq!(c.sandbox(&a).await.unwrap().status, SandboxStatus::Paused);
        assert!(frozen(&d, &a));
        assert_eq!(counter(&d, &a), Some(at_pause), "nothing ran while paused");
    };

    let live = c.snapshot_sandbox(&a, &snapshots::live()).await.unwrap();
    assert_eq!(
        (live.status, live.frozen_ms),
        (SnapshotStatus::Created, Some(0))
    );
    still_paused().await;
    let dir = c
        .snapshot_sandbox(&a, &snapshots::of_directory("/workspace"))
        .await
        .unwrap();
    assert_eq!(dir.status, SnapshotStatus::Created);
    still_paused().await;

    // The fork runs with the files of the pause; the source stays paused.
    let fork = c.fork_sandbox(&a, &ForkSandbox::default()).await.unwrap();
    assert_eq!(fork.status, SandboxStatus::Running);
    let in_fork = c.read_file_bytes(&fork.id, "/workspace/c").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&in_fork).trim(),
        at_pause.to_string()
    );
    still_paused().await;

    // A stopping snapshot stops it as `stop` does: its processes are thawed to receive
    // SIGTERM and may write while they end; the snapshot has the files as it stopped.
    let stopping = c
        .snapshot_sandbox(&a, &CreateSnapshot::default())
        .await
        .unwrap();
    assert_eq!(stopping.status, SnapshotStatus::Created);
    assert_eq!(c.sandbox(&a).await.unwrap().status, SandboxStatus::Stopped);
    let from = d
        .create(
            &c,
            CreateSandbox {
                source: Some(belljar_api::Source::Snapshot {
                    snapshot_id: stopping.id,
                }),
                ..Default::default()
            },
        )
        .await;
    let kept = c.read_file_bytes(&from.id, "/workspace/c").await.unwrap();
    let kept: u64 = String::from_utf8_lossy(&kept).trim().parse().unwrap();
    assert!(kept >= at_pause, "{kept} < {at_pause}");
}
