//! Squashing: a chain of snapshot layers merged into one layer that shows the same files
//! when it is stacked over the image, so that deep chains (each persistent session adds a
//! layer) cost one overlay lower directory instead of many.
//!
//! The merge applies the layers bottom first into a staging tree, with overlayfs's own rules:
//! a whiteout or any other non-directory replaces what is below it; an opaque directory
//! replaces the directory below it; a plain directory merges into a directory below it, and
//! over a non-directory (a whiteout included) it becomes opaque, because overlayfs stops its
//! lookup at a non-directory and so never showed what the image has there. Files are hard
//! links to the (immutable) source layers, so staging costs no copy; the staging tree is then
//! captured like a writable layer, which makes the one copy, names the result by its content
//! and renames it into place only when complete.
//!
//! Everything is made under `work` (a directory the caller names with the partial-layer
//! prefix), so a daemon killed mid-squash leaves only a directory that its next start deletes.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::xattr::{get_xattr, list_xattrs, remove_xattr, set_times, set_xattr};
use super::{Captured, Error, Shift, capture_tree};

/// The overlay mark of a directory that hides everything below it.
const OPAQUE: &str = "user.overlay.opaque";

/// Merges `layers` (topmost first, as a snapshot lists them) into one layer in
/// `work/out/<digest>`; the caller moves it into the layers directory. `work` must not exist.
pub fn squash(layers: &[PathBuf], work: &Path) -> Result<Captured, Error> {
    let fail = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Copy { path, source }
    };
    let staging = work.join("staging");
    fs::create_dir_all(&staging).map_err(fail(&staging))?;
    for layer in layers.iter().rev() {
        apply(layer, &staging)?;
    }
    // The root's times enter the digest: the top layer's make one chain one name.
    if let Some(top) = layers.first() {
        let meta = fs::symlink_metadata(top).map_err(fail(top))?;
        set_times(&staging, &meta).map_err(fail(&staging))?;
    }
    // The layers are stored already, each within its sandbox's disk; their files are linked
    // into staging and copied sparsely, so the merge writes no more than they hold.
    let out = capture_tree(&staging, &work.join("out"), Shift::Keep, None);
    super::remove_tree(&staging);
    out
}

enum Work {
    Visit(PathBuf),
    /// A directory's mode, owner and times once its children are in place.
    Finish(PathBuf, fs::Metadata),
}

/// Applies one layer onto the staging tree (the merge of the layers below it).
fn apply(layer: &Path, staging: &Path) -> Result<(), Error> {
    let fail = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Copy { path, source }
    };
    let mut stack: Vec<Work> = Vec::new();
    // The layer's root merges into the staging root; its own metadata is never seen.
    push_children(layer, Path::new(""), &mut stack)?;
    while let Some(work) = stack.pop() {
        let rel = match work {
            Work::Finish(rel, meta) => {
                let dst = staging.join(&rel);
                std::os::unix::fs::lchown(&dst, Some(meta.uid()), Some(meta.gid()))
                    .map_err(fail(&dst))?;
                fs::set_permissions(&dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
                    .map_err(fail(&dst))?;
                set_times(&dst, &meta).map_err(fail(&dst))?;
                continue;
            }
            Work::Visit(rel) => rel,
        };
        let src = layer.join(&rel);
        let dst = staging.join(&rel);
        let meta = fs::symlink_metadata(&src).map_err(fail(&src))?;
        let below = fs::symlink_metadata(&dst).ok();
        if !meta.is_dir() {
            if let Some(below) = below {
                remove(&dst, &below)?;
            }
            // Layers are never written after they are made, so a link shares them safely.
            fs::hard_link(&src, &dst).map_err(fail(&dst))?;
            continue;
        }
        let opaque = is_opaque(&src)?;
        match below {
            Some(b) if b.is_dir() && !opaque => {}
            other => {
                if let Some(b) = other.as_ref() {
                    remove(&dst, b)?;
                }
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dst)
                    .map_err(fail(&dst))?;
                if other.is_some() && !opaque {
                    // Over a whiteout or a file, overlayfs never looked further down.
                    set_xattr(&dst, OsStr::new(OPAQUE), b"y").map_err(fail(&dst))?;
                }
            }
        }
        copy_xattrs(&src, &dst)?;
        stack.push(Work::Finish(rel.clone(), meta));
        push_children(&src, &rel, &mut stack)?;
    }
    Ok(())
}

fn push_children(dir: &Path, rel: &Path, stack: &mut Vec<Work>) -> Result<(), Error> {
    let mut names: Vec<OsString> = fs::read_dir(dir)
        .and_then(|rd| rd.map(|e| e.map(|e| e.file_name())).collect())
        .map_err(|source| Error::Copy {
            path: dir.to_owned(),
            source,
        })?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    stack.extend(names.into_iter().map(|n| Work::Visit(rel.join(n))));
    Ok(())
}

fn is_opaque(dir: &Path) -> Result<bool, Error> {
    get_xattr(dir, OsStr::new(OPAQUE))
        .map(|v| v.as_deref() == Some(b"y"))
        .map_err(|source| Error::Copy {
            path: dir.to_owned(),
            source,
        })
}

/// Makes a layer directory's attributes the merged one's (overlayfs copies a directory's
/// attributes up whole, so the upper layer holds its current set: one missing there was
/// removed in that session and goes); overlay marks the merge set or the layers below had
/// (an opaque directory stays opaque under a plain one) stay.
fn copy_xattrs(src: &Path, dst: &Path) -> Result<(), Error> {
    let fail = |path: &Path| {
        let path = path.to_owned();
        move |source: io::Error| Error::Copy { path, source }
    };
    let kept = list_xattrs(src).map_err(fail(src))?;
    for name in list_xattrs(dst).map_err(fail(dst))? {
        let overlay = name.as_encoded_bytes().starts_with(b"user.overlay.")
            || name.as_encoded_bytes().starts_with(b"trusted.overlay.");
        if !overlay && !kept.contains(&name) {
            remove_xattr(dst, &name).map_err(fail(dst))?;
        }
    }
    for name in kept {
        if let Some(value) = get_xattr(src, &name).map_err(fail(src))? {
            set_xattr(dst, &name, &value).map_err(fail(dst))?;
        }
    }
    Ok(())
}

fn remove(path: &Path, meta: &fs::Metadata) -> Result<(), Error> {
    let r = if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    r.map_err(|source| Error::Copy {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mounts;

    fn whiteout(path: &Path) {
        let p = mounts::c_path(path);
        // SAFETY: a valid C path; makes an overlay whiteout (char 0:0).
        assert_eq!(unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR, 0) }, 0);
    }

    /// As root (whiteouts are devices): files, whiteouts, opaque directories, directories
    /// over whiteouts and modes come out of the merge as overlayfs would show them.
    #[test]
    fn a_squash_follows_overlay_rules() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: cannot make whiteouts");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (l1, l2, l3) = (
            tmp.path().join("l1"),
            tmp.path().join("l2"),
            tmp.path().join("l3"),
        );
        // Bottom: files and a directory.
        fs::create_dir_all(l1.join("a/b")).unwrap();
        fs::write(l1.join("a/b/keep"), b"1").unwrap();
        fs::write(l1.join("a/b/gone"), b"1").unwrap();
        fs::write(l1.join("a/file"), b"old").unwrap();
        fs::create_dir_all(l1.join("op")).unwrap();
        fs::write(l1.join("op/hidden"), b"x").unwrap();
        // Middle: deletes a file and a directory, replaces a file.
        fs::create_dir_all(l2.join("a/b")).unwrap();
        whiteout(&l2.join("a/b/gone"));
        fs::write(l2.join("a/file"), b"new").unwrap();
        fs::set_permissions(l2.join("a/file"), fs::Permissions::from_mode(0o4750)).unwrap();
        fs::create_dir_all(&l2).unwrap();
        whiteout(&l2.join("dir"));
        fs::create_dir_all(l2.join("op")).unwrap();
        set_xattr(&l2.join("op"), OsStr::new(OPAQUE), b"y").unwrap();
        fs::write(l2.join("op/only"), b"o").unwrap();
        // Top: a directory where a whiteout was, and the deleted file back.
        fs::create_dir_all(l3.join("dir")).unwrap();
        fs::write(l3.join("dir/f"), b"f").unwrap();
        fs::create_dir_all(l3.join("a/b")).unwrap();
        fs::set_permissions(l3.join("a/b"), fs::Permissions::from_mode(0o711)).unwrap();
        // Attributes of a directory: l1 sets two, l2 changes one, l3 (copied up without
        // them) removed both; `op` keeps the one l2 set.
        set_xattr(&l1.join("a"), OsStr::new("user.x"), b"1").unwrap();
        set_xattr(&l1.join("a"), OsStr::new("user.y"), b"1").unwrap();
        set_xattr(&l2.join("a"), OsStr::new("user.x"), b"2").unwrap();
        set_xattr(&l2.join("a"), OsStr::new("user.y"), b"1").unwrap();
        set_xattr(&l2.join("op"), OsStr::new("user.z"), b"z").unwrap();
        set_xattr(&l1.join("a/b"), OsStr::new("user.w"), b"w").unwrap();
        set_xattr(&l2.join("a/b"), OsStr::new("user.w"), b"w").unwrap();
        set_xattr(&l3.join("a/b"), OsStr::new("user.w"), b"w2").unwrap();

        let work = tmp.path().join(".tmp-squash");
        let got = squash(&[l3.clone(), l2.clone(), l1.clone()], &work).unwrap();
        let m = &got.path;
        assert_eq!(fs::read(m.join("a/b/keep")).unwrap(), b"1");
        let gone = fs::symlink_metadata(m.join("a/b/gone")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &gone.file_type()
        ));
        assert_eq!(fs::read(m.join("a/file")).unwrap(), b"new");
        let mode = fs::metadata(m.join("a/file")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o4750);
        assert_eq!(fs::metadata(m.join("a/b")).unwrap().mode() & 0o7777, 0o711);
        assert!(is_opaque(&m.join("dir")).unwrap(), "over a whiteout");
        assert_eq!(fs::read(m.join("dir/f")).unwrap(), b"f");
        assert!(is_opaque(&m.join("op")).unwrap());
        assert!(!m.join("op/hidden").exists());
        assert!(!is_opaque(&m.join("a")).unwrap());
        let names = |p: &Path| list_xattrs(p).unwrap();
        assert!(names(&m.join("a")).is_empty(), "removed in l3");
        let w = get_xattr(&m.join("a/b"), OsStr::new("user.w")).unwrap();
        assert_eq!(w.as_deref(), Some(&b"w2"[..]));
        let z = get_xattr(&m.join("op"), OsStr::new("user.z")).unwrap();
        assert_eq!(z.as_deref(), Some(&b"z"[..]));
        assert!(!work.join("staging").exists());
        // The same chain is the same layer.
        let again = squash(&[l3, l2, l1], &tmp.path().join(".tmp-again")).unwrap();
        assert_eq!(again.digest, got.digest);
    }
}
