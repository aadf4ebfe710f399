//! The disk pool, as root: disks handed out once, blank, of their size; other sizes made as
//! before; nothing left behind by a pool dropped, nor by a process killed with its pool.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::*;
use crate::disk::tests::as_root as root;
use crate::disk::{DISK_FILE, is_mount_point};
use crate::testing::loop_files_under as backed_by;

/// Whether `check` holds within 10 s (the kernel releases a filesystem and its loop device
/// after the last descriptor closes, not during the close).
fn within_10s(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// Held by the tests that install a pool: one process has one installed pool.
static INSTALLING: Mutex<()> = Mutex::new(());

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn pooled_disks_are_handed_out_once_blank_and_of_their_size() {
    if !root() {
        return;
    }
    let _installing = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    // A size no other test uses, as the installed pool serves every start of its size.
    let size = 40 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pool");
    let pool = DiskPool::start(&dir, size, 2).unwrap();
    assert!(
        pool.wait_full(Duration::from_secs(60)),
        "{:?}",
        pool.last_error()
    );
    let devices = backed_by(&dir);
    assert_eq!(devices.len(), 2, "{devices:?}");
    // Attached nowhere: no mount of this process shows them.
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(dir.to_str().unwrap()));
    pool.install();

    // Another size is made as before.
    let other = tmp.path().join("other");
    fs::create_dir(&other).unwrap();
    disk::mount(&other, &other.join("fs"), 32 << 20).unwrap();
    assert_eq!(pool.counts().1, 0);

    let dirs = ["a", "b"].map(|n| tmp.path().join(n));
    for d in &dirs {
        fs::create_dir(d).unwrap();
        let how = disk::mount(d, &d.join("fs"), size).unwrap();
        assert!(
            matches!(how, crate::LimitStatus::Enforced { .. }),
            "{how:?}"
        );
        assert!(is_mount_point(&d.join("fs")));
        assert_eq!(
            names(&d.join("fs")),
            ["lost+found"],
            "a pooled disk held files"
        );
        let st = nix::sys::statvfs::statvfs(&d.join("fs")).unwrap();
        let total = st.blocks() * st.fragment_size();
        assert!(total > 24 << 20 && total <= size, "{total}");
        // The loop device now reads the state directory's image.
        assert_eq!(backed_by(d), [d.join(DISK_FILE).to_str().unwrap()]);
    }
    assert_eq!(pool.counts().1, 2);
    fs::write(dirs[0].join("fs/mine"), b"a").unwrap();
    assert!(!dirs[1].join("fs/mine").exists(), "two starts got one disk");

    // The pool makes new disks for the ones it gave.
    assert!(
        pool.wait_full(Duration::from_secs(60)),
        "{:?}",
        pool.last_error()
    );
    assert_eq!(pool.counts(), (4, 2));
    drop(pool);
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
    assert!(
        within_10s(|| backed_by(&dir).is_empty()),
        "{:?}",
        backed_by(&dir)
    );
    // Without a pool the next start of that size makes its own disk.
    let c = tmp.path().join("c");
    fs::create_dir(&c).unwrap();
    disk::mount(&c, &c.join("fs"), size).unwrap();

    // The given disks outlive the pool and keep their files until unmounted.
    assert_eq!(fs::read(dirs[0].join("fs/mine")).unwrap(), b"a");
    for d in dirs.iter().chain([&other, &c]) {
        disk::unmount(&d.join("fs"));
    }
    assert!(within_10s(|| backed_by(tmp.path()).is_empty()));
}

/// The disk that replaces a handed-out one is made once the taker ran a command (a command
/// of another sandbox does not count), or when the hold ran out.
#[test]
fn a_refill_waits_for_the_takers_first_command() {
    if !root() {
        return;
    }
    let _installing = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    // A size no other test uses, as the installed pool serves every start of its size.
    let size = 44 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pool");
    let pool = DiskPool::start_holding(&dir, size, 1, Duration::from_secs(3600)).unwrap();
    assert!(
        pool.wait_full(Duration::from_secs(60)),
        "{:?}",
        pool.last_error()
    );
    pool.install();
    let state = tmp.path().join("a");
    fs::create_dir(&state).unwrap();
    disk::mount(&state, &state.join("fs"), size).unwrap();
    assert_eq!(pool.counts(), (1, 1));
    go_ahead(&tmp.path().join("other"));
    // Long enough for the thread to make a disk (~30 ms) had it not waited.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pool.counts(), (1, 1), "the refill did not wait");
    go_ahead(&state);
    assert!(
        pool.wait_full(Duration::from_secs(60)),
        "{:?}",
        pool.last_error()
    );
    drop(pool);

    // With a short hold and no command, the refill goes ahead when it runs out.
    let pool = DiskPool::start_holding(&dir, size, 1, Duration::from_millis(50)).unwrap();
    assert!(pool.wait_full(Duration::from_secs(60)));
    pool.install();
    let late = tmp.path().join("b");
    fs::create_dir(&late).unwrap();
    disk::mount(&late, &late.join("fs"), size).unwrap();
    assert!(pool.wait_full(Duration::from_secs(60)));
    assert_eq!(pool.counts(), (2, 1));
    drop(pool);
    for d in [&state, &late] {
        disk::unmount(&d.join("fs"));
    }
    assert!(within_10s(|| backed_by(tmp.path()).is_empty()));
}

#[test]
fn a_failed_handover_leaves_nothing() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pool");
    let pool = DiskPool::start(&dir, 36 << 20, 1).unwrap();
    assert!(
        pool.wait_full(Duration::from_secs(60)),
        "{:?}",
        pool.last_error()
    );
    let blank = pool.shared.take(tmp.path()).unwrap();
    let image = blank.image.clone().unwrap();
    // The rename fails: no such directory.
    let missing = tmp.path().join("missing/state");
    let err = blank
        .attach(&missing.join(DISK_FILE), &tmp.path().join("fs"))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(!image.exists());
    assert!(
        within_10s(|| !backed_by(&dir)
            .iter()
            .any(|f| f.starts_with(image.to_str().unwrap()))),
        "{:?}",
        backed_by(&dir)
    );
    drop(pool);
    assert!(within_10s(|| backed_by(&dir).is_empty()));
}

/// Run by [`a_killed_process_leaves_no_mount_and_its_images_go_at_the_next_start`]: keeps a
/// pool until its stdin closes or it is killed.
#[test]
#[ignore = "the child of another test"]
fn pool_child() {
    let Some(dir) = std::env::var_os("BELLJAR_TEST_POOL_DIR") else {
        return;
    };
    let pool = DiskPool::start(Path::new(&dir), 36 << 20, 2).unwrap();
    assert!(
        pool.wait_full(Duration::from_secs(60)),
        "{:?}",
        pool.last_error()
    );
    println!("pool is full");
    let _ = io::stdin().lines().count();
}

#[test]
fn a_killed_process_leaves_no_mount_and_its_images_go_at_the_next_start() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pool");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "disk_pool::tests::pool_child",
            "--ignored",
            "--nocapture",
        ])
        .env("BELLJAR_TEST_POOL_DIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = io::BufReader::new(child.stdout.take().unwrap());
    let full = stdout
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("pool is full"));
    assert!(full, "the child's pool did not fill");
    assert_eq!(backed_by(&dir).len(), 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        within_10s(|| backed_by(&dir).is_empty()),
        "{:?}",
        backed_by(&dir)
    );
    let left = names(&dir);
    assert_eq!(left.len(), 2, "{left:?}");
    let pool = DiskPool::start(&dir, 36 << 20, 0).unwrap();
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
    drop(pool);
}
