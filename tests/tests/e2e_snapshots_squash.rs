//! Squashing on the namespace backend, through a real daemon whose squash depth is set low:
//! a chain of 20 snapshots (each a sandbox made from the one before) is squashed in the
//! background, and afterwards every snapshot still shows exactly the files, deletions
//! (whiteouts), opaque directories, owners and modes it was taken with, to new sandboxes and
//! to those made before the squash. A daemon killed with `kill -9` mid-squash loses nothing:
//! its next start finishes the squash.
//!
//! Needs root and the `base` image (as every e2e test).

use std::path::PathBuf;
use std::time::Duration;

use belljar_api::{
    CreateSandbox, CreateSnapshot, Event, ListSnapshotsQuery, Snapshot, SnapshotStatus, Source,
};
use belljar_client::{Client, NdjsonStream};
use belljar_e2e::{Daemon, eventually, sh_ok};

/// The squash depth the daemons of these tests run with.
const DEPTH: u32 = 4;

fn from(snapshot_id: &str) -> CreateSandbox {
    CreateSandbox {
        source: Some(Source::Snapshot {
            snapshot_id: snapshot_id.into(),
        }),
        ..Default::default()
    }
}

/// Step `i` of the chain: new files with their own modes and owners, a file changed in every
/// layer, directories deleted from earlier layers, a directory made opaque, and files of the
/// image deleted, brought back, and replaced by a directory.
fn change(i: u32) -> String {
    let mut s = format!(
        "set -e
        mkdir -p /workspace/d{i} && echo {i} > /workspace/d{i}/f
        chmod 6{m}0 /workspace/d{i}/f && chown {i}:{g} /workspace/d{i}
        echo {i} >> /workspace/log
        mkdir -p /workspace/op && touch /workspace/op/y{i}\n",
        m = i % 8,
        g = 100 + i,
    );
    if i.is_multiple_of(3) {
        s += &format!("rm -rf /workspace/d{}\n", i - 2);
    }
    if i.is_multiple_of(4) {
        s +=
            &format!("rm -rf /workspace/op && mkdir /workspace/op && echo {i} > /workspace/op/x\n");
    }
    s += match i {
        5 => "rm /etc/debian_version\n",
        9 => "echo back > /etc/debian_version\n",
        12 => "rm -rf /usr/share/doc\n",
        14 => "mkdir /usr/share/doc && echo n > /usr/share/doc/new\n",
        17 => "rm -rf /workspace/op\n",
        _ => "",
    };
    s
}

/// What a snapshot must show: every path under the changed trees with its kind, mode and
/// owner, and each file's content hash.
const LISTING: &str = "find /workspace /etc/debian_version /usr/share/doc \
    -printf '%p %y %m %U:%G\\n' 2>/dev/null | sort; \
    find /workspace /etc/debian_version /usr/share/doc -type f -exec md5sum {} + 2>/dev/null \
    | sort; true";

/// Waits until no created snapshot is deeper than [`DEPTH`] and no squash is under way,
/// reading the event stream between looks; returns the created snapshots.
async fn wait_squashed(d: &Daemon, c: &Client, events: &mut NdjsonStream<Event>) -> Vec<Snapshot> {
    tokio::time::timeout(Duration::from_secs(240), async {
        loop {
            let all = c
                .list_snapshots(&ListSnapshotsQuery {
                    status: Some(SnapshotStatus::Created),
                    limit: Some(200),
                    ..Default::default()
                })
                .await
                .unwrap()
                .snapshots;
            let busy = layer_names(d).iter().any(|n| n.starts_with(".tmp-"));
            if !busy && all.iter().all(|s| s.depth <= DEPTH) {
                return all;
            }
            loop {
                let e = events.next().await.unwrap().expect("events stream ended");
                if matches!(e, Event::Snapshot { .. }) {
                    break;
                }
            }
        }
    })
    .await
    .expect("the chains squashed within 240 s")
}

fn layer_names(d: &Daemon) -> Vec<String> {
    let dir: PathBuf = d.paths.data.join("layers");
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Builds a chain of `n` snapshots; returns them oldest first with what each must show.
async fn chain(d: &Daemon, c: &Client, n: u32, first: &str) -> Vec<(Snapshot, String)> {
    let mut out: Vec<(Snapshot, String)> = Vec::new();
    for i in 1..=n {
        let req = match out.last() {
            Some((s, _)) => from(&s.id),
            None => CreateSandbox::default(),
        };
        let sbx = d.create(c, req).await;
        if i == 1 {
            sh_ok(c, &sbx.id, first).await;
        }
        sh_ok(c, &sbx.id, &change(i)).await;
        let listing = sh_ok(c, &sbx.id, LISTING).await;
        let snap = c
            .snapshot_sandbox(&sbx.id, &CreateSnapshot::default())
            .await
            .unwrap();
        assert_eq!(snap.status, SnapshotStatus::Created);
        c.delete_sandbox(&sbx.id).await.unwrap();
        out.push((snap, listing));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_20_snapshots_is_squashed_and_keeps_every_snapshot_exact() {
    let d = Daemon::start_with_env(&[("BELLJAR_SQUASH_DEPTH", &DEPTH.to_string())]);
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let snaps = chain(&d, &c, 20, "true").await;
    // A sandbox made from the deepest snapshot before its squash keeps its own layers.
    let early = d.create(&c, from(&snaps[19].0.id)).await;

    let created = wait_squashed(&d, &c, &mut events).await;
    assert_eq!(created.len(), 20);
    for (i, (snap, listing)) in snaps.iter().enumerate() {
        let now = c.snapshot(&snap.id).await.unwrap();
        assert_eq!(now.status, SnapshotStatus::Created);
        assert!(now.depth <= DEPTH, "{now:?}");
        assert_eq!(
            (now.size_bytes, now.created_at, &now.parent),
            (snap.size_bytes, snap.created_at, &snap.parent),
            "only the depth changes"
        );
        let sbx = d.create(&c, from(&snap.id)).await;
        assert_eq!(
            &sh_ok(&c, &sbx.id, LISTING).await,
            listing,
            "snapshot {} ({})",
            i + 1,
            snap.id
        );
        c.delete_sandbox(&sbx.id).await.unwrap();
    }
    assert!(
        snaps.iter().any(|(s, _)| s.depth > DEPTH),
        "snapshots were recorded deeper than the limit, then squashed"
    );
    assert_eq!(&sh_ok(&c, &early.id, LISTING).await, &snaps[19].1);
    // Deleting everything frees every layer, squashed ones included.
    c.delete_sandbox(&early.id).await.unwrap();
    for (snap, _) in &snaps {
        c.delete_snapshot(&snap.id).await.unwrap();
    }
    assert_eq!(layer_names(&d), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_squash_cut_by_kill_9_is_finished_at_the_next_start() {
    let d = Daemon::start_with_env(&[("BELLJAR_SQUASH_DEPTH", &DEPTH.to_string())]);
    let c = d.unix();
    // Enough data that the merged copy is still under way when the daemon dies.
    let big = "head -c 96M /dev/urandom > /workspace/big";
    let snaps = chain(&d, &c, DEPTH + 1, big).await;
    let before = d.create(&c, from(&snaps.last().unwrap().0.id)).await;
    eventually(Duration::from_secs(60), "a squash under way", || {
        let names = layer_names(&d);
        async move {
            names
                .iter()
                .any(|n| n.starts_with(".tmp-squash"))
                .then_some(())
        }
    })
    .await;
    d.kill9();
    d.restart();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let created = wait_squashed(&d, &c, &mut events).await;
    assert_eq!(created.len(), snaps.len());
    for (snap, listing) in &snaps {
        let sbx = d.create(&c, from(&snap.id)).await;
        assert_eq!(&sh_ok(&c, &sbx.id, LISTING).await, listing, "{}", snap.id);
        c.delete_sandbox(&sbx.id).await.unwrap();
    }
    // The sandbox made before the cut runs on with its files.
    assert_eq!(
        &sh_ok(&c, &before.id, LISTING).await,
        &snaps.last().unwrap().1
    );
}
