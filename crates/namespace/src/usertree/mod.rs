//! Image trees a rootless sandbox can use.
//!
//! Images are built by root, so their `rootfs/` tree belongs to host root (and host uid 1000
//! for `/home/belljar`). In an ordinary user's user namespace those owners are unmapped: they
//! show as `nobody`, `sudo` loses its setuid owner, and overlayfs cannot copy such a file up
//! when the sandbox writes it (the copy would need a `chown` to an unmapped id), so `/etc` and
//! the `belljar` user's home would be read-only. Root-only files (`/etc/shadow`) cannot even
//! be read by the user. idmapped mounts, which fix this as root, need `CAP_SYS_ADMIN` on the
//! host.
//!
//! So each user gets a copy of each image whose owners are the sandbox's own ids: the image's
//! `rootfs.ext4` (world-readable, the microVM disk of the same tree) is read with a userspace
//! ext4 reader by a process that is root of a user namespace with the user's mapping, and
//! every file is created and `chown`ed to the id stored in the image (0 becomes the user,
//! 1000 the user's subordinate id 100999, and so on). The copy is made once per image digest
//! and mapping, under a lock, and reused by every sandbox of that user. A tree that already
//! belongs to the user (built rootless, or a test's fixture) is used as it is.
//!
//! Hard links stay links, and file capabilities, `user.*` attributes and POSIX ACLs are kept
//! (see [`debugfs`]: set inside the user namespace, a capability holds in this user's
//! sandboxes). Not carried over: device nodes (the sandbox gets its own `/dev`), `trusted.*`
//! and LSM attributes; nor any of those without `debugfs` (e2fsprogs, installed on every
//! Debian system), where the slower `ext4_view` copy, which sees neither, is used.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::Uid;

mod debugfs;

use crate::idmap::{self, IdMap};

/// Errors preparing a rootless image tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tree is not the user's and there is no ext4 image to copy it from.
    #[error("The image tree {} belongs to another user and {} is missing", tree.display(), ext4.display())]
    NoImage { tree: PathBuf, ext4: PathBuf },
    #[error(transparent)]
    UserNamespace(#[from] idmap::Error),
    #[error("Cannot prepare {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The copy inside the user namespace failed (`reason`: the child's [`UnpackError`]
    /// with its causes, or how the child ended).
    #[error("Cannot unpack {} for this user: {reason}", ext4.display())]
    Unpack { ext4: PathBuf, reason: String },
}

/// Why copying an image's tree failed, in the child that copies it; its parent gets the text
/// of it, causes included, as [`Error::Unpack`]'s reason.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// A path of the image cannot be read.
    #[error("{path} in the image")]
    Image {
        path: String,
        #[source]
        source: ext4_view::Ext4Error,
    },
    /// A file of the copy cannot be made or changed.
    #[error("{}", path.display())]
    Copy {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `debugfs` cannot run or failed (`detail`: what it printed).
    #[error("{} failed: {detail}", tool.display())]
    Debugfs { tool: PathBuf, detail: String },
    /// An extended attribute of the image cannot be set on the copy.
    #[error("cannot set {name} on {}", path.display())]
    Attribute {
        path: PathBuf,
        name: String,
        #[source]
        source: io::Error,
    },
    /// A path or attribute name that `debugfs`'s command parser cannot take.
    #[error("{0}: a name debugfs cannot take")]
    Unquotable(String),
    /// `debugfs` left out a file of the image.
    #[error("debugfs did not copy {0}")]
    Missed(String),
    /// The child could not become root of the user namespace.
    #[error("cannot become root of the user namespace")]
    Join(#[source] io::Error),
}

/// An [`UnpackError::Copy`] of `path`.
fn copy_err(path: &Path) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Copy {
        path: path.to_owned(),
        source,
    }
}

/// An [`UnpackError::Image`] of the image's `path`.
fn image_err(path: &ext4_view::PathBuf) -> impl FnOnce(ext4_view::Ext4Error) -> UnpackError + '_ {
    move |source| UnpackError::Image {
        path: shown(path),
        source,
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// The tree of `image_dir` (`rootfs/`, `rootfs.ext4`) that this user's sandboxes use as their
/// image layer: `image_dir/rootfs` when it is the user's, else a copy under `cache`.
pub fn user_tree(image_dir: &Path, cache: &Path) -> Result<PathBuf, Error> {
    let tree = image_dir.join("rootfs");
    let me = Uid::current().as_raw();
    if fs::metadata(&tree).is_ok_and(|m| m.uid() == me) {
        return Ok(tree);
    }
    let ext4 = image_dir.join("rootfs.ext4");
    if !ext4.is_file() {
        return Err(Error::NoImage { tree, ext4 });
    }
    let map = IdMap::rootless()?;
    // The digest directory (`current` is a link to it) names the image's content; the
    // mapping is part of the key because the copy's host owners depend on it.
    let real = fs::canonicalize(image_dir).map_err(io_err(image_dir))?;
    let digest = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = real
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = format!(
        "{name}-{digest}-{}-{}",
        map.host_uid(1).unwrap_or(0),
        map.gids.get(1).map_or(0, |e| e.outside)
    );
    let done = cache.join(&key);
    let out = done.join("rootfs");
    if out.is_dir() {
        return Ok(out);
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache)
        .map_err(io_err(cache))?;
    let lock_path = cache.join(".lock");
    let lock = fs::File::create(&lock_path).map_err(io_err(&lock_path))?;
    // SAFETY: flock on an fd we own; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } < 0 {
        return Err(io_err(&lock_path)(io::Error::last_os_error()));
    }
    if out.is_dir() {
        // Another daemon (or a test) made it while this one waited.
        return Ok(out);
    }
    let partial = cache.join(format!("{key}.partial"));
    if partial.exists() {
        crate::teardown::remove_in_namespace(&partial).map_err(|e| Error::Unpack {
            ext4: ext4.clone(),
            reason: format!("cannot remove the half-made {}: {e}", partial.display()),
        })?;
    }
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&partial)
        .map_err(io_err(&partial))?;
    in_namespace(&map, &ext4, &partial.join("rootfs"))?;
    fs::rename(&partial, &done).map_err(io_err(&done))?;
    Ok(out)
}

/// Runs [`unpack`] in a forked child that is root of a user namespace with `map`.
fn in_namespace(map: &IdMap, ext4: &Path, dest: &Path) -> Result<(), Error> {
    let userns = map.create_namespace()?;
    let unpack_err = |reason: String| Error::Unpack {
        ext4: ext4.to_owned(),
        reason,
    };
    let (err_r, err_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| unpack_err(e.to_string()))?;
    // SAFETY: the child joins the namespace, unpacks and exits without returning; glibc's
    // malloc is usable after fork (its locks are taken around fork).
    match unsafe { nix::unistd::fork() }.map_err(|e| unpack_err(e.to_string()))? {
        nix::unistd::ForkResult::Child => {
            drop(err_r);
            // SAFETY: plain system calls on an fd we own.
            let joined = unsafe {
                libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) == 0
                    && libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(0, 0, 0) == 0
                    && libc::setresuid(0, 0, 0) == 0
            };
            let result = if joined {
                unpack(ext4, dest)
            } else {
                Err(UnpackError::Join(io::Error::last_os_error()))
            };
            let code = match result {
                Ok(()) => 0,
                Err(e) => {
                    let text = crate::error_chain(&e);
                    let _ = fs::File::from(err_w).write_all(text.as_bytes());
                    1
                }
            };
            // SAFETY: `_exit` never returns and skips the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(err_w);
            let mut text = String::new();
            let _ = fs::File::from(err_r).read_to_string(&mut text);
            let status = nix::sys::wait::waitpid(child, None);
            match status {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                other => Err(unpack_err(if text.is_empty() {
                    format!("the unpacking process ended with {other:?}")
                } else {
                    text
                })),
            }
        }
    }
}

/// Copies the ext4 image's tree to `dest` with the image's owners, modes and times. Runs as
/// root of the sandbox's user namespace, so the image's ids are this namespace's ids.
///
/// `debugfs rdump` (e2fsprogs, on every Debian system) copies the data about seven times
/// faster than reading it through `ext4_view`, which matters under emulation (the L1 guest of
/// the test harness), but its `chown` after `chmod` drops setuid, setgid and sticky bits; a
/// walk of the image's metadata puts those back and checks that every file arrived. Without
/// `debugfs` the tree is copied through `ext4_view` alone.
pub fn unpack(ext4: &Path, dest: &Path) -> Result<(), UnpackError> {
    let root = ext4_view::PathBuf::new("/");
    let fs = ext4_view::Ext4::load_from_path(ext4).map_err(image_err(&root))?;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dest)
        .map_err(copy_err(dest))?;
    let meta = fs.metadata(&root).map_err(image_err(&root))?;
    match debugfs::debugfs() {
        Some(tool) => {
            debugfs::rdump(&tool, ext4, dest)?;
            let _ = fs::remove_dir_all(dest.join("lost+found"));
            fix_modes(&fs, &root, dest)?;
            let scratch = dest.with_file_name(".unpack-scratch");
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&scratch)
                .map_err(copy_err(&scratch))?;
            let kept = keep_links_and_xattrs(&fs, &tool, ext4, dest, &scratch);
            let _ = fs::remove_dir_all(&scratch);
            kept?;
        }
        None => copy_dir(&fs, &root, dest)?,
    }
    finish(dest, &meta, false)
}

/// What `rdump` lost: hard links (the directories they are in get their times back) and
/// extended attributes. After [`fix_modes`]: a `chmod` keeps a file capability, a `chown`
/// would drop it.
fn keep_links_and_xattrs(
    fs: &ext4_view::Ext4,
    tool: &Path,
    ext4: &Path,
    dest: &Path,
    scratch: &Path,
) -> Result<(), UnpackError> {
    let entries = debugfs::list(tool, ext4, scratch)?;
    for dir in debugfs::relink(&entries, dest)? {
        let mut image_path = b"/".to_vec();
        image_path.extend_from_slice(dir.as_os_str().as_bytes());
        let image_path = ext4_view::PathBuf::try_from(image_path)
            .map_err(|_| UnpackError::Unquotable(dir.display().to_string()))?;
        let meta = fs.metadata(&image_path).map_err(image_err(&image_path))?;
        finish(&dest.join(&dir), &meta, false)?;
    }
    debugfs::copy_xattrs(tool, ext4, &entries, dest, scratch)?;
    Ok(())
}

/// What a walk over the image does with one entry.
enum Visit {
    /// Nothing more (a device, FIFO or socket the copy leaves out).
    Skip,
    /// Done with it: `after` runs on it.
    Visited,
    /// A directory: its entries are walked, then `after` runs on it.
    Descend,
}

/// Walks the image below `src` (its `.`, `..` and the top `lost+found` aside): `visit` sees
/// each entry's path in the image, its place under `dest` and its metadata; `after` runs on a
/// visited entry once everything below it is done (so a directory's times are set last).
fn walk_image(
    fs: &ext4_view::Ext4,
    src: &ext4_view::PathBuf,
    dest: &Path,
    top: bool,
    visit: &mut dyn FnMut(
        &ext4_view::PathBuf,
        &Path,
        &ext4_view::Metadata,
    ) -> Result<Visit, UnpackError>,
    after: &mut dyn FnMut(&Path, &ext4_view::Metadata) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    let entries = fs.read_dir(src).map_err(image_err(src))?;
    for entry in entries {
        let entry = entry.map_err(image_err(src))?;
        let name = entry.file_name();
        let bytes: &[u8] = name.as_ref();
        if bytes == b"." || bytes == b".." || (top && bytes == b"lost+found") {
            continue;
        }
        let from = entry.path();
        let to = dest.join(OsStr::from_bytes(bytes));
        let meta = entry.metadata().map_err(image_err(&from))?;
        match visit(&from, &to, &meta)? {
            Visit::Skip => continue,
            Visit::Visited => {}
            Visit::Descend => walk_image(fs, &from, &to, false, visit, after)?,
        }
        after(&to, &meta)?;
    }
    Ok(())
}

fn shown(p: &ext4_view::PathBuf) -> String {
    String::from_utf8_lossy(p.as_ref()).into_owned()
}

/// After `rdump`: every directory, file and link of the image exists in `dest`, and modes
/// with setuid, setgid or sticky bits are set again.
fn fix_modes(
    fs: &ext4_view::Ext4,
    src: &ext4_view::PathBuf,
    dest: &Path,
) -> Result<(), UnpackError> {
    let mut visit = |from: &ext4_view::PathBuf, to: &Path, meta: &ext4_view::Metadata| {
        let ft = meta.file_type();
        if !(ft.is_dir() || ft.is_regular_file() || ft.is_symlink()) {
            return Ok(Visit::Skip);
        }
        if fs::symlink_metadata(to).is_err() {
            return Err(UnpackError::Missed(shown(from)));
        }
        let mode = u32::from(meta.mode()) & 0o7777;
        if !ft.is_symlink() && mode & 0o7000 != 0 {
            fs::set_permissions(to, fs::Permissions::from_mode(mode)).map_err(copy_err(to))?;
        }
        Ok(if ft.is_dir() {
            Visit::Descend
        } else {
            Visit::Visited
        })
    };
    walk_image(fs, src, dest, true, &mut visit, &mut |_, _| Ok(()))
}

/// Copies the image below `src` into `dest` file by file (without debugfs): directories,
/// regular files and symbolic links, each with its owner, mode and times.
fn copy_dir(
    fs: &ext4_view::Ext4,
    src: &ext4_view::PathBuf,
    dest: &Path,
) -> Result<(), UnpackError> {
    let mut visit = |from: &ext4_view::PathBuf, to: &Path, meta: &ext4_view::Metadata| {
        let what = |e: io::Error| copy_err(to)(e);
        let ft = meta.file_type();
        if ft.is_dir() {
            fs::DirBuilder::new().mode(0o700).create(to).map_err(what)?;
            Ok(Visit::Descend)
        } else if ft.is_regular_file() {
            let mut file = fs.open(from).map_err(image_err(from))?;
            let mut out = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(to)
                .map_err(what)?;
            io::copy(&mut file, &mut out).map_err(what)?;
            Ok(Visit::Visited)
        } else if ft.is_symlink() {
            let target = fs.read_link(from).map_err(image_err(from))?;
            std::os::unix::fs::symlink(OsStr::from_bytes(target.as_ref()), to).map_err(what)?;
            Ok(Visit::Visited)
        } else {
            // Devices, FIFOs and sockets: the sandbox mounts its own /dev and /run.
            Ok(Visit::Skip)
        }
    };
    let mut after =
        |to: &Path, meta: &ext4_view::Metadata| finish(to, meta, meta.file_type().is_symlink());
    walk_image(fs, src, dest, true, &mut visit, &mut after)
}

/// Owner, then mode (a `chown` clears setuid bits, so the mode comes after), then times.
fn finish(path: &Path, meta: &ext4_view::Metadata, symlink: bool) -> Result<(), UnpackError> {
    let what = |e: io::Error| copy_err(path)(e);
    match std::os::unix::fs::lchown(path, Some(meta.uid()), Some(meta.gid())) {
        Ok(()) => {}
        // An id outside the sandbox's 65536 stays the namespace root's.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) => return Err(what(e)),
    }
    if !symlink {
        let mode = u32::from(meta.mode()) & 0o7777;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(what)?;
    }
    let m = meta.modified();
    let time = nix::sys::time::TimeSpec::new(m.seconds(), i64::from(m.nanoseconds()));
    nix::sys::stat::utimensat(
        None,
        path,
        &time,
        &time,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| what(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `cap_net_raw+ep` as `setcap` writes it (version 2, no namespace root).
    const NET_RAW_V2: [u8; 20] = [
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    /// An ext4 image of a small tree with several owners, a setuid file, a symlink, a file
    /// hard-linked under two names (as `perl` and `perl5.40.1` are in `base`), a file
    /// capability and a user attribute, made with `mkfs.ext4 -d` as the image build does.
    fn image(dir: &Path) -> (PathBuf, PathBuf) {
        let src = dir.join("src");
        fs::create_dir_all(src.join("home/belljar")).unwrap();
        fs::create_dir_all(src.join("usr/bin")).unwrap();
        fs::create_dir_all(src.join("usr/lib")).unwrap();
        fs::write(src.join("home/belljar/.profile"), "hi\n").unwrap();
        std::os::unix::fs::chown(src.join("home/belljar"), Some(1000), Some(1000)).unwrap();
        std::os::unix::fs::chown(src.join("home/belljar/.profile"), Some(1000), Some(1000))
            .unwrap();
        fs::write(src.join("usr/bin/sudo"), vec![7u8; 70_000]).unwrap();
        fs::create_dir(src.join("tmp")).unwrap();
        fs::set_permissions(src.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
        fs::set_permissions(src.join("usr/bin/sudo"), fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("usr/bin", src.join("bin")).unwrap();
        fs::write(src.join("usr/bin/perl"), vec![9u8; 50_000]).unwrap();
        fs::hard_link(src.join("usr/bin/perl"), src.join("usr/bin/perl5.40.1")).unwrap();
        fs::hard_link(src.join("usr/bin/perl"), src.join("usr/lib/perl")).unwrap();
        fs::write(src.join("usr/bin/ping"), "ping").unwrap();
        let xattr = crate::layer::xattr::set_xattr;
        xattr(
            &src.join("usr/bin/ping"),
            OsStr::new("security.capability"),
            &NET_RAW_V2,
        )
        .unwrap();
        xattr(
            &src.join("home/belljar/.profile"),
            OsStr::new("user.note"),
            b"kept",
        )
        .unwrap();
        let image = dir.join("rootfs.ext4");
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&src)
            .arg(&image)
            .arg("16M")
            .status()
            .unwrap();
        assert!(made.success());
        (src, image)
    }

    /// Unpacked as root (the ids then need no namespace): owners, modes, contents, links and
    /// times come back, and through debugfs also hard links and attributes (`rdump` alone
    /// wrote each name as a file of its own and dropped the capability).
    #[test]
    fn unpack_keeps_owners_modes_and_links() {
        if !Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: skipped");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (src, image) = image(tmp.path());
        let dest = tmp.path().join("out");
        unpack(&image, &dest).unwrap();
        check_tree(&src, &dest);
        assert!(
            debugfs::debugfs().is_some(),
            "e2fsprogs' debugfs is missing"
        );
        let cap = check_links_and_attributes(&src, &dest);
        assert_eq!(cap, NET_RAW_V2);
        assert!(!tmp.path().join(".unpack-scratch").exists());
        // Through ext4_view alone (no debugfs): the same tree, without links or attributes.
        let copied = tmp.path().join("copied");
        fs::create_dir(&copied).unwrap();
        let fs = ext4_view::Ext4::load_from_path(&image).unwrap();
        copy_dir(&fs, &ext4_view::PathBuf::new("/"), &copied).unwrap();
        check_tree(&src, &copied);
    }

    /// As a rootless daemon unpacks: root of a user namespace whose root is host uid `base`.
    /// The owners are shifted, the links kept, and the capability is recorded for that root
    /// (version 3 with `rootid` = `base`), so it holds in the user's sandboxes and nowhere
    /// else. (Root makes the namespace here; a user's is made through `newuidmap`.)
    #[test]
    fn unpack_in_a_user_namespace_keeps_the_capability_for_its_root() {
        if !Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: skipped");
            return;
        }
        let base = 1_700_000;
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let (src, image) = image(tmp.path());
        let parent = tmp.path().join("user");
        fs::create_dir(&parent).unwrap();
        std::os::unix::fs::chown(&parent, Some(base), Some(base)).unwrap();
        let dest = parent.join("rootfs");
        in_namespace(&IdMap::shifted(base), &image, &dest).unwrap();
        let meta = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap();
        assert_eq!(meta("usr/bin/sudo").uid(), base);
        assert_eq!(meta("usr/bin/sudo").mode() & 0o7777, 0o4755);
        assert_eq!(meta("home/belljar/.profile").uid(), base + 1000);
        let cap = check_links_and_attributes(&src, &dest);
        assert_eq!(cap.len(), 24, "not a version 3 capability: {cap:?}");
        assert_eq!(&cap[..4], &[1, 0, 0, 3], "{cap:?}");
        assert_eq!(&cap[4..20], &NET_RAW_V2[4..20], "{cap:?}");
        assert_eq!(cap[20..24], base.to_le_bytes(), "{cap:?}");
    }

    /// The three names of `perl` are one file, the directories keep their times, and the
    /// user attribute is back; returns `ping`'s capability as the host reads it.
    fn check_links_and_attributes(src: &Path, dest: &Path) -> Vec<u8> {
        let meta = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap();
        let perl = meta("usr/bin/perl");
        assert_eq!(perl.nlink(), 3);
        for other in ["usr/bin/perl5.40.1", "usr/lib/perl"] {
            assert_eq!(meta(other).ino(), perl.ino(), "{other} is not a link");
        }
        for dir in ["usr/bin", "usr/lib"] {
            let want = fs::metadata(src.join(dir)).unwrap().mtime();
            assert_eq!(meta(dir).mtime(), want, "{dir}'s time");
        }
        let get = |p: &str, n: &str| {
            crate::layer::xattr::get_xattr(&dest.join(p), OsStr::new(n))
                .unwrap()
                .unwrap_or_else(|| panic!("no {n} on {p}"))
        };
        assert_eq!(get("home/belljar/.profile", "user.note"), b"kept");
        get("usr/bin/ping", "security.capability")
    }

    fn check_tree(src: &Path, dest: &Path) {
        let meta = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap();
        assert_eq!(meta("home/belljar/.profile").uid(), 1000);
        assert_eq!(meta("home/belljar").gid(), 1000);
        assert_eq!(meta("usr/bin/sudo").uid(), 0);
        assert_eq!(meta("usr/bin/sudo").mode() & 0o7777, 0o4755);
        assert_eq!(meta("tmp").mode() & 0o7777, 0o1777);
        assert_eq!(fs::read(dest.join("usr/bin/sudo")).unwrap().len(), 70_000);
        assert_eq!(
            fs::read_link(dest.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        assert!(!dest.join("lost+found").exists());
        assert_eq!(
            meta("home/belljar/.profile").mtime(),
            fs::metadata(src.join("home/belljar/.profile"))
                .unwrap()
                .mtime()
        );
    }

    #[test]
    fn a_tree_of_the_user_is_used_as_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("rootfs")).unwrap();
        let got = user_tree(tmp.path(), &tmp.path().join("cache")).unwrap();
        assert_eq!(got, tmp.path().join("rootfs"));
    }
}
