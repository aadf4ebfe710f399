//! The disk, as root where it mounts: its size and limit, templates, and mounting again.

use super::*;

/// Whether the test runs as root (a disk can be mounted); CI always does.
pub(crate) fn as_root() -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "CI runs as root");
    eprintln!("not root: a disk cannot be mounted");
    false
}

#[test]
fn loop_structs_match_the_kernel_abi() {
    assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
    assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
}

#[test]
fn a_plain_directory_is_not_a_mount_point() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(!is_mount_point(tmp.path()));
    assert!(is_mount_point(Path::new("/proc")));
}

/// As root: the disk is a real filesystem of the requested size that refuses more.
#[test]
fn the_disk_holds_its_size_and_no_more() {
    if !as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let how = mount(tmp.path(), &fs_dir, 32 << 20).unwrap();
    assert!(matches!(how, LimitStatus::Enforced { .. }), "{how:?}");
    assert!(is_mount_point(&fs_dir));
    let st = nix::sys::statvfs::statvfs(&fs_dir).unwrap();
    let total = st.blocks() * st.fragment_size();
    assert!(total > 16 << 20 && total <= 32 << 20, "{total}");
    let chunk = vec![7u8; 1 << 20];
    let mut file = fs::File::create(fs_dir.join("big")).unwrap();
    let err = (0..64)
        .find_map(|_| io::Write::write_all(&mut file, &chunk).err())
        .expect("a 32 MiB disk refuses 64 MiB");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    drop(file);
    // Mounting again while mounted is a no-op; after unmounting the files are kept.
    mount(tmp.path(), &fs_dir, 32 << 20).unwrap();
    unmount(&fs_dir);
    assert!(!is_mount_point(&fs_dir));
    assert!(!fs_dir.join("big").exists());
    mount(tmp.path(), &fs_dir, 32 << 20).unwrap();
    assert!(fs_dir.join("big").exists());
    unmount(&fs_dir);
}

/// As root: a disk unmounted here while another mount namespace still holds a copy of
/// its mount is mounted again only once that copy is gone, and then shows every write
/// (a second filesystem on the image, mounted at once, showed none of them).
#[test]
fn a_disk_is_mounted_again_only_once_its_last_copy_ends() {
    use std::io::BufRead;
    use std::process::Stdio;
    if !as_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (state, fs_dir) = (tmp.path().to_owned(), tmp.path().join("fs"));
    mount(&state, &fs_dir, 32 << 20).unwrap();
    fs::create_dir(fs_dir.join("upper")).unwrap();
    fs::write(fs_dir.join("upper/file"), b"kept").unwrap();
    // A process in a copy of the host's mount namespace, made while the disk is mounted.
    let mut copy = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "echo ready; exec cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    io::BufReader::new(copy.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    unmount(&fs_dir);
    let again = {
        let (state, fs_dir) = (state.clone(), fs_dir.clone());
        std::thread::spawn(move || mount(&state, &fs_dir, 32 << 20))
    };
    let image = state.join(DISK_FILE);
    let held = wait_released(&image, Duration::from_millis(200));
    assert!(matches!(held, Err(Error::Busy { .. })), "{held:?}");
    assert!(!is_mount_point(&fs_dir), "mounted while the copy lives");
    drop(copy.stdin.take());
    copy.wait().unwrap();
    again.join().unwrap().unwrap();
    assert_eq!(fs::read(fs_dir.join("upper/file")).unwrap(), b"kept");
    unmount(&fs_dir);
}

/// As root: after the first disk of a size, the next ones are written from its template
/// (no mkfs), and each is a filesystem of its own that holds its size and no more.
#[test]
fn disks_made_from_the_template_are_separate_and_limited() {
    if !as_root() {
        return;
    }
    // A size no other test uses, so this test sees its own template appear.
    let size = 48 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("a");
    fs::create_dir(&first).unwrap();
    mount(&first, &first.join("fs"), size).unwrap();
    let template = template(size).expect("the first disk of a size leaves a template");
    assert!(template.data_bytes() > 0 && template.data_bytes() < 8 << 20);
    fs::write(first.join("fs/mine"), b"a").unwrap();

    let second = tmp.path().join("b");
    fs::create_dir(&second).unwrap();
    let fs_b = second.join("fs");
    let how = mount(&second, &fs_b, size).unwrap();
    assert!(matches!(how, LimitStatus::Enforced { .. }), "{how:?}");
    assert!(is_mount_point(&fs_b));
    // Sparse like the original: only the template's data is allocated.
    let image = fs::metadata(second.join(DISK_FILE)).unwrap();
    assert_eq!(image.len(), size);
    assert!(std::os::unix::fs::MetadataExt::blocks(&image) * 512 < 16 << 20);
    assert!(
        !fs_b.join("mine").exists(),
        "a fresh disk shows another's file"
    );
    let st = nix::sys::statvfs::statvfs(&fs_b).unwrap();
    let total = st.blocks() * st.fragment_size();
    assert!(total > 32 << 20 && total <= size, "{total}");
    let chunk = vec![7u8; 1 << 20];
    let mut file = fs::File::create(fs_b.join("big")).unwrap();
    let err = (0..96)
        .find_map(|_| io::Write::write_all(&mut file, &chunk).err())
        .expect("a 48 MiB disk refuses 96 MiB");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    drop(file);
    assert_eq!(fs::read(first.join("fs/mine")).unwrap(), b"a");
    unmount(&fs_b);
    unmount(&first.join("fs"));
    // The template made image passes a full check, journal and all.
    let fsck = Command::new("/usr/sbin/e2fsck")
        .args(["-f", "-n"])
        .arg(second.join(DISK_FILE))
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}
