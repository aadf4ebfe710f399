//! What differs between two stacks of layers: two snapshots, or a snapshot and a sandbox's
//! current files (its writable layer on top of its snapshot layers), over the same image.
//!
//! The comparison reads only what the two stacks do not share: every path in a layer that
//! one stack has and the other lacks is looked up in both stacks the way overlayfs would (the
//! topmost layer that has it wins; a whiteout, a non-directory or an opaque directory above
//! hides what is below), and the two answers are compared. So the cost grows with what
//! changed, never with the image. A directory that appears or goes (or turns opaque) brings
//! its merged children into the comparison, so deleting a tree of the image lists each file.
//!
//! A writable layer belongs to a sandbox and is hostile: nothing here follows a symlink, and
//! only regular files are opened (`O_NOFOLLOW | O_NONBLOCK`, checked after the open).

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Shift;
use super::xattr::get_xattr;

/// Errors comparing two stacks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a layer failed.
    #[error("Cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One layer of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub dir: PathBuf,
    /// How the owners stored in it map to the sandbox's: snapshot layers and images store
    /// sandbox ids already; a writable layer stores host ids.
    shift: Option<Shift>,
}

impl Layer {
    /// A snapshot layer or an image's root filesystem.
    pub fn stored(dir: PathBuf) -> Self {
        Self { dir, shift: None }
    }

    /// The writable layer of the sandbox in `state_dir` (its upper directory, which is
    /// mounted while the sandbox runs or is paused).
    pub fn writable(state_dir: &Path) -> Result<Self, super::Error> {
        let st = crate::state::State::load(state_dir)?.ok_or(super::Error::NoLayer)?;
        let shift = if st.rootless {
            Shift::Rootless(st.root_uid)
        } else {
            Shift::Block(st.root_uid)
        };
        Ok(Self {
            dir: state_dir.join("fs/upper"),
            shift: Some(shift),
        })
    }
}

/// A path's kind as a sandbox sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One side of a changed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub target: Option<PathBuf>,
    /// Where it is stored (for its content).
    path: PathBuf,
}

/// A path that differs; `old` and `new` are absent where it does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Relative to the root (`etc/hosts`).
    pub path: PathBuf,
    pub old: Option<Entry>,
    pub new: Option<Entry>,
    /// For text files (UTF-8, no NUL, both sides at most `text_limit` bytes): the unified
    /// diff.
    pub unified: Option<String>,
}

/// The changes in path order, and whether `limit` cut the list short.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diff {
    pub changes: Vec<Change>,
    pub truncated: bool,
}

/// Compares `old` and `new`, each topmost first (the image last). At most `limit` changes
/// are listed; text files up to `text_limit` bytes get a unified diff.
pub fn diff(old: &[Layer], new: &[Layer], limit: usize, text_limit: u64) -> Result<Diff, Error> {
    let shared: HashSet<&Path> = old
        .iter()
        .filter(|l| new.contains(l))
        .map(|l| l.dir.as_path())
        .collect();
    let mut todo = BTreeSet::new();
    for layer in old
        .iter()
        .chain(new)
        .filter(|l| !shared.contains(l.dir.as_path()))
    {
        walk(&layer.dir, &mut todo)?;
    }
    let mut out = Diff::default();
    let mut seen = HashSet::new();
    while let Some(rel) = todo.pop_first() {
        if !seen.insert(rel.clone()) {
            continue;
        }
        let a = resolve(old, &rel)?;
        let b = resolve(new, &rel)?;
        let dir = |e: &Option<Entry>| e.as_ref().is_some_and(|e| e.kind == Kind::Dir);
        // A directory that appears, goes, or hides what was below it: its merged children
        // are compared too.
        let opaque =
            dir(&a) && dir(&b) && (opaque_in(old, &shared, &rel) || opaque_in(new, &shared, &rel));
        if dir(&a) && (!dir(&b) || opaque) {
            todo.extend(children(old, &rel)?);
        }
        if dir(&b) && (!dir(&a) || opaque) {
            todo.extend(children(new, &rel)?);
        }
        if same(&a, &b)? {
            continue;
        }
        if out.changes.len() == limit {
            out.truncated = true;
            break;
        }
        let unified = unified(&rel, a.as_ref(), b.as_ref(), text_limit);
        out.changes.push(Change {
            path: rel,
            old: a,
            new: b,
            unified,
        });
    }
    Ok(out)
}

/// Adds every path below `root` (not following symlinks) to `into`.
fn walk(root: &Path, into: &mut BTreeSet<PathBuf>) -> Result<(), Error> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound && rel.as_os_str().is_empty() => {
                return Ok(());
            }
            Err(source) => return Err(Error::Read { path: dir, source }),
        };
        for entry in entries {
            let entry = entry.map_err(|source| Error::Read {
                path: dir.clone(),
                source,
            })?;
            let child = rel.join(entry.file_name());
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            into.insert(child.clone());
            if is_dir {
                stack.push(child);
            }
        }
    }
    Ok(())
}

fn lstat(path: &Path) -> Result<Option<fs::Metadata>, Error> {
    match fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound) => Ok(None),
        // A component that is not a directory: nothing below it exists.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
        Err(source) => Err(Error::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn is_whiteout(m: &fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

fn is_opaque(path: &Path) -> bool {
    [
        OsStr::new("user.overlay.opaque"),
        OsStr::new("trusted.overlay.opaque"),
    ]
    .iter()
    .any(|name| matches!(get_xattr(path, name), Ok(Some(v)) if v == b"y"))
}

/// What a layer says about `rel`.
enum Seen {
    /// It has the path.
    Here(fs::Metadata),
    /// It hides the path (a whiteout of it or of a parent, a parent that is no directory).
    Hidden,
    /// It has nothing of the path, and what is below shows through (`false`) or is hidden by
    /// an opaque parent (`true`).
    Absent { opaque: bool },
}

fn look(layer: &Path, rel: &Path) -> Result<Seen, Error> {
    let mut at = layer.to_path_buf();
    let mut opaque = false;
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let Some(m) = lstat(&at)? else {
            return Ok(Seen::Absent { opaque });
        };
        if is_whiteout(&m) {
            return Ok(Seen::Hidden);
        }
        if i + 1 == parts.len() {
            return Ok(Seen::Here(m));
        }
        if !m.is_dir() {
            return Ok(Seen::Hidden);
        }
        opaque |= is_opaque(&at);
    }
    Ok(Seen::Absent { opaque })
}

/// `rel` as the stack shows it.
fn resolve(stack: &[Layer], rel: &Path) -> Result<Option<Entry>, Error> {
    for layer in stack {
        match look(&layer.dir, rel)? {
            Seen::Here(m) => return Ok(Some(entry(layer, rel, &m)?)),
            Seen::Hidden | Seen::Absent { opaque: true } => return Ok(None),
            Seen::Absent { opaque: false } => {}
        }
    }
    Ok(None)
}

fn entry(layer: &Layer, rel: &Path, m: &fs::Metadata) -> Result<Entry, Error> {
    let path = layer.dir.join(rel);
    let ft = m.file_type();
    let kind = if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else {
        Kind::Other
    };
    let target = match kind {
        Kind::Symlink => Some(fs::read_link(&path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?),
        _ => None,
    };
    let id = |n| layer.shift.map_or(n, |s| s.apply(n));
    Ok(Entry {
        kind,
        mode: m.mode() & 0o7777,
        uid: id(m.uid()),
        gid: id(m.gid()),
        size: if kind == Kind::File { m.len() } else { 0 },
        target,
        path,
    })
}

/// Whether a layer of `stack` that the other stack lacks makes `rel` opaque.
fn opaque_in(stack: &[Layer], shared: &HashSet<&Path>, rel: &Path) -> bool {
    stack
        .iter()
        .filter(|l| !shared.contains(l.dir.as_path()))
        .any(|l| is_opaque(&l.dir.join(rel)))
}

/// The merged children of directory `rel` in `stack`.
fn children(stack: &[Layer], rel: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut names = BTreeSet::new();
    for layer in stack {
        match look(&layer.dir, rel)? {
            Seen::Here(m) if m.is_dir() => {
                let dir = layer.dir.join(rel);
                for e in fs::read_dir(&dir).map_err(|source| Error::Read {
                    path: dir.clone(),
                    source,
                })? {
                    let e = e.map_err(|source| Error::Read {
                        path: dir.clone(),
                        source,
                    })?;
                    names.insert(e.file_name());
                }
                if is_opaque(&dir) {
                    break;
                }
            }
            Seen::Absent { opaque: false } => {}
            _ => break,
        }
    }
    // A name some upper layer whites out is not a child; `resolve` says.
    let mut out = Vec::new();
    for name in names {
        let child = rel.join(name);
        if resolve(stack, &child)?.is_some() {
            out.push(child);
        }
    }
    Ok(out)
}

/// Whether both sides are the same (or both absent). Modification times are not compared:
/// a file written back with the same bytes is unchanged.
fn same(a: &Option<Entry>, b: &Option<Entry>) -> Result<bool, Error> {
    let (Some(a), Some(b)) = (a, b) else {
        return Ok(a.is_none() && b.is_none());
    };
    if (a.kind, a.mode, a.uid, a.gid, a.size, &a.target)
        != (b.kind, b.mode, b.uid, b.gid, b.size, &b.target)
    {
        return Ok(false);
    }
    if a.kind != Kind::File || a.path == b.path {
        return Ok(true);
    }
    same_content(&a.path, &b.path)
}

fn open_file(path: &Path) -> io::Result<fs::File> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(f)
}

fn same_content(a: &Path, b: &Path) -> Result<bool, Error> {
    let fail = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Read { path, source }
    };
    let mut fa = open_file(a).map_err(fail(a))?;
    let mut fb = open_file(b).map_err(fail(b))?;
    let mut ba = vec![0u8; 64 * 1024];
    let mut bb = vec![0u8; 64 * 1024];
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(fail(a))?;
        let m = read_full(&mut fb, &mut bb).map_err(fail(b))?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The text of a small UTF-8 file without NUL bytes; `Some("")` for an absent side.
fn text(e: Option<&Entry>, limit: u64) -> Option<String> {
    let Some(e) = e else {
        return Some(String::new());
    };
    if e.kind != Kind::File || e.size > limit {
        return None;
    }
    let mut bytes = Vec::new();
    open_file(&e.path)
        .ok()?
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > limit || bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

fn unified(rel: &Path, a: Option<&Entry>, b: Option<&Entry>, limit: u64) -> Option<String> {
    if a.is_some_and(|e| e.kind != Kind::File) || b.is_some_and(|e| e.kind != Kind::File) {
        return None;
    }
    let (old, new) = (text(a, limit)?, text(b, limit)?);
    if old == new {
        return None;
    }
    let name = String::from_utf8_lossy(rel.as_os_str().as_bytes()).into_owned();
    let old_name = if a.is_some() {
        format!("a/{name}")
    } else {
        "/dev/null".into()
    };
    let new_name = if b.is_some() {
        format!("b/{name}")
    } else {
        "/dev/null".into()
    };
    Some(
        similar::TextDiff::from_lines(&old, &new)
            .unified_diff()
            .context_radius(3)
            .header(&old_name, &new_name)
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::mounts;

    fn whiteout(path: &Path) {
        let p = mounts::c_path(path);
        // SAFETY: a valid C path; makes an overlay whiteout (char 0:0).
        assert_eq!(unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR, 0) }, 0);
    }

    fn summary(d: &Diff) -> Vec<String> {
        d.changes
            .iter()
            .map(|c| {
                let side = |e: &Option<Entry>| match e {
                    None => "-".to_owned(),
                    Some(e) => format!("{:?}:{:o}:{}", e.kind, e.mode, e.size),
                };
                format!("{} {} {}", c.path.display(), side(&c.old), side(&c.new))
            })
            .collect()
    }

    /// Additions, modifications (content, mode), deletions by whiteout (a file, and a whole
    /// directory of the image, listed file by file), an opaque directory, and unchanged
    /// rewrites, between an image-only stack and one with two layers; exact results.
    #[test]
    fn a_diff_lists_exactly_what_changed() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: cannot make whiteouts");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("image");
        let (l1, l2) = (tmp.path().join("l1"), tmp.path().join("l2"));
        for d in [&image, &l1, &l2] {
            fs::create_dir_all(d.join("etc")).unwrap();
        }
        fs::write(image.join("etc/hosts"), "a\nb\nc\n").unwrap();
        fs::write(image.join("etc/same"), "same\n").unwrap();
        fs::write(image.join("etc/mode"), "m\n").unwrap();
        fs::create_dir_all(image.join("etc/tree/sub")).unwrap();
        fs::write(image.join("etc/tree/x"), "x").unwrap();
        fs::write(image.join("etc/tree/sub/y"), "y").unwrap();
        fs::create_dir_all(image.join("opq")).unwrap();
        fs::write(image.join("opq/old"), "o").unwrap();
        fs::write(image.join("bin.dat"), [0u8, 1, 2]).unwrap();

        // l1: hosts edited, a new file, the tree deleted.
        fs::write(l1.join("etc/hosts"), "a\nB\nc\n").unwrap();
        fs::write(l1.join("etc/new"), "n\n").unwrap();
        whiteout(&l1.join("etc/tree"));
        // l2 (above l1): same bytes written again, a mode change, an opaque dir, a binary.
        fs::write(l2.join("etc/same"), "same\n").unwrap();
        fs::write(l2.join("etc/mode"), "m\n").unwrap();
        fs::set_permissions(l2.join("etc/mode"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::create_dir_all(l2.join("opq")).unwrap();
        super::super::xattr::set_xattr(&l2.join("opq"), OsStr::new("user.overlay.opaque"), b"y")
            .unwrap();
        fs::write(l2.join("opq/fresh"), "f").unwrap();
        fs::write(l2.join("bin.dat"), [0u8, 9]).unwrap();
        let base = [Layer::stored(image.clone())];
        let top = [
            Layer::stored(l2.clone()),
            Layer::stored(l1.clone()),
            Layer::stored(image.clone()),
        ];
        let d = diff(&base, &top, 100, 1024).unwrap();
        assert!(!d.truncated);
        // Files are made 644 and directories 755 (umask 022).
        assert_eq!(
            summary(&d),
            [
                "bin.dat File:644:3 File:644:2",
                "etc/hosts File:644:6 File:644:6",
                "etc/mode File:644:2 File:600:2",
                "etc/new - File:644:2",
                "etc/tree Dir:755:0 -",
                "etc/tree/sub Dir:755:0 -",
                "etc/tree/sub/y File:644:1 -",
                "etc/tree/x File:644:1 -",
                "opq/fresh - File:644:1",
                "opq/old File:644:1 -",
            ]
        );
        let hosts = &d.changes[1];
        assert_eq!(
            hosts.unified.as_deref(),
            Some("--- a/etc/hosts\n+++ b/etc/hosts\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n")
        );
        assert_eq!(d.changes[0].unified, None, "binary");
        assert_eq!(
            d.changes[3].unified.as_deref(),
            Some("--- /dev/null\n+++ b/etc/new\n@@ -0,0 +1 @@\n+n\n")
        );
        // The other way round, additions are deletions; and a limit truncates.
        let back = diff(&top, &base, 100, 1024).unwrap();
        assert_eq!(back.changes.len(), d.changes.len());
        assert!(back.changes[3].new.is_none() && back.changes[3].old.is_some());
        let cut = diff(&base, &top, 2, 1024).unwrap();
        assert!(cut.truncated && cut.changes.len() == 2);
        // A stack against itself: nothing.
        assert_eq!(diff(&top, &top, 100, 1024).unwrap(), Diff::default());
    }
}
