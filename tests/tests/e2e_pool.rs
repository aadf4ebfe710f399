//! The warm pool (`belljard --pool base=N`): a create is served by a sandbox started ahead
//! of it, with the request's id, name, tags, env, timeout and limits; two users never share
//! one; the pool refills after a claim; pooled sandboxes are invisible until claimed; and a
//! `kill -9` of the daemon followed by a restart leaves no pooled sandbox's process, cgroup
//! or mount behind. Needs root and the `base` image, like every namespace e2e test.

use std::collections::BTreeMap;
use std::time::Duration;

use belljar_api::{CreateSandbox, ListSandboxesQuery, RunCommand, SandboxStatus};
use belljar_client::{Client, log_bytes};
use belljar_e2e::host::{Held, held, mounted_under};
use belljar_e2e::{Daemon, eventually, wait_gone};

/// The pool's marker in a sandbox directory (see the daemon's `sandbox::pool`).
const MARKER: &str = "pooled";

/// Ids of the pooled sandboxes that are ready (their marker says so).
fn ready_pooled(d: &Daemon) -> Vec<String> {
    let root = d.paths.data.join("sandboxes");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join(MARKER)).is_ok_and(|t| t.trim() == "ready")
        })
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Waits until `n` pooled sandboxes are ready and returns their ids.
async fn pool_of(d: &Daemon, n: usize) -> Vec<String> {
    eventually(Duration::from_secs(60), "the pool to fill", || async {
        let ids = ready_pooled(d);
        (ids.len() == n).then_some(ids)
    })
    .await
}

async fn run(c: &Client, id: &str, script: &str) -> (Option<i32>, String) {
    let cmd = c
        .run_command(
            id,
            &RunCommand {
                argv: vec!["sh".into(), "-c".into(), script.into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let done = c.wait_command(id, &cmd.id).await.unwrap();
    let mut lines = c.command_logs(id, &cmd.id, true).await.unwrap();
    let mut out = Vec::new();
    while let Some(l) = lines.next().await.unwrap() {
        out.extend(log_bytes(&l));
    }
    (done.exit_code, String::from_utf8_lossy(&out).into_owned())
}

fn pool_daemon(n: usize) -> Daemon {
    // The pool runs on the default backend, which is the namespace one wherever these
    // tests run (no usable KVM); `Daemon::create` asks for it, so a mismatch fails the claim
    // assertions below.
    Daemon::start_with_env(&[("BELLJAR_POOL", &format!("base={n}"))])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_is_a_fresh_sandbox_with_the_request_applied() {
    let d = pool_daemon(1);
    let c = d.unix();
    let pooled = pool_of(&d, 1).await;

    // Invisible until claimed.
    let listed = c
        .all_sandboxes(&ListSandboxesQuery::default())
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    assert!(c.sandbox(&pooled[0]).await.is_err());

    let first = d
        .create(
            &c,
            CreateSandbox {
                name: Some("first".into()),
                tags: Some(BTreeMap::from([("team".into(), "a".into())])),
                env: Some(BTreeMap::from([("GREETING".into(), "hello".into())])),
                timeout_ms: Some(600_000),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(first.id, pooled[0], "the create was not served by the pool");
    assert_eq!(first.status, SandboxStatus::Running);
    assert_eq!(first.name.as_deref(), Some("first"));
    assert_eq!(first.tags["team"], "a");
    assert_eq!(first.timeout_ms, 600_000);
    assert!(first.expires_at.unwrap() >= first.started_at.unwrap() + 600_000);
    assert_eq!(
        (first.vcpus, first.memory_mib, first.disk_mib),
        (2, 1024, 4096),
        "not the default limits"
    );
    assert!(first.limits.memory.enforced, "{:?}", first.limits);
    let (code, out) = run(&c, &first.id, "echo $GREETING; ls /workspace | wc -l").await;
    assert_eq!(code, Some(0));
    assert_eq!(out, "hello\n0\n", "not a fresh tree or env not applied");
    let (code, _) = run(
        &c,
        &first.id,
        "echo secret > /workspace/mine; echo x > /tmp/mine",
    )
    .await;
    assert_eq!(code, Some(0));

    // The claim is the user's now, and the pool refills with another sandbox.
    let listed = c
        .all_sandboxes(&ListSandboxesQuery::default())
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        !d.paths
            .data
            .join("sandboxes")
            .join(&first.id)
            .join(MARKER)
            .exists()
    );
    let refilled = pool_of(&d, 1).await;
    assert_ne!(
        refilled[0], first.id,
        "a claimed sandbox went back to the pool"
    );

    // A second user gets a different sandbox, without the first user's files.
    let second = d
        .create(
            &c,
            CreateSandbox {
                name: Some("second".into()),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(second.id, refilled[0]);
    assert_ne!(second.id, first.id);
    let (code, out) = run(
        &c,
        &second.id,
        "test -e /workspace/mine && echo leak; test -e /tmp/mine && echo leak; echo ${GREETING:-unset}",
    )
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(out, "unset\n");
    assert_eq!(second.tags.len(), 0);

    // A request the pool cannot serve (other limits) is launched as usual.
    let other = d
        .create(
            &c,
            CreateSandbox {
                memory_mib: Some(512),
                ..Default::default()
            },
        )
        .await;
    assert!(!refilled.contains(&other.id));
    assert_eq!(other.memory_mib, 512);
    // The launched sandbox's limits are enforced the same way as the pooled ones.
    assert_eq!(other.limits, first.limits);
    assert_eq!(run(&c, &other.id, "true").await.0, Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_and_restart_leaves_no_pooled_sandbox_behind() {
    let d = pool_daemon(2);
    let pooled = pool_of(&d, 2).await;
    let before: Vec<Held> = pooled.iter().map(|id| held(&d, id)).collect();
    for h in &before {
        assert!(
            !belljar_cli::launcher::exited(h.pid),
            "pooled sandbox not running"
        );
        assert!(h.cgroups.iter().any(|g| g.is_dir()), "no cgroup found");
    }

    d.kill9();
    d.restart();

    for h in &before {
        assert!(
            wait_gone(h.pid, Duration::from_secs(10)),
            "pooled sandbox {} still runs after the restart\n{}",
            h.dir.display(),
            d.log()
        );
        assert!(!h.dir.exists(), "{} left behind", h.dir.display());
        for g in &h.cgroups {
            assert!(!g.exists(), "cgroup {} left behind", g.display());
        }
        assert_eq!(mounted_under(&h.dir), Vec::<String>::new());
    }
    // The new daemon fills a new pool; none of the old ids comes back.
    let fresh = pool_of(&d, 2).await;
    assert!(fresh.iter().all(|id| !pooled.contains(id)));
    let c = d.unix();
    assert!(
        c.all_sandboxes(&ListSandboxesQuery::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_size_is_in_info_and_daemon_status() {
    let d = pool_daemon(2);
    let c = d.unix();
    pool_of(&d, 2).await;
    let info = eventually(
        Duration::from_secs(30),
        "info to show a full pool",
        || async {
            let info = c.info().await.unwrap();
            (info.pool.first().is_some_and(|p| p.starting == 0)).then_some(info)
        },
    )
    .await;
    assert_eq!(
        info.pool,
        vec![belljar_api::PoolInfo {
            image: "base".into(),
            configured: 2,
            ready: 2,
            starting: 0,
        }]
    );
    // A claim takes one; the refill shows as starting or, once done, ready again.
    let s = d.create(&c, CreateSandbox::default()).await;
    let p = c.info().await.unwrap().pool.remove(0);
    assert_eq!(p.configured, 2);
    assert!(p.ready + p.starting >= 1 && p.ready <= 2, "{p:?}");
    c.delete_sandbox(&s.id).await.unwrap();
    let status = d.cli(["daemon", "status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("pool:      base: "), "{text}");
    assert!(text.contains(" of 2 ready"), "{text}");
}
