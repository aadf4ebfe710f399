//! The microVM's layer formats on real ext4 images: a guest's writable disk captured into a
//! layer, and a layer made into the read-only disk a guest stacks. They need root (mknod of
//! whiteouts, `trusted.*` attributes, a loop mount) and e2fsprogs; under CI=true a missing
//! piece fails the test instead of skipping it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use rustix::fs::{FileType, Mode, XattrFlags};

use super::*;

fn layer_disks(layers: &[PathBuf]) -> Result<Vec<PathBuf>, Error> {
    layer_disks_within(layers, MAX_LAYER_DISKS)
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setxattr {name}: {e}"));
}

fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).ok()?;
    Some(buf[..n].to_vec())
}

/// A character device 0:0: overlayfs's whiteout.
fn whiteout(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap_or_else(|e| panic!("mknod: {e}"));
}

/// Whether this host can run the tests; under CI it must.
fn can_run() -> bool {
    let ok = nix::unistd::geteuid().is_root()
        && Command::new("mkfs.ext4").arg("-V").output().is_ok()
        && Command::new("debugfs").arg("-V").output().is_ok();
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "CI=true: these tests need root and e2fsprogs"
    );
    ok
}

fn debugfs(disk: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", request])
        .arg(disk)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A guest's upper directory with a file, a deletion, an opaque directory and overlayfs's
/// bookkeeping, as root's overlay in a microVM writes it.
fn guest_upper(upper: &Path) {
    std::fs::create_dir_all(upper.join("etc")).unwrap();
    std::fs::write(upper.join("etc/motd"), b"hello from the guest\n").unwrap();
    std::fs::set_permissions(
        upper.join("etc/motd"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::lchown(upper.join("etc/motd"), Some(1000), Some(1000)).unwrap();
    set_xattr(&upper.join("etc"), "trusted.overlay.origin", b"\0\xfb");
    whiteout(&upper.join("etc/issue"));
    std::fs::create_dir(upper.join("opt")).unwrap();
    set_xattr(&upper.join("opt"), "trusted.overlay.opaque", b"y");
    std::os::unix::fs::symlink("/etc/motd", upper.join("motd-link")).unwrap();
}

/// A guest's writable disk (journaled ext4 with `upper` and `work`), captured as a layer:
/// contents, modes and owners, the whiteout and the opaque mark in the layers' `user.overlay`
/// form, overlayfs's other bookkeeping dropped; the same disk captured twice is one layer.
#[test]
fn a_guest_disk_becomes_a_layer_in_the_namespace_format() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    guest_upper(&tree.join("upper"));
    std::fs::create_dir_all(tree.join("work")).unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let disk = state.join("layer.ext4");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&tree)
            .arg(&disk),
        |c| c == 0,
    )
    .unwrap();

    let layers = tmp.path().join("layers");
    let captured = DiskCopy::take(&state).unwrap().capture(&layers).unwrap();
    let layer = layers.join(&captured.digest);
    assert_eq!(captured.size_bytes, 21);
    assert_eq!(
        std::fs::read(layer.join("etc/motd")).unwrap(),
        b"hello from the guest\n"
    );
    let motd = std::fs::metadata(layer.join("etc/motd")).unwrap();
    assert_eq!(
        (motd.mode() & 0o7777, motd.uid(), motd.gid()),
        (0o640, 1000, 1000)
    );
    let issue = std::fs::symlink_metadata(layer.join("etc/issue")).unwrap();
    assert_eq!(
        (FileType::from_raw_mode(issue.mode()), issue.rdev()),
        (FileType::CharacterDevice, 0)
    );
    assert_eq!(
        get_xattr(&layer.join("opt"), "user.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(
        get_xattr(&layer.join("opt"), "trusted.overlay.opaque"),
        None
    );
    assert_eq!(get_xattr(&layer.join("etc"), "user.overlay.origin"), None);
    assert_eq!(
        get_xattr(&layer.join("etc"), "trusted.overlay.origin"),
        None
    );
    assert_eq!(
        std::fs::read_link(layer.join("motd-link")).unwrap(),
        Path::new("/etc/motd")
    );
    // Nothing of the capture is left in the sandbox's directory.
    let left: Vec<_> = std::fs::read_dir(&state).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "{left:?}");

    let again = DiskCopy::take(&state).unwrap().capture(&layers).unwrap();
    assert_eq!(again, captured);
}

/// A layer becomes a read-only ext4 disk with the same entries (the whiteout, the opaque mark,
/// modes and owners), made once per digest; disks of deleted layers go.
#[test]
fn a_layer_becomes_a_cached_read_only_disk() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layers = tmp.path().join("layers");
    let top = layers.join("aa11");
    std::fs::create_dir_all(top.join("etc")).unwrap();
    std::fs::write(top.join("etc/motd"), b"from a snapshot\n").unwrap();
    std::fs::set_permissions(top.join("etc/motd"), std::fs::Permissions::from_mode(0o604)).unwrap();
    std::os::unix::fs::lchown(top.join("etc/motd"), Some(1000), Some(1000)).unwrap();
    whiteout(&top.join("etc/issue"));
    std::fs::create_dir(top.join("opt")).unwrap();
    set_xattr(&top.join("opt"), "user.overlay.opaque", b"y");
    let bottom = layers.join("bb22");
    std::fs::create_dir_all(&bottom).unwrap();

    let disks = layer_disks(&[top.clone(), bottom.clone()]).unwrap();
    let cache = tmp.path().join("layer-disks");
    assert_eq!(disks, [cache.join("aa11.ext4"), cache.join("bb22.ext4")]);
    let disk = &disks[0];
    assert_eq!(debugfs(disk, "cat /etc/motd"), "from a snapshot\n");
    let stat = debugfs(disk, "stat /etc/motd");
    assert!(stat.contains("Mode:  0604"), "{stat}");
    assert!(stat.contains("User:  1000   Group:  1000"), "{stat}");
    let stat = debugfs(disk, "stat /etc/issue");
    assert!(stat.contains("Type: character special"), "{stat}");
    let ea = debugfs(disk, "ea_get /opt user.overlay.opaque");
    assert!(ea.contains("user.overlay.opaque (1) = \"y\""), "{ea}");
    // Only the layer's own entries: no `lost+found` of mkfs's (a mount would show it).
    let root = debugfs(disk, "ls /");
    let names: Vec<&str> = (root.split_whitespace())
        .filter(|w| !w.starts_with('(') && w.parse::<u64>().is_err())
        .collect();
    assert_eq!(names, [".", "..", "etc", "opt"], "{root}");

    // Cached: the second launch finds the same file, untouched.
    let made = std::fs::metadata(disk).unwrap().modified().unwrap();
    assert_eq!(layer_disks(std::slice::from_ref(&top)).unwrap()[0], *disk);
    assert_eq!(std::fs::metadata(disk).unwrap().modified().unwrap(), made);

    // The bottom layer's snapshot was deleted: its disk goes with the next launch.
    std::fs::remove_dir(&bottom).unwrap();
    layer_disks(&[top]).unwrap();
    assert!(!cache.join("bb22.ext4").exists());
    assert!(cache.join("aa11.ext4").exists());
}

#[test]
fn a_chain_longer_than_the_vm_has_devices_merges_its_bottom_into_one_disk() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layers_dir = tmp.path().join("layers");
    // Topmost first, as a snapshot lists its chain; each layer adds its own file.
    let chain: Vec<PathBuf> = (0..MAX_LAYER_DISKS + 2)
        .map(|i| {
            let layer = layers_dir.join(format!("{i:02x}"));
            std::fs::create_dir_all(&layer).unwrap();
            std::fs::write(layer.join(format!("f{i}")), format!("{i}\n")).unwrap();
            layer
        })
        .collect();
    let bottom = chain.len() - 1;
    // Below the merge line: the lowest layer's file is replaced by the one above it, and the
    // next one deletes a file of the image (a whiteout that must survive the merge).
    std::fs::write(chain[bottom].join("shared"), b"old\n").unwrap();
    std::fs::write(chain[bottom - 1].join("shared"), b"new\n").unwrap();
    whiteout(&chain[bottom - 2].join("from-image"));

    let disks = layer_disks(&chain).unwrap();
    let cache = tmp.path().join("layer-disks");
    assert_eq!(disks.len(), MAX_LAYER_DISKS);
    for (i, disk) in disks[..MAX_LAYER_DISKS - 1].iter().enumerate() {
        assert_eq!(*disk, cache.join(format!("{i:02x}.ext4")));
    }
    let merged = &disks[MAX_LAYER_DISKS - 1];
    let name = merged.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("chain-") && name.ends_with(".ext4"),
        "{name}"
    );
    for i in MAX_LAYER_DISKS - 1..chain.len() {
        assert_eq!(debugfs(merged, &format!("cat /f{i}")), format!("{i}\n"));
    }
    assert_eq!(debugfs(merged, "cat /shared"), "new\n");
    let stat = debugfs(merged, "stat /from-image");
    assert!(stat.contains("Type: character special"), "{stat}");
    // The top layers' files are not in it.
    assert!(!debugfs(merged, "ls /").contains("f0 "));

    // Cached: the same chain finds the same disk, untouched.
    let made = std::fs::metadata(merged).unwrap().modified().unwrap();
    assert_eq!(layer_disks(&chain).unwrap(), disks);
    assert_eq!(std::fs::metadata(merged).unwrap().modified().unwrap(), made);

    // Beside snapshot mounts the chain has fewer disks: more of it is merged, the same way.
    let within = layer_disks_within(&chain, 2).unwrap();
    assert_eq!(within[0], disks[0]);
    assert_eq!(debugfs(&within[1], "cat /shared"), "new\n");
    assert_eq!(debugfs(&within[1], "cat /f1"), "1\n");
    // A mount's layers are one disk: its layer's own, or its layers merged.
    assert_eq!(mount_disk(&chain[..1]).unwrap(), disks[0]);
    assert_eq!(mount_disk(&chain[1..]).unwrap(), within[1]);
    assert!(mount_disk(&[]).is_err());

    // A merged layer's snapshot was deleted: the chain's disk goes with the next launch.
    std::fs::remove_dir_all(&chain[bottom]).unwrap();
    layer_disks(&chain[..2]).unwrap();
    assert!(!merged.exists());
    assert!(!merged.with_extension("layers").exists());
}
