//! Modal's directory snapshots on the namespace backend, through a real daemon: one
//! directory of a running sandbox snapshotted (files, modes, owners, symlinks, and the
//! deletions of earlier layers right), mounted at a path of new sandboxes (created when
//! missing, hiding what was there), copy-on-write (writes never reach the snapshot or other
//! sandboxes), held while mounted; and bad input refused with stable codes.
//!
//! Needs root and the `base` image (as every e2e test).

use belljar_api::{
    CreateSandbox, CreateSnapshot, ListSandboxesQuery, SandboxStatus, SnapshotMount,
    SnapshotStatus, Source,
};
use belljar_client::Client;
use belljar_e2e::{Daemon, sh_ok, snapshots};

/// Every entry under a directory with its kind, mode and owner, then each file's hash.
fn listing(dir: &str) -> String {
    format!(
        "cd {dir} && find . -mindepth 1 -printf '%P %y %m %U:%G %l\\n' | sort; \
         find . -type f -exec md5sum {{}} + | sort"
    )
}

fn mounting(snapshot_id: &str, path: &str) -> CreateSandbox {
    CreateSandbox {
        mounts: Some(vec![SnapshotMount {
            snapshot_id: snapshot_id.into(),
            path: path.into(),
        }]),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_snapshot_mounts_copy_on_write_into_new_sandboxes() {
    let d = Daemon::start();
    let c = d.unix();
    // The directory spans two layers: a snapshot below, the sandbox's own writes above
    // (which delete a file of the lower one: a whiteout).
    let first = d.create(&c, CreateSandbox::default()).await;
    sh_ok(
        &c,
        &first.id,
        "mkdir -p /srv/proj/sub && echo gone > /srv/proj/old && echo keep > /srv/proj/keep",
    )
    .await;
    let base = c
        .snapshot_sandbox(&first.id, &CreateSnapshot::default())
        .await
        .unwrap();
    let a = d
        .create(
            &c,
            CreateSandbox {
                source: Some(Source::Snapshot {
                    snapshot_id: base.id.clone(),
                }),
                ..Default::default()
            },
        )
        .await;
    sh_ok(
        &c,
        &a.id,
        "set -e; cd /srv/proj; rm old; echo hi > f; chmod 640 f; chown 1000:1000 sub; \
         echo x > sub/g; chmod 4755 sub/g; ln -s f link; mkdir -m 700 private",
    )
    .await;
    let want = sh_ok(&c, &a.id, &listing("/srv/proj")).await;
    assert!(!want.contains("old"), "{want}");

    let snap = c
        .snapshot_sandbox(&a.id, &snapshots::of_directory("/srv/proj"))
        .await
        .unwrap();
    assert_eq!(snap.status, SnapshotStatus::Created);
    assert_eq!(snap.path.as_deref(), Some("/srv/proj"));
    assert_eq!(snap.depth, 1);
    assert!(snap.frozen_ms.is_some());
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Running,
        "the sandbox keeps running"
    );

    // Mounted where nothing was (made), and over a directory of the image (hidden).
    let b = d.create(&c, mounting(&snap.id, "/mnt/p")).await;
    assert_eq!(sh_ok(&c, &b.id, &listing("/mnt/p")).await, want);
    assert_eq!(
        sh_ok(&c, &b.id, "awk '$2 == \"/mnt/p\" {print $3}' /proc/mounts").await,
        "overlay\n",
        "the snapshot is a mount at the path"
    );
    let over = d.create(&c, mounting(&snap.id, "/usr/share/doc")).await;
    assert_eq!(sh_ok(&c, &over.id, &listing("/usr/share/doc")).await, want);

    // Copy-on-write: b's writes stay in b.
    sh_ok(
        &c,
        &b.id,
        "set -e; echo changed > /mnt/p/f; rm /mnt/p/sub/g; touch /mnt/p/new",
    )
    .await;
    let e = d.create(&c, mounting(&snap.id, "/mnt/p")).await;
    assert_eq!(sh_ok(&c, &e.id, &listing("/mnt/p")).await, want);
    assert_eq!(sh_ok(&c, &a.id, &listing("/srv/proj")).await, want);

    // A sandbox that mounts it holds its files after the snapshot is deleted.
    c.delete_snapshot(&snap.id).await.unwrap();
    assert_eq!(sh_ok(&c, &e.id, &listing("/mnt/p")).await, want);
    let err = c
        .create_sandbox(&mounting(&snap.id, "/mnt/p"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "snapshot_not_usable", "{err}");
    for id in [&first.id, &a.id, &b.id, &over.id, &e.id] {
        c.delete_sandbox(id).await.unwrap();
    }
    let layers = std::fs::read_dir(d.paths.data.join("layers"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect::<Vec<_>>();
    c.delete_snapshot(&base.id).await.unwrap();
    assert!(!layers.is_empty());
    // Copies a capture found stored already are deleted in the background.
    let layers_dir = d.paths.data.join("layers");
    belljar_e2e::eventually(
        std::time::Duration::from_secs(30),
        "the last holder's deletion to free the layers",
        || {
            let left = std::fs::read_dir(&layers_dir).unwrap().count();
            async move { (left == 0).then_some(()) }
        },
    )
    .await;
}

async fn sandbox_count(c: &Client) -> usize {
    c.list_sandboxes(&ListSandboxesQuery::default())
        .await
        .unwrap()
        .sandboxes
        .len()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_directory_snapshots_and_mounts_are_refused_with_stable_codes() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    sh_ok(&c, &a.id, "mkdir -p /srv/d && echo 1 > /srv/d/f").await;
    for (path, code) in [
        ("srv/d", "invalid_path"),
        ("/", "invalid_path"),
        ("/srv/../etc", "invalid_path"),
        ("/etc/passwd", "not_a_directory"),
        ("/nowhere", "not_found"),
    ] {
        let err = c
            .snapshot_sandbox(&a.id, &snapshots::of_directory(path))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{path}: {err}");
    }
    // A symlink the sandbox planted resolves inside it, never on the host.
    sh_ok(
        &c,
        &a.id,
        "ln -s /srv/d /srv/link && ln -s ../../../../srv/d /srv/up",
    )
    .await;
    for link in ["/srv/link", "/srv/up"] {
        let s = c
            .snapshot_sandbox(&a.id, &snapshots::of_directory(link))
            .await
            .unwrap();
        let m = d.create(&c, mounting(&s.id, "/m")).await;
        assert_eq!(sh_ok(&c, &m.id, "ls /m").await, "f\n", "{link}");
        c.delete_sandbox(&m.id).await.unwrap();
    }
    let dir = c
        .snapshot_sandbox(&a.id, &snapshots::of_directory("/srv/d"))
        .await
        .unwrap();
    let whole = c.snapshot_sandbox(&a.id, &snapshots::live()).await.unwrap();
    let before = sandbox_count(&c).await;
    for (snapshot, path, code) in [
        ("snap_nosuchsnapshot", "/m", "not_found"),
        (dir.id.as_str(), "m", "invalid_path"),
        (dir.id.as_str(), "/", "invalid_path"),
        (dir.id.as_str(), "/m/../etc", "invalid_path"),
        (dir.id.as_str(), "/etc/passwd", "not_a_directory"),
        (dir.id.as_str(), "/etc/passwd/x", "not_a_directory"),
        // `/bin` is a symlink in the image: a mount through it would leave the sandbox.
        (dir.id.as_str(), "/bin/x", "not_a_directory"),
        (whole.id.as_str(), "/m", "bad_request"),
    ] {
        let err = c
            .create_sandbox(&mounting(snapshot, path))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{snapshot} at {path}: {err}");
    }
    let err = c
        .create_sandbox(&CreateSandbox {
            source: Some(Source::Snapshot {
                snapshot_id: dir.id.clone(),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "bad_request", "{err}");
    assert_eq!(
        sandbox_count(&c).await,
        before,
        "refused creates leave nothing"
    );
}
