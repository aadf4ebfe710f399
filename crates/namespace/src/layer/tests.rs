//! The capture of writable layers, against real trees (as root: whiteouts, owners).

use super::*;

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

#[test]
fn owners_shift_into_the_block_and_strangers_become_nobody() {
    let s = Shift::Block(100_000);
    assert_eq!(s.apply(100_000), 0);
    assert_eq!(s.apply(101_000), 1000);
    assert_eq!(s.apply(99_999), NOBODY);
    assert_eq!(s.apply(100_000 + ID_BLOCK), NOBODY);
    assert_eq!(Shift::Rootless(1000).apply(1000), 0);
    assert_eq!(Shift::Rootless(1000).apply(5), 5);
}

/// As root: every kind of entry an upper directory holds survives the copy, owners are
/// shifted, overlay bookkeeping is dropped, and the same tree gives the same digest.
#[test]
fn a_capture_keeps_whiteouts_opaque_dirs_modes_owners_and_links() {
    if !is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("not root: cannot make whiteouts or give files away");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    let base = 200_000;
    fs::create_dir_all(upper.join("etc/opaque")).unwrap();
    fs::write(upper.join("etc/file"), b"hello").unwrap();
    fs::hard_link(upper.join("etc/file"), upper.join("etc/hard")).unwrap();
    std::os::unix::fs::symlink("file", upper.join("etc/link")).unwrap();
    let wh = mounts::c_path(&upper.join("etc/gone"));
    // SAFETY: a valid C path; makes an overlay whiteout (char 0:0).
    assert_eq!(unsafe { libc::mknod(wh.as_ptr(), libc::S_IFCHR, 0) }, 0);
    set_xattr(
        &upper.join("etc/opaque"),
        OsStr::new("user.overlay.opaque"),
        b"y",
    )
    .unwrap();
    set_xattr(&upper.join("etc"), OsStr::new("user.overlay.impure"), b"y").unwrap();
    for p in ["etc", "etc/file", "etc/link", "etc/gone", "etc/opaque"] {
        std::os::unix::fs::lchown(upper.join(p), Some(base + 1000), Some(base)).unwrap();
    }
    // After the chown, which clears set-id bits.
    fs::set_permissions(upper.join("etc/file"), fs::Permissions::from_mode(0o4751)).unwrap();
    let layers = tmp.path().join("layers");
    let first = capture_tree(&upper, &layers, Shift::Block(base), None).unwrap();
    let l = &first.path;
    assert_eq!(first.size_bytes, 5);
    assert_eq!(fs::read(l.join("etc/hard")).unwrap(), b"hello");
    let file = fs::metadata(l.join("etc/file")).unwrap();
    assert_eq!(file.mode() & 0o7777, 0o4751);
    assert_eq!((file.uid(), file.gid()), (1000, 0));
    assert_eq!(file.ino(), fs::metadata(l.join("etc/hard")).unwrap().ino());
    assert_eq!(
        fs::read_link(l.join("etc/link")).unwrap(),
        Path::new("file")
    );
    let gone = fs::symlink_metadata(l.join("etc/gone")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &gone.file_type()
    ));
    assert_eq!(gone.rdev(), 0);
    assert_eq!(
        get_xattr(&l.join("etc/opaque"), OsStr::new("user.overlay.opaque")).unwrap(),
        Some(b"y".to_vec())
    );
    assert_eq!(
        get_xattr(&l.join("etc"), OsStr::new("user.overlay.impure")).unwrap(),
        None
    );
    assert_eq!(
        fs::metadata(l.join("etc")).unwrap().mtime(),
        fs::metadata(upper.join("etc")).unwrap().mtime()
    );
    // The same content again is the same layer, and no half copy is left behind.
    let again = capture_tree(&upper, &layers, Shift::Block(base), None).unwrap();
    assert_eq!(again, first);
    assert!(trash::wait_empty(std::time::Duration::from_secs(10)));
    let names: Vec<_> = fs::read_dir(&layers)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![OsString::from(&first.digest)]);
    // One changed byte is another layer.
    fs::write(upper.join("etc/file"), b"hellO").unwrap();
    let other = capture_tree(&upper, &layers, Shift::Block(base), None).unwrap();
    assert_ne!(other.digest, first.digest);
}

#[test]
fn a_deep_tree_does_not_overflow_the_stack() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    let mut p = upper.clone();
    for _ in 0..1500 {
        p.push("d");
    }
    // Past PATH_MAX paths cannot be made with plain calls; 1500 levels are 3000 bytes.
    fs::create_dir_all(&p).unwrap();
    let c = capture_tree(&upper, &tmp.path().join("layers"), Shift::Keep, None).unwrap();
    assert!(c.path.join("d/d/d").is_dir());
}

/// As root: a second capture of the same writable layer links what did not change from the
/// first one's layer and copies what did (content rewritten with its size and mtime kept, a
/// mode changed, a new file), and its layer and digest are the ones a full copy gives.
#[test]
fn a_capture_after_another_copies_only_what_changed_since() {
    if !is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("not root: cannot give files away");
        return;
    }
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    let base = 300_000;
    fs::create_dir_all(upper.join("d")).unwrap();
    for name in ["same", "rewritten", "chmodded", "suid"] {
        fs::write(upper.join("d").join(name), name.repeat(1000)).unwrap();
        std::os::unix::fs::lchown(upper.join("d").join(name), Some(base + 7), Some(base)).unwrap();
    }
    fs::set_permissions(upper.join("d/suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    let layers = tmp.path().join("layers");
    let first = capture_tree_with(&upper, &layers, Shift::Block(base), None, true).unwrap();

    // The same bytes count, the modification time put back: only the change time tells.
    let rewritten = upper.join("d/rewritten");
    let before = fs::metadata(&rewritten).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&rewritten).unwrap();
    f.write_all_at(b"X", 10).unwrap();
    drop(f);
    xattr::set_times(&rewritten, &before).unwrap();
    fs::set_permissions(upper.join("d/chmodded"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(upper.join("d/new"), b"new").unwrap();
    let second = capture_tree_with(&upper, &layers, Shift::Block(base), None, true).unwrap();

    let ino = |layer: &Path, name: &str| fs::metadata(layer.join("d").join(name)).unwrap().ino();
    assert_eq!(ino(&second.path, "same"), ino(&first.path, "same"));
    assert_eq!(ino(&second.path, "suid"), ino(&first.path, "suid"));
    assert_ne!(
        ino(&second.path, "rewritten"),
        ino(&first.path, "rewritten")
    );
    assert_ne!(ino(&second.path, "chmodded"), ino(&first.path, "chmodded"));
    let linked = fs::metadata(second.path.join("d/suid")).unwrap();
    assert_eq!(
        linked.mode() & 0o7777,
        0o4755,
        "a link keeps the set-id bit"
    );
    assert_eq!((linked.uid(), linked.gid()), (7, 0));
    assert_eq!(fs::read(second.path.join("d/rewritten")).unwrap()[10], b'X');
    assert_eq!(
        fs::metadata(second.path.join("d/chmodded")).unwrap().mode() & 0o7777,
        0o600
    );
    assert_eq!(fs::read(first.path.join("d/chmodded")).unwrap().len(), 8000);
    let first_mode = fs::metadata(first.path.join("d/chmodded")).unwrap().mode();
    assert_eq!(first_mode & 0o7777, 0o644, "the earlier layer is untouched");

    // A full copy of the same tree names the same layer.
    let full = capture_tree(&upper, &tmp.path().join("full"), Shift::Block(base), None).unwrap();
    assert_eq!(
        (full.digest, full.size_bytes),
        (second.digest.clone(), second.size_bytes)
    );
    // With the earlier layer gone, the next capture copies everything again.
    remove_tree(&second.path);
    remove_tree(&first.path);
    let third = capture_tree_with(&upper, &layers, Shift::Block(base), None, true).unwrap();
    assert_eq!(third.digest, second.digest);
    assert_eq!(
        fs::read(third.path.join("d/same")).unwrap(),
        "same".repeat(1000).as_bytes()
    );
    reuse::forget(tmp.path());
    assert!(reuse::previous(&upper).is_none());
}

/// A 6 GiB file that holds 4 KiB of data is captured as 4 KiB (it once wrote 6 GiB to the
/// host's disk), and a capture bounded by a disk size makes no layer past it, leaving nothing.
#[test]
fn a_sparse_file_is_captured_sparsely_and_a_capture_stops_at_the_disk_size() {
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    fs::create_dir_all(upper.join("workspace")).unwrap();
    let sparse = fs::File::create(upper.join("workspace/sparse")).unwrap();
    sparse.set_len(6 << 30).unwrap();
    sparse.write_all_at(b"middle", 3 << 30).unwrap();
    drop(sparse);
    let layers = tmp.path().join("layers");
    let c = capture_tree(&upper, &layers, Shift::Keep, Some(1 << 20)).unwrap();
    assert_eq!(c.size_bytes, 4096, "the stored data, not the apparent size");
    let copy = c.path.join("workspace/sparse");
    let meta = fs::metadata(&copy).unwrap();
    assert_eq!(meta.len(), 6 << 30);
    assert!(
        meta.blocks() * 512 <= 64 << 10,
        "{} bytes on disk",
        meta.blocks() * 512
    );
    let mut got = [0u8; 6];
    fs::File::open(&copy)
        .unwrap()
        .read_exact_at(&mut got, 3 << 30)
        .unwrap();
    assert_eq!(&got, b"middle");

    fs::write(upper.join("workspace/dense"), vec![1u8; 2 << 20]).unwrap();
    let err = capture_tree(
        &upper,
        &tmp.path().join("bounded"),
        Shift::Keep,
        Some(1 << 20),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { limit } if limit == 1 << 20),
        "{err}"
    );
    let left: Vec<_> = fs::read_dir(tmp.path().join("bounded")).unwrap().collect();
    assert!(left.is_empty(), "a half-made layer was left: {left:?}");
}
