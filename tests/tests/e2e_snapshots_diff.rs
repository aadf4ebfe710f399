//! Snapshot diffs on the namespace backend, through a real daemon and the CLI, with exact
//! results: what a snapshot changed on its image, between two snapshots of one sandbox
//! (content, mode, a symlink, a binary file, a directory deleted with what it held), and from
//! a snapshot to a running sandbox's current files; a snapshot's expiration is set; bad
//! requests get clear errors.
//!
//! Needs root and the `base` image (as every e2e test).

use belljar_api::{ChangeKind, CreateSandbox, CreateSnapshot, EntryKind, SnapshotDiff, Source};
use belljar_e2e::{Daemon, sh_ok, snapshots, stderr, stdout};

/// `change path` for each change, e.g. `M /etc/hosts`.
fn paths(d: &SnapshotDiff) -> Vec<String> {
    d.changes
        .iter()
        .map(|c| {
            let mark = match c.change {
                ChangeKind::Added => "A",
                ChangeKind::Modified => "M",
                ChangeKind::Deleted => "D",
            };
            format!("{mark} {}", c.path)
        })
        .collect()
}

fn find<'a>(d: &'a SnapshotDiff, path: &str) -> &'a belljar_api::FileChange {
    d.changes
        .iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| panic!("{path} not in {d:#?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn diffs_list_exactly_what_changed() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    sh_ok(
        &c,
        &a.id,
        "set -e; printf 'one\\ntwo\\n' > /workspace/a.txt
         mkdir /workspace/d; echo in > /workspace/d/inner; chmod 700 /workspace/d
         rm /etc/issue",
    )
    .await;
    let s1 = c.snapshot_sandbox(&a.id, &snapshots::live()).await.unwrap();

    // What s1 changed on the image.
    let on_image = c.snapshot_diff(&s1.id, None).await.unwrap();
    assert_eq!(on_image.from, "image:base");
    assert_eq!(on_image.to, s1.id);
    assert_eq!(
        paths(&on_image),
        [
            // What every sandbox's start writes: its hostname, its DNS server, and the
            // network broker's CA it trusts.
            "M /etc/hosts",
            "D /etc/issue",
            "M /etc/resolv.conf",
            "M /etc/ssl/certs/ca-certificates.crt",
            "A /usr/local/share/ca-certificates/belljar-sandbox-ca.crt",
            "A /workspace/a.txt",
            "A /workspace/d",
            "A /workspace/d/inner",
        ],
        "{on_image:#?}"
    );
    let hostname = a.id.replace('_', "-");
    let hosts = find(&on_image, "/etc/hosts")
        .unified_diff
        .as_deref()
        .unwrap();
    assert!(
        hosts.ends_with(&format!("+127.0.1.1\t{hostname}\n")),
        "{hosts}"
    );
    let dir = find(&on_image, "/workspace/d").new.clone().unwrap();
    assert_eq!((dir.kind, dir.mode), (EntryKind::Dir, 0o700));

    sh_ok(
        &c,
        &a.id,
        "set -e; printf 'one\\nTWO\\n' > /workspace/a.txt; chmod 600 /workspace/a.txt
         rm -r /workspace/d; printf '\\000\\001' > /workspace/bin; ln -s a.txt /workspace/l",
    )
    .await;
    let s2 = c
        .snapshot_sandbox(&a.id, &CreateSnapshot::default())
        .await
        .unwrap();
    let between = c.snapshot_diff(&s1.id, Some(&s2.id)).await.unwrap();
    assert_eq!(
        paths(&between),
        [
            "M /workspace/a.txt",
            "A /workspace/bin",
            "D /workspace/d",
            "D /workspace/d/inner",
            "A /workspace/l",
        ],
        "{between:#?}"
    );
    let text = find(&between, "/workspace/a.txt");
    let (old, new) = (text.old.clone().unwrap(), text.new.clone().unwrap());
    assert_eq!((old.mode, new.mode, new.size_bytes), (0o644, 0o600, 8));
    assert_eq!(
        text.unified_diff.as_deref(),
        Some("--- a/workspace/a.txt\n+++ b/workspace/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n")
    );
    let bin = find(&between, "/workspace/bin");
    assert_eq!(bin.new.as_ref().map(|e| e.size_bytes), Some(2));
    assert_eq!(bin.unified_diff, None, "a binary file has no text diff");
    let link = find(&between, "/workspace/l").new.clone().unwrap();
    assert_eq!(
        (link.kind, link.target.as_deref()),
        (EntryKind::Symlink, Some("a.txt"))
    );
    // The other way round, additions are deletions.
    let back = c.snapshot_diff(&s2.id, Some(&s1.id)).await.unwrap();
    assert_eq!(
        paths(&back),
        [
            "M /workspace/a.txt",
            "D /workspace/bin",
            "A /workspace/d",
            "A /workspace/d/inner",
            "D /workspace/l",
        ]
    );

    // From s2 to a running sandbox made from it: its current files.
    let b = d
        .create(
            &c,
            CreateSandbox {
                source: Some(Source::Snapshot {
                    snapshot_id: s2.id.clone(),
                }),
                ..Default::default()
            },
        )
        .await;
    sh_ok(
        &c,
        &b.id,
        "set -e; echo three >> /workspace/a.txt; rm /workspace/l",
    )
    .await;
    let live = c.snapshot_diff(&s2.id, Some(&b.id)).await.unwrap();
    assert_eq!(live.to, b.id);
    assert_eq!(
        paths(&live),
        [
            // Its own hostname and its own broker CA.
            "M /etc/hosts",
            "M /etc/ssl/certs/ca-certificates.crt",
            "M /usr/local/share/ca-certificates/belljar-sandbox-ca.crt",
            "M /workspace/a.txt",
            "D /workspace/l",
        ],
        "{live:#?}"
    );
    assert!(
        find(&live, "/workspace/a.txt")
            .unified_diff
            .as_deref()
            .unwrap()
            .ends_with(" one\n TWO\n+three\n")
    );

    // The CLI, by sandbox name too.
    let out = d.cli(["snapshots", "diff", &s1.id, &s2.id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("{} -> {}\n", s1.id, s2.id)),
        "{text}"
    );
    assert!(
        text.contains("M /workspace/a.txt  (file 644 0:0 8 B => file 600 0:0 8 B)"),
        "{text}"
    );
    assert!(text.contains("D /workspace/d/inner"), "{text}");
    assert!(text.contains("-two\n+TWO\n"), "{text}");

    // Bad requests.
    let err = c
        .snapshot_diff("snap_nosuchsnapshot", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    c.stop_sandbox(&b.id).await.unwrap();
    let err = c.snapshot_diff(&s2.id, Some(&b.id)).await.unwrap_err();
    assert_eq!(err.code(), "sandbox_not_running", "{err}");
    c.delete_snapshot(&s1.id).await.unwrap();
    let err = c.snapshot_diff(&s2.id, Some(&s1.id)).await.unwrap_err();
    assert_eq!(err.code(), "snapshot_not_usable", "{err}");

    // Setting a snapshot's expiration (the timeline's action): never, then an hour from now.
    assert_eq!(
        c.set_snapshot_expiration(&s2.id, 0)
            .await
            .unwrap()
            .expires_at,
        None
    );
    let later = c.set_snapshot_expiration(&s2.id, 3_600_000).await.unwrap();
    assert!(later.expires_at.is_some_and(|at| at > s2.created_at));
    let err = c.set_snapshot_expiration(&s2.id, -1).await.unwrap_err();
    assert_eq!(err.code(), "bad_request", "{err}");
    let err = c.set_snapshot_expiration(&s1.id, 0).await.unwrap_err();
    assert_eq!(err.code(), "snapshot_not_usable", "{err}");
}
