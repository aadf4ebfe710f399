//! The reaper against a clock of its own, and the start-up clean-up of layer directories.

use std::sync::Arc;

use super::*;
use crate::events::Events;
use crate::images::Images;
use crate::paths::Paths;
use crate::sandbox::Settings;
use crate::sandbox::backend::Backends;
use crate::store::Store;

fn manager(home: &std::path::Path) -> Sandboxes {
    let paths = Paths::resolve(Some(home), Some(&home.join("cache"))).unwrap();
    paths.create().unwrap();
    let store = Store::open(&paths.database()).unwrap();
    let events = Arc::new(Events::new(store.clone()));
    let images = Images::new(paths.clone(), home.join("guest-images"), store.clone());
    Sandboxes::new(
        store,
        events,
        paths,
        Backends::new(Vec::new()),
        images,
        Settings::default(),
    )
}

fn snapshot_row(id: &str, layer: &str, expires_at: Option<i64>) -> SnapshotRow {
    let mut row = SnapshotRow::fixture(id, &[layer], 0);
    row.snapshot.expires_at = expires_at;
    row.expiration_ms = expires_at.unwrap_or(0);
    row
}

/// The reaper follows the clock it is given (no sleeping through days), deletes a layer
/// with its last snapshot, and keeps what never expires; a restart (a new manager on the
/// same home) deletes half-made and unreferenced layer directories and keeps held ones.
#[tokio::test]
async fn the_reaper_follows_the_clock_and_a_restart_cleans_up() {
    let home = tempfile::tempdir().unwrap();
    let m = manager(home.path());
    let layers = m.layers_dir();
    for dir in ["aa", "bb", "cc", ".tmp-1-2", "dd"] {
        std::fs::create_dir_all(layers.join(dir).join("etc")).unwrap();
    }
    let store = m.store();
    store
        .insert_snapshot(&snapshot_row("snap_a", "aa", Some(1_000)), 1)
        .unwrap();
    store
        .insert_snapshot(&snapshot_row("snap_b", "bb", Some(5_000)), 1)
        .unwrap();
    store
        .insert_snapshot(&snapshot_row("snap_c", "cc", None), 1)
        .unwrap();

    assert!(m.reap_snapshots(999).await.unwrap().is_empty());
    assert_eq!(m.reap_snapshots(1_000).await.unwrap(), ["snap_a"]);
    assert!(!layers.join("aa").exists());
    assert!(layers.join("bb").exists());
    assert_eq!(
        m.get_snapshot("snap_a").unwrap().status,
        SnapshotStatus::Deleted
    );
    assert_eq!(m.reap_snapshots(i64::MAX).await.unwrap(), ["snap_b"]);
    assert_eq!(
        m.get_snapshot("snap_c").unwrap().status,
        SnapshotStatus::Created
    );
    drop(m);

    let m = manager(home.path());
    m.recover_snapshots().await.unwrap();
    let mut left: Vec<String> = std::fs::read_dir(&layers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["cc"], "the half copy and the unheld layer are gone");
}
