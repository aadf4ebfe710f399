//! Modal's `mount_image` / `unmount_image` on a running namespace sandbox, through a real
//! daemon: a directory snapshot mounted into a sandbox that runs (the path made when missing,
//! hiding what was there), copy-on-write, held while mounted, listed, unmounted (what was
//! there shows again and the sandbox's writes under the mount are gone); bad input refused
//! with stable codes and leaving no hold; a fork carries the mounts as its source sees them.
//!
//! Needs root and the `base` image (as every e2e test).

use belljar_api::{CreateSandbox, Event, ForkSandbox, ListSnapshotsQuery, SnapshotMount};
use belljar_client::Client;
use belljar_e2e::{Daemon, sh_ok, snapshots, stderr, stdout};

/// Every entry under a directory with its kind, mode and owner, then each file's hash.
fn listing(dir: &str) -> String {
    format!(
        "cd {dir} && find . -mindepth 1 -printf '%P %y %m %U:%G %l\\n' | sort; \
         find . -type f -exec md5sum {{}} + | sort"
    )
}

/// The paths of a sandbox's mounts, as `GET …/mounts` lists them; the sandbox object lists
/// the same.
async fn mounted_paths(c: &Client, id: &str) -> Vec<String> {
    let paths = |mounts: Vec<SnapshotMount>| mounts.into_iter().map(|m| m.path).collect();
    let listed: Vec<String> = paths(c.sandbox_mounts(id).await.unwrap().mounts);
    let shown: Vec<String> = paths(c.sandbox(id).await.unwrap().mounts.unwrap_or_default());
    assert_eq!(shown, listed, "the sandbox object names its mounts");
    listed
}

/// Waits for an event of sandbox `id` whose mounts are at `want`.
async fn event_with_mounts(c: &Client, id: &str, want: &[&str]) {
    let mut events = c.events(Some(0)).await.unwrap();
    let seen = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(e) = events.next().await.unwrap() {
            if let Event::Sandbox { sandbox, .. } = e
                && sandbox.id == id
                && sandbox
                    .mounts
                    .unwrap_or_default()
                    .iter()
                    .map(|m| m.path.as_str())
                    .eq(want.iter().copied())
            {
                return;
            }
        }
        panic!("the event stream ended");
    })
    .await;
    assert!(seen.is_ok(), "no event of {id} with mounts at {want:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_snapshot_mounts_into_a_running_sandbox_and_unmounts() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    sh_ok(
        &c,
        &a.id,
        "set -e; mkdir -p /srv/proj/sub; cd /srv/proj; echo hi > f; chmod 640 f; \
         chown 1000:1000 sub; echo x > sub/g; ln -s f link",
    )
    .await;
    let want = sh_ok(&c, &a.id, &listing("/srv/proj")).await;
    let snap = c
        .snapshot_sandbox(&a.id, &snapshots::of_directory("/srv/proj"))
        .await
        .unwrap();

    // Over a directory with files (hidden while mounted), and where nothing was (made).
    let b = d.create(&c, CreateSandbox::default()).await;
    sh_ok(&c, &b.id, "mkdir -p /data && echo before > /data/old").await;
    let m = c
        .mount_snapshot(&b.id, &snapshots::mount(&snap.id, "/data"))
        .await
        .unwrap();
    assert_eq!(m.path, "/data");
    assert_eq!(sh_ok(&c, &b.id, &listing("/data")).await, want);
    assert_eq!(
        sh_ok(&c, &b.id, "awk '$2 == \"/data\" {print $3}' /proc/mounts").await,
        "overlay\n",
        "the snapshot is a mount at the path"
    );
    c.mount_snapshot(&b.id, &snapshots::mount(&snap.id, "/mnt/new/deep"))
        .await
        .unwrap();
    assert_eq!(sh_ok(&c, &b.id, &listing("/mnt/new/deep")).await, want);
    assert_eq!(
        sh_ok(&c, &b.id, "stat -c '%U %a' /mnt/new").await,
        "root 755\n",
        "missing components are made as the sandbox's root"
    );
    assert_eq!(mounted_paths(&c, &b.id).await, ["/data", "/mnt/new/deep"]);

    // Copy-on-write: b's writes stay in b, under that one mount.
    sh_ok(
        &c,
        &b.id,
        "set -e; echo changed > /data/f; rm /data/sub/g; touch /data/new; \
         su belljar -c 'touch /data/sub/mine'",
    )
    .await;
    assert_eq!(sh_ok(&c, &b.id, &listing("/mnt/new/deep")).await, want);
    assert_eq!(sh_ok(&c, &a.id, &listing("/srv/proj")).await, want);
    let e = d.create(&c, CreateSandbox::default()).await;
    c.mount_snapshot(&e.id, &snapshots::mount(&snap.id, "/data"))
        .await
        .unwrap();
    assert_eq!(sh_ok(&c, &e.id, &listing("/data")).await, want);

    // Held while mounted: the snapshot's deletion keeps its files for the mounts.
    c.delete_snapshot(&snap.id).await.unwrap();
    assert_eq!(sh_ok(&c, &e.id, &listing("/data")).await, want);
    let err = c
        .mount_snapshot(&e.id, &snapshots::mount(&snap.id, "/again"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "snapshot_not_usable", "{err}");

    // Unmounted: what was there shows again, and b's writes under the mount are gone.
    c.unmount_snapshot(&b.id, "/data").await.unwrap();
    assert_eq!(sh_ok(&c, &b.id, "ls /data").await, "old\n");
    assert_eq!(sh_ok(&c, &b.id, "cat /data/old").await, "before\n");
    assert_eq!(mounted_paths(&c, &b.id).await, ["/mnt/new/deep"]);
    event_with_mounts(&c, &b.id, &["/data", "/mnt/new/deep"]).await;
    event_with_mounts(&c, &b.id, &["/mnt/new/deep"]).await;
    let err = c.unmount_snapshot(&b.id, "/data").await.unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert_eq!(sh_ok(&c, &b.id, &listing("/mnt/new/deep")).await, want);

    // The last holder's unmount frees the layers (b's other mount and e hold them first).
    for id in [&a.id] {
        c.delete_sandbox(id).await.unwrap();
    }
    c.unmount_snapshot(&b.id, "/mnt/new/deep").await.unwrap();
    assert!(
        snapshots::layer_count(&d) > 0,
        "e still mounts the snapshot"
    );
    c.unmount_snapshot(&e.id, "/data").await.unwrap();
    assert_eq!(
        snapshots::layer_count(&d),
        0,
        "no one holds the snapshot's layer"
    );
    assert_eq!(
        sh_ok(&c, &e.id, "test -e /data && echo there || echo gone").await,
        "there\n",
        "the directory made for the mount stays, empty"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_mounts_into_a_running_sandbox_are_refused_and_hold_nothing() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    sh_ok(
        &c,
        &a.id,
        "mkdir -p /srv/d && echo 1 > /srv/d/f && ln -s /etc /srv/evil && ln -s /srv/d /srv/dl",
    )
    .await;
    let dir = c
        .snapshot_sandbox(&a.id, &snapshots::of_directory("/srv/d"))
        .await
        .unwrap();
    let whole = c.snapshot_sandbox(&a.id, &snapshots::live()).await.unwrap();
    let layers = snapshots::layer_count(&d);
    c.mount_snapshot(&a.id, &snapshots::mount(&dir.id, "/m"))
        .await
        .unwrap();
    for (snapshot, path, code) in [
        ("snap_nosuchsnapshot", "/x", "not_found"),
        (dir.id.as_str(), "x", "invalid_path"),
        (dir.id.as_str(), "/", "invalid_path"),
        (dir.id.as_str(), "/x/../etc", "invalid_path"),
        (dir.id.as_str(), "/x,y", "invalid_path"),
        (dir.id.as_str(), "/etc/passwd", "not_a_directory"),
        (dir.id.as_str(), "/etc/passwd/x", "not_a_directory"),
        // Symlinks (the image's `/bin`, ones the sandbox planted) are never followed: the
        // mount would land elsewhere in the sandbox, or wherever the link pointed.
        (dir.id.as_str(), "/bin/x", "not_a_directory"),
        (dir.id.as_str(), "/srv/evil/x", "not_a_directory"),
        (dir.id.as_str(), "/srv/dl", "not_a_directory"),
        // Where no directory can be made (sysfs is read-only in the sandbox).
        (dir.id.as_str(), "/sys/x", "invalid_path"),
        (whole.id.as_str(), "/x", "bad_request"),
        (dir.id.as_str(), "/m", "conflict"),
    ] {
        let err = c
            .mount_snapshot(&a.id, &snapshots::mount(snapshot, path))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{snapshot} at {path}: {err}");
    }
    assert_eq!(mounted_paths(&c, &a.id).await, ["/m"]);
    assert_eq!(
        sh_ok(&c, &a.id, "ls /etc/x /x 2>&1 | grep -c 'No such'").await,
        "2\n",
        "refused mounts made nothing"
    );
    let err = c.unmount_snapshot(&a.id, "/nothing").await.unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    let err = c
        .mount_snapshot("sbx_nosuchsandbox", &snapshots::mount(&dir.id, "/m"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");

    // A stopped sandbox: refused.
    let stopped = d.create(&c, CreateSandbox::default()).await;
    c.stop_sandbox(&stopped.id).await.unwrap();
    let err = c
        .mount_snapshot(&stopped.id, &snapshots::mount(&dir.id, "/m"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "sandbox_not_running", "{err}");

    // Nothing refused holds a layer: deleting every holder frees them all.
    assert_eq!(snapshots::layer_count(&d), layers);
    c.delete_sandbox(&a.id).await.unwrap();
    c.delete_snapshot(&dir.id).await.unwrap();
    c.delete_snapshot(&whole.id).await.unwrap();
    assert_eq!(snapshots::layer_count(&d), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_carries_its_sources_mounts_with_their_writes() {
    let d = Daemon::start();
    let c = d.unix();
    let (a, snap) = snapshots::directory_of_new_sandbox(
        &d,
        &c,
        "mkdir -p /srv/d && echo 1 > /srv/d/f && echo 2 > /srv/d/g",
        "/srv/d",
    )
    .await;
    // One mount given at create, one mounted while running; writes under both and beside.
    let b = d
        .create(
            &c,
            CreateSandbox {
                mounts: Some(vec![snapshots::mount(&snap.id, "/m1")]),
                ..Default::default()
            },
        )
        .await;
    c.mount_snapshot(&b.id, &snapshots::mount(&snap.id, "/m2"))
        .await
        .unwrap();
    sh_ok(
        &c,
        &b.id,
        "set -e; echo b > /m1/f; rm /m1/g; echo new > /m2/h; echo root > /root/z",
    )
    .await;
    let want1 = sh_ok(&c, &b.id, &listing("/m1")).await;
    let want2 = sh_ok(&c, &b.id, &listing("/m2")).await;

    let f = c
        .fork_sandbox(&b.id, &ForkSandbox::default())
        .await
        .unwrap();
    assert_eq!(mounted_paths(&c, &f.id).await, ["/m1", "/m2"]);
    assert_eq!(sh_ok(&c, &f.id, &listing("/m1")).await, want1);
    assert_eq!(sh_ok(&c, &f.id, &listing("/m2")).await, want2);
    assert_eq!(sh_ok(&c, &f.id, "cat /root/z").await, "root\n");
    assert_eq!(
        sh_ok(
            &c,
            &f.id,
            "awk '$2 ~ /^\\/m[12]$/ {print $2, $3}' /proc/mounts"
        )
        .await,
        "/m1 overlay\n/m2 overlay\n",
        "the fork's mounts are mounts, copy-on-write again"
    );
    // The fork's writes stay its own; the source's mounts are as they were.
    sh_ok(&c, &f.id, "echo f > /m1/f && rm /m2/h").await;
    assert_eq!(sh_ok(&c, &b.id, &listing("/m1")).await, want1);
    assert_eq!(sh_ok(&c, &b.id, &listing("/m2")).await, want2);
    // What the fork mounts is on the source's timeline: directory snapshots of its mounts.
    let on_timeline: Vec<String> = c
        .list_snapshots(&ListSnapshotsQuery {
            sandbox_id: Some(b.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .snapshots
        .into_iter()
        .filter_map(|s| s.path)
        .collect();
    assert_eq!(on_timeline.len(), 2, "{on_timeline:?}");
    assert!(on_timeline.iter().any(|p| p == "/m1"), "{on_timeline:?}");

    // A fork of a sandbox without mounts mounts nothing.
    let plain = c
        .fork_sandbox(&a.id, &ForkSandbox::default())
        .await
        .unwrap();
    assert!(mounted_paths(&c, &plain.id).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_mounts_lists_and_unmounts() {
    let d = Daemon::start();
    let c = d.unix();
    let (_a, snap) = snapshots::directory_of_new_sandbox(
        &d,
        &c,
        "mkdir -p /srv/d && echo cli > /srv/d/f",
        "/srv/d",
    )
    .await;
    let b = d.create(&c, CreateSandbox::default()).await;
    let out = d.cli(["mount", &b.id, &snap.id, "/w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sh_ok(&c, &b.id, "cat /w/f").await, "cli\n");
    let out = d.cli(["mount", &b.id]);
    assert_eq!(stdout(&out), format!("{} /w\n", snap.id));
    let out = d.cli(["mount", &b.id, &snap.id, "/etc/passwd"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("(not_a_directory)"),
        "{}",
        stderr(&out)
    );
    let out = d.cli(["unmount", &b.id, "/w"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&d.cli(["mount", &b.id])), "");
    let out = d.cli(["unmount", &b.id, "/w"]);
    assert!(stderr(&out).contains("(not_found)"), "{}", stderr(&out));
}

/// A persistent sandbox comes back from a stop with what it wrote under its mounts (one
/// given at create, one mounted while it ran), mounted at the same paths.
#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_sandbox_keeps_its_writes_under_mounts_across_stop_and_start() {
    let d = Daemon::start();
    let c = d.unix();
    let (a, snap) = snapshots::directory_of_new_sandbox(
        &d,
        &c,
        "mkdir -p /srv/p && echo base > /srv/p/f",
        "/srv/p",
    )
    .await;

    let b = d
        .create(
            &c,
            CreateSandbox {
                persistent: Some(true),
                mounts: Some(vec![snapshots::mount(&snap.id, "/at-create")]),
                ..Default::default()
            },
        )
        .await;
    c.mount_snapshot(&b.id, &snapshots::mount(&snap.id, "/while-running"))
        .await
        .unwrap();
    let writes = "set -e; for m in /at-create /while-running; do echo changed > $m/f; \
                  echo new > $m/new; done; echo own > /root/own";
    sh_ok(&c, &b.id, writes).await;
    let show = "cat /at-create/f /at-create/new /while-running/f /while-running/new /root/own";
    let want = sh_ok(&c, &b.id, show).await;
    assert_eq!(want, "changed\nnew\nchanged\nnew\nown\n");

    c.stop_sandbox(&b.id).await.unwrap();
    let started = c.start_sandbox(&b.id).await.unwrap();
    assert_eq!(started.id, b.id);
    assert_eq!(
        mounted_paths(&c, &b.id).await,
        ["/at-create", "/while-running"],
        "the mounts come back at their paths"
    );
    assert_eq!(
        sh_ok(&c, &b.id, show).await,
        want,
        "the writes under the mounts are kept"
    );
    // The snapshot itself is unchanged: another sandbox mounting it sees the original.
    let e = d
        .create(
            &c,
            CreateSandbox {
                mounts: Some(vec![snapshots::mount(&snap.id, "/m")]),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(sh_ok(&c, &e.id, "cat /m/f; ls /m").await, "base\nf\n");
    for id in [&a.id, &b.id, &e.id] {
        c.delete_sandbox(id).await.unwrap();
    }
}
