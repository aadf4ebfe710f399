//! The daemon's pool of blank disks (`belljard --disk-pool N`, 2 by default): a new sandbox
//! of the default size gets a disk made ahead of time and the pool refills; a `kill -9` of
//! the daemon leaves no pooled disk attached, and the restarted daemon deletes their images;
//! `--disk-pool 0` keeps none. Needs root and the `base` image, like every namespace e2e test.

use std::path::Path;
use std::time::Duration;

use belljar_api::CreateSandbox;
use belljar_e2e::{Daemon, eventually, sh_ok};
use belljar_namespace::testing::loop_files_under;

/// The pool's image files, sorted.
fn images(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ext4"))
        .collect();
    names.sort();
    names
}

/// Waits until the pool holds `n` disks, each attached to a loop device; returns their names.
async fn full(dir: &Path, n: usize) -> Vec<String> {
    eventually(Duration::from_secs(60), "the disk pool to fill", || async {
        let names = images(dir);
        (names.len() == n && loop_files_under(dir).len() == n).then_some(names)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_takes_a_pooled_disk_and_a_kill_9_leaves_none_attached() {
    let d = Daemon::start();
    let dir = d.paths.data.join("disk-pool");
    let before = full(&dir, 2).await;

    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;
    // Its disk is one the pool made (same image file, now in its state directory), of the
    // default size, and blank apart from what the start wrote.
    let state = d.paths.data.join("sandboxes").join(&s.id).join("namespace");
    let attached = loop_files_under(&state);
    assert_eq!(attached.len(), 1, "{attached:?}");
    let refilled = full(&dir, 2).await;
    assert!(
        refilled.iter().any(|n| !before.contains(n)),
        "the pool did not make a new disk: {before:?} then {refilled:?}"
    );
    let taken: Vec<&String> = before.iter().filter(|n| !refilled.contains(n)).collect();
    assert_eq!(taken.len(), 1, "{before:?} then {refilled:?}");
    let size = sh_ok(&c, &s.id, "df -k / | tail -1 | awk '{print $2}'").await;
    let kib: u64 = size.trim().parse().unwrap();
    assert!(kib > 3 << 20 && kib <= 4 << 20, "{size}");
    sh_ok(&c, &s.id, "echo x > /tmp/mine").await;

    d.kill9();
    eventually(
        Duration::from_secs(10),
        "the pooled disks to detach",
        || async { loop_files_under(&dir).is_empty().then_some(()) },
    )
    .await;
    let left = images(&dir);
    assert_eq!(left, refilled, "the killed daemon's images");
    // The sandbox's disk is its own: it stays attached and mounted.
    assert_eq!(loop_files_under(&state), attached);

    d.restart();
    let fresh = full(&dir, 2).await;
    assert!(
        fresh.iter().all(|n| !left.contains(n)),
        "{left:?} {fresh:?}"
    );
    let c = d.unix();
    assert_eq!(sh_ok(&c, &s.id, "cat /tmp/mine").await, "x\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_pool_0_keeps_no_disks() {
    let d = Daemon::start_with_env(&[("BELLJAR_DISK_POOL", "0")]);
    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;
    let dir = d.paths.data.join("disk-pool");
    assert!(images(&dir).is_empty());
    assert!(loop_files_under(&dir).is_empty());
    let state = d.paths.data.join("sandboxes").join(&s.id).join("namespace");
    assert_eq!(loop_files_under(&state).len(), 1);
}
