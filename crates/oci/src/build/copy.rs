//! `COPY` and `ADD`: the files a step copies, written as a layer tar for the unpacker to
//! apply on the image so far.
//!
//! Sources are read from the build context or from another stage's (or image's) root. Both
//! are resolved with `openat2`: in the context with `RESOLVE_BENEATH`, so a `..` or a symbolic
//! link that leaves it is refused (the kernel says `EXDEV`); in an image's root with
//! `RESOLVE_IN_ROOT`, as the image itself would see its links. Below a source, the walk never
//! follows a link: links are copied as links. Device nodes are never copied.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use super::tar_out::{Meta, TarOut};
use crate::Error;

/// How a source's paths resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The build context: nothing may lead out of it.
    Context,
    /// An image's root filesystem: links resolve inside it.
    Image,
}

/// Who the copied files belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Fixed(u32, u32),
    /// As they are in the source (another stage's files).
    Keep,
}

/// One `COPY` or `ADD`.
pub struct Copy<'a> {
    /// The context directory or the source image's root.
    pub from: &'a OwnedFd,
    pub scope: Scope,
    pub sources: &'a [String],
    /// Absolute, normalised; a trailing `/` says it is a directory.
    pub dest: &'a str,
    /// The root of the image the files are copied into (to see whether `dest` is a directory).
    pub into: &'a OwnedFd,
    pub owner: Owner,
    pub chmod: Option<u32>,
    /// `ADD`: a local tar (plain, gzip or zstd) is unpacked at `dest`.
    pub unpack: bool,
}

/// Opens a root directory for [`Copy`].
pub fn open_root(path: &std::path::Path) -> Result<OwnedFd, Error> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Io {
        what: format!("Cannot open {}", path.display()),
        source: e.into(),
    })
}

fn refused(msg: impl Into<String>) -> Error {
    Error::Context(msg.into())
}

fn io_err(what: &str) -> impl FnOnce(rustix::io::Errno) -> Error + '_ {
    move |e| Error::Io {
        what: format!("Cannot read {what}"),
        source: e.into(),
    }
}

fn resolve(root: &OwnedFd, path: &str, scope: Scope, flags: OFlags) -> Result<OwnedFd, Error> {
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let how = match scope {
        Scope::Context => ResolveFlags::BENEATH,
        Scope::Image => ResolveFlags::IN_ROOT,
    } | ResolveFlags::NO_MAGICLINKS;
    rustix::fs::openat2(root, rel, flags | OFlags::CLOEXEC, Mode::empty(), how).map_err(|e| match e
    {
        rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => refused(format!(
            "{path} leads outside the build context (through .. or a symbolic link)"
        )),
        rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => {
            refused(format!("{path} is not in the build context"))
        }
        e => Error::Io {
            what: format!("Cannot open {path}"),
            source: e.into(),
        },
    })
}

/// The regular file `path` of `root` (the context's, refused when it leads out; an image's,
/// resolved inside it), at most `max` bytes.
pub fn read_file(root: &OwnedFd, path: &str, scope: Scope, max: u64) -> Result<Vec<u8>, Error> {
    let fd = resolve(root, path, scope, OFlags::PATH)?;
    let stat = rustix::fs::fstat(&fd).map_err(io_err(path))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(refused(format!("{path} is not a regular file")));
    }
    if stat.st_size.max(0) as u64 > max {
        return Err(refused(format!("{path} is larger than {max} bytes")));
    }
    let mut out = Vec::new();
    reopen(&fd, path)?
        .take(max)
        .read_to_end(&mut out)
        .map_err(|e| Error::Io {
            what: format!("Cannot read {path}"),
            source: e,
        })?;
    Ok(out)
}

/// `USER[:GROUP]` (names or numbers) as ids, names looked up in the image's `/etc/passwd`
/// and `/etc/group`; a group left out is the user's own (its passwd entry's, else the same
/// number).
pub fn owner_ids(root: &OwnedFd, spec: &str) -> Result<(u32, u32), Error> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let table = |file: &str| {
        read_file(root, file, Scope::Image, 4 << 20)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let passwd = table("/etc/passwd");
    let entry = |text: &str, name: &str| -> Option<Vec<String>> {
        text.lines()
            .map(|l| l.split(':').map(str::to_owned).collect::<Vec<_>>())
            .find(|f| f.len() > 3 && f[0] == name)
    };
    let unknown = |what: &str, n: &str| refused(format!("--chown: no {what} {n:?} in the image"));
    let (uid, own_gid) = match user.parse::<u32>() {
        Ok(uid) => (uid, None),
        Err(_) => {
            let f = entry(&passwd, user).ok_or_else(|| unknown("user", user))?;
            (
                f[2].parse().map_err(|_| unknown("user", user))?,
                f[3].parse::<u32>().ok(),
            )
        }
    };
    let gid = match group {
        None => own_gid.unwrap_or(uid),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = table("/etc/group");
                let f = groups
                    .lines()
                    .map(|l| l.split(':').map(str::to_owned).collect::<Vec<_>>())
                    .find(|f| f.len() > 2 && f[0] == g)
                    .ok_or_else(|| unknown("group", g))?;
                f[2].parse().map_err(|_| unknown("group", g))?
            }
        },
    };
    Ok((uid, gid))
}

/// Whether `path` is a directory in the root `into` (resolved as the image sees it).
pub fn is_dir_in(into: &OwnedFd, path: &str) -> bool {
    resolve(into, path, Scope::Image, OFlags::PATH | OFlags::DIRECTORY).is_ok()
}

/// The source paths a source names: itself, or the matches of a `*`/`?` pattern in its last
/// component (sorted).
fn expand(from: &OwnedFd, scope: Scope, source: &str) -> Result<Vec<String>, Error> {
    let (parent, last) = match source.trim_end_matches('/').rsplit_once('/') {
        Some((p, l)) => (p.to_owned(), l.to_owned()),
        None => (String::new(), source.trim_end_matches('/').to_owned()),
    };
    if !last.contains(['*', '?']) {
        return Ok(vec![source.to_owned()]);
    }
    let dir = resolve(from, &parent, scope, OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut found = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir).map_err(io_err(source))? {
        let entry = entry.map_err(io_err(source))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." && glob(last.as_bytes(), name.as_bytes()) {
            found.push(if parent.is_empty() {
                name
            } else {
                format!("{parent}/{name}")
            });
        }
    }
    if found.is_empty() {
        return Err(refused(format!(
            "{source} matches nothing in the build context"
        )));
    }
    found.sort();
    Ok(found)
}

fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
        _ => false,
    }
}

/// Writes the layer of one `COPY` or `ADD` to `out`.
pub fn copy_layer<W: Write>(c: &Copy<'_>, out: W) -> Result<W, Error> {
    let mut tar = TarOut::new(out);
    let mut sources = Vec::new();
    for s in c.sources {
        sources.extend(expand(c.from, c.scope, s)?);
    }
    let dest_is_dir = c.dest.ends_with('/') || sources.len() > 1 || is_dir_in(c.into, c.dest);
    let dest = c.dest.trim_matches('/').to_owned();
    let mut walk = Walk {
        tar: &mut tar,
        owner: c.owner,
        chmod: c.chmod,
    };
    for source in &sources {
        let fd = resolve(c.from, source, c.scope, OFlags::PATH)?;
        let stat = rustix::fs::fstat(&fd).map_err(io_err(source))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                let dir =
                    rustix::fs::openat(&fd, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                        .map_err(io_err(source))?;
                if !dest.is_empty() && !is_dir_in(c.into, &dest) {
                    walk.dir_entry(dest.as_bytes(), &stat, &[])?;
                }
                walk.tree(dir, dest.as_bytes())?;
            }
            FileType::RegularFile => {
                let file = reopen(&fd, source)?;
                let name = source.rsplit('/').next().unwrap_or(source);
                let target = if dest_is_dir {
                    join(dest.as_bytes(), name.as_bytes())
                } else {
                    dest.as_bytes().to_vec()
                };
                if c.unpack {
                    let mut reader = BufReader::new(file);
                    if is_archive(&mut reader) {
                        unpack_archive(walk.tar, reader, dest.as_bytes())?;
                        continue;
                    }
                    walk.file_entry(&target, &stat, reader)?;
                } else {
                    walk.file_entry(&target, &stat, file)?;
                }
            }
            FileType::Symlink => {
                // Only an image's root gets here (the context refuses a final link out).
                return Err(refused(format!("{source} is a dangling symbolic link")));
            }
            _ => return Err(refused(format!("{source} is not a file or a directory"))),
        }
    }
    tar.finish().map_err(|e| Error::Io {
        what: "Cannot write the layer".into(),
        source: e,
    })
}

/// Opens the file an `O_PATH` descriptor names for reading.
fn reopen(fd: &OwnedFd, shown: &str) -> Result<File, Error> {
    use std::os::fd::AsRawFd;
    let proc_path = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    File::open(proc_path).map_err(|e| Error::Io {
        what: format!("Cannot read {shown}"),
        source: e,
    })
}

/// The tar path of entry `name` in directory `dir` (the root when empty).
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

struct Walk<'t, W: Write> {
    tar: &'t mut TarOut<W>,
    owner: Owner,
    chmod: Option<u32>,
}

impl<W: Write> Walk<'_, W> {
    fn meta(&self, stat: &rustix::fs::Stat) -> Meta {
        let (uid, gid) = match self.owner {
            Owner::Fixed(u, g) => (u, g),
            Owner::Keep => (stat.st_uid, stat.st_gid),
        };
        Meta {
            mode: self.chmod.unwrap_or(stat.st_mode & 0o7777),
            uid,
            gid,
            mtime: stat.st_mtime.max(0) as u64,
        }
    }

    fn checked(path: &[u8]) -> Result<(), Error> {
        let name = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
        if name.starts_with(b".wh.") {
            return Err(refused(format!(
                "{} has a name the image format reserves for whiteouts (.wh.)",
                String::from_utf8_lossy(path)
            )));
        }
        Ok(())
    }

    fn dir_entry(&mut self, path: &[u8], stat: &rustix::fs::Stat, _x: &[u8]) -> Result<(), Error> {
        Self::checked(path)?;
        let mut meta = self.meta(stat);
        if self.chmod.is_none() {
            meta.mode = stat.st_mode & 0o7777;
        }
        self.tar.dir(path, &meta, &[]).map_err(write_err)
    }

    fn file_entry(
        &mut self,
        path: &[u8],
        stat: &rustix::fs::Stat,
        data: impl Read,
    ) -> Result<(), Error> {
        Self::checked(path)?;
        let meta = self.meta(stat);
        self.tar
            .file(path, &meta, stat.st_size.max(0) as u64, data, &[])
            .map_err(write_err)
    }

    /// Everything below the directory `dir`, as entries under `at`.
    fn tree(&mut self, dir: OwnedFd, at: &[u8]) -> Result<(), Error> {
        let mut stack = vec![(dir, at.to_vec())];
        while let Some((dir, at)) = stack.pop() {
            let shown = String::from_utf8_lossy(&at).into_owned();
            let mut names: Vec<Vec<u8>> = Vec::new();
            for entry in rustix::fs::Dir::read_from(&dir).map_err(io_err(&shown))? {
                let entry = entry.map_err(io_err(&shown))?;
                let n = entry.file_name().to_bytes();
                if n != b"." && n != b".." {
                    names.push(n.to_vec());
                }
            }
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                let path = join(&at, &name);
                let os = OsStr::from_bytes(&name);
                let stat = rustix::fs::statat(&dir, os, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(io_err(&shown))?;
                match FileType::from_raw_mode(stat.st_mode) {
                    FileType::Directory => {
                        self.dir_entry(&path, &stat, &[])?;
                        let sub = rustix::fs::openat(
                            &dir,
                            os,
                            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(io_err(&shown))?;
                        subdirs.push((sub, path));
                    }
                    FileType::RegularFile => {
                        let fd = rustix::fs::openat(
                            &dir,
                            os,
                            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(io_err(&shown))?;
                        self.file_entry(&path, &stat, File::from(fd))?;
                    }
                    FileType::Symlink => {
                        Self::checked(&path)?;
                        let target =
                            rustix::fs::readlinkat(&dir, os, Vec::new()).map_err(io_err(&shown))?;
                        let meta = self.meta(&stat);
                        self.tar
                            .symlink(&path, &meta, target.as_bytes())
                            .map_err(write_err)?;
                    }
                    // Devices, fifos and sockets are not copied.
                    _ => {}
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }
}

fn write_err(e: io::Error) -> Error {
    Error::Io {
        what: "Cannot write the layer".into(),
        source: e,
    }
}

/// Whether the file starts as a tar, a gzip or a zstd stream does.
fn is_archive(r: &mut BufReader<File>) -> bool {
    let Ok(head) = r.fill_buf() else { return false };
    let head = head.to_vec();
    head.starts_with(&[0x1f, 0x8b])
        || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || head.get(257..262) == Some(b"ustar")
}

/// `ADD` of a local archive: its entries under `at`. A name with `..` or a whiteout's is
/// refused; owners and modes are the archive's; device nodes are left out.
fn unpack_archive<W: Write>(
    tar: &mut TarOut<W>,
    r: BufReader<File>,
    at: &[u8],
) -> Result<(), Error> {
    let bad = |e: io::Error| refused(format!("The archive to ADD is unreadable: {e}"));
    let stream = crate::unpack::decompressed(r).map_err(bad)?;
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let raw = entry.path_bytes().into_owned();
        let rel = clean(&raw).ok_or_else(|| {
            refused(format!(
                "The archive to ADD has an entry out of its root: {}",
                String::from_utf8_lossy(&raw)
            ))
        })?;
        if rel.is_empty() {
            continue;
        }
        let path = join(at, &rel);
        Walk::<W>::checked(&path)?;
        let h = entry.header();
        let owner = |id: io::Result<u64>| {
            u32::try_from(id.unwrap_or(0)).map_err(|_| {
                refused(format!(
                    "The archive to ADD has an entry owned by an id over 32 bits: {}",
                    String::from_utf8_lossy(&raw)
                ))
            })
        };
        let meta = Meta {
            mode: h.mode().unwrap_or(0o644) & 0o7777,
            uid: owner(h.uid())?,
            gid: owner(h.gid())?,
            mtime: h.mtime().unwrap_or(0),
        };
        let kind = h.entry_type();
        let size = entry.size();
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        match kind {
            tar::EntryType::Directory => tar.dir(&path, &meta, &[]).map_err(write_err)?,
            tar::EntryType::Regular | tar::EntryType::Continuous => tar
                .file(&path, &meta, size, &mut entry, &[])
                .map_err(write_err)?,
            tar::EntryType::Symlink => tar
                .symlink(&path, &meta, &link.unwrap_or_default())
                .map_err(write_err)?,
            tar::EntryType::Link => {
                let target = link.as_deref().and_then(clean).ok_or_else(|| {
                    refused("The archive to ADD has a hard link out of its root".to_owned())
                })?;
                tar.hardlink(&path, &meta, &join(at, &target))
                    .map_err(write_err)?
            }
            _ => {}
        }
    }
    Ok(())
}

/// A relative path without `.`, empty components and leading `/`; `None` when it has `..`.
fn clean(raw: &[u8]) -> Option<Vec<u8>> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts.join(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_cleans() {
        assert!(glob(b"*.txt", b"a.txt"));
        assert!(!glob(b"*.txt", b"a.txt.bak"));
        assert!(glob(b"a?c", b"abc"));
        assert_eq!(clean(b"./a//b/").unwrap(), b"a/b");
        assert_eq!(clean(b"a/../b"), None);
    }

    #[test]
    fn refuses_sources_out_of_the_context() {
        let t = tempfile::tempdir().unwrap();
        let ctx = t.path().join("ctx");
        std::fs::create_dir_all(ctx.join("d")).unwrap();
        std::fs::write(ctx.join("d/f"), b"x").unwrap();
        std::fs::write(t.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("../secret", ctx.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ctx.join("abs")).unwrap();
        std::os::unix::fs::symlink("d/f", ctx.join("in")).unwrap();
        let image = t.path().join("image");
        std::fs::create_dir_all(&image).unwrap();
        let (from, into) = (open_root(&ctx).unwrap(), open_root(&image).unwrap());
        let run = |src: &str| {
            let sources = [src.to_owned()];
            copy_layer(
                &Copy {
                    from: &from,
                    scope: Scope::Context,
                    sources: &sources,
                    dest: "/dst/",
                    into: &into,
                    owner: Owner::Fixed(0, 0),
                    chmod: None,
                    unpack: false,
                },
                Vec::new(),
            )
        };
        for bad in ["../secret", "out", "abs", "d/../../secret", "nope"] {
            assert!(matches!(run(bad), Err(Error::Context(_))), "{bad}");
        }
        let tar = run("in").unwrap();
        let mut a = tar::Archive::new(&tar[..]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["dst/in"]);
        assert!(run("d").is_ok());
        assert!(run("/d/f").is_ok());
    }
}
