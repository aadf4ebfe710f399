//! A new image's root filesystem made from its parent's without copying file data: every
//! directory is made anew (its mode, owner, times and extended attributes kept) and every
//! other entry is hard-linked. A layer applied on top ([`crate::unpack::apply`]) replaces the
//! entries it writes (unlinks them first) and never writes into an existing file, so the
//! parent's files are never changed through the links. Where a link cannot be made (another
//! filesystem), the entry is copied.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// Makes `to` (which must not exist) a copy of the tree `from`, sharing its files by hard
/// links. Returns the bytes of regular-file data the copy holds.
pub fn link_copy(from: &Path, to: &Path) -> Result<u64, Error> {
    let mut bytes = 0u64;
    let mut dirs: Vec<(PathBuf, fs::Metadata)> = Vec::new();
    let mut stack = vec![(from.to_owned(), to.to_owned())];
    while let Some((src, dst)) = stack.pop() {
        let meta = fs::symlink_metadata(&src)
            .map_err(Error::io(format!("Cannot read {}", src.display())))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dst)
            .map_err(Error::io(format!("Cannot make {}", dst.display())))?;
        copy_xattrs(&src, &dst);
        dirs.push((dst.clone(), meta));
        let entries =
            fs::read_dir(&src).map_err(Error::io(format!("Cannot list {}", src.display())))?;
        for entry in entries {
            let entry = entry.map_err(Error::io(format!("Cannot list {}", src.display())))?;
            let (s, d) = (entry.path(), dst.join(entry.file_name()));
            let m = fs::symlink_metadata(&s)
                .map_err(Error::io(format!("Cannot read {}", s.display())))?;
            if m.is_dir() {
                stack.push((s, d));
                continue;
            }
            if m.is_file() {
                bytes += m.len();
            }
            if fs::hard_link(&s, &d).is_err() {
                copy_entry(&s, &d, &m)?;
            }
        }
    }
    // Owners, modes and times last, deepest first: a read-only directory is still filled.
    for (dir, meta) in dirs.iter().rev() {
        let shown = || format!("Cannot set the owner and mode of {}", dir.display());
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::lchown(dir, Some(meta.uid()), Some(meta.gid()))
                .map_err(Error::io(shown()))?;
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(Error::io(shown()))?;
        let mtime = rustix::fs::Timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec() as _,
        };
        let times = rustix::fs::Timestamps {
            last_access: mtime,
            last_modification: mtime,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            dir,
            &times,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| Error::Io {
            what: shown(),
            source: e.into(),
        })?;
    }
    Ok(bytes)
}

/// Copies an entry that could not be linked: a regular file's data, a symbolic link; any
/// other kind (a device, a socket) is left out.
fn copy_entry(s: &Path, d: &Path, m: &fs::Metadata) -> Result<(), Error> {
    let what = || format!("Cannot copy {}", s.display());
    if m.file_type().is_symlink() {
        let target = fs::read_link(s).map_err(Error::io(what()))?;
        std::os::unix::fs::symlink(target, d).map_err(Error::io(what()))?;
    } else if m.is_file() {
        fs::copy(s, d).map_err(Error::io(what()))?;
        fs::set_permissions(d, fs::Permissions::from_mode(m.mode() & 0o7777))
            .map_err(Error::io(what()))?;
    } else {
        return Ok(());
    }
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::lchown(d, Some(m.uid()), Some(m.gid())).map_err(Error::io(what()))?;
    }
    Ok(())
}

/// A directory's extended attributes (those the filesystem lets us copy).
fn copy_xattrs(src: &Path, dst: &Path) {
    let mut names = vec![0u8; 64 << 10];
    let Ok(n) = rustix::fs::llistxattr(src, &mut names[..]) else {
        return;
    };
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let mut value = vec![0u8; 64 << 10];
        if let Ok(len) = rustix::fs::lgetxattr(src, name, &mut value[..]) {
            let _ =
                rustix::fs::lsetxattr(dst, name, &value[..len], rustix::fs::XattrFlags::empty());
        }
    }
}

/// Removes a tree made here (never following a link out of it).
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_files_and_makes_directories() {
        let t = tempfile::tempdir().unwrap();
        let from = t.path().join("from");
        fs::create_dir_all(from.join("a/b")).unwrap();
        fs::write(from.join("a/b/f"), b"data").unwrap();
        std::os::unix::fs::symlink("a/b/f", from.join("l")).unwrap();
        fs::set_permissions(from.join("a"), fs::Permissions::from_mode(0o750)).unwrap();
        let to = t.path().join("to");
        assert_eq!(link_copy(&from, &to).unwrap(), 4);
        assert_eq!(fs::read(to.join("a/b/f")).unwrap(), b"data");
        assert_eq!(fs::read_link(to.join("l")).unwrap(), Path::new("a/b/f"));
        let (a, b) = (
            fs::metadata(from.join("a/b/f")).unwrap(),
            fs::metadata(to.join("a/b/f")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino());
        assert_eq!(fs::metadata(to.join("a")).unwrap().mode() & 0o7777, 0o750);
        assert_ne!(
            fs::metadata(from.join("a")).unwrap().ino(),
            fs::metadata(to.join("a")).unwrap().ino()
        );
    }
}
