//! Applying one image layer (a tar stream) to a root directory that holds the layers below
//! it, so that the result is what `podman` or `umoci unpack` would make of it.
//!
//! A layer is hostile input. Every path is resolved with `openat2(RESOLVE_IN_ROOT)` on the
//! root's descriptor, so a symbolic link in the tree (`etc -> /etc`, `x -> ../../..`) is
//! followed the way the container will see it: within the root, never out of it. Only the
//! parent directory of an entry is resolved that way; the entry itself is then made relative
//! to that directory with the `*at` calls and `O_NOFOLLOW`, so no final component is ever
//! followed. Device nodes are never made, hard links only reach files already in the root,
//! and the bytes written and the entries read are bounded before anything is written.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fmt::Display;
use std::fs::File;
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;

use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Stat, Timespec, Timestamps, Uid,
    XattrFlags,
};
use rustix::io::Errno;

use crate::{Error, Result};

/// Limits on what unpacking may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes of file data the whole image may hold, all layers together.
    pub max_bytes: u64,
    /// The most tar entries one layer may have (whiteouts and skipped ones included): each
    /// costs an inode and some memory here, whatever its size.
    pub max_entries: u64,
}

/// What one layer did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Tar entries read, whatever became of them.
    pub entries: u64,
    /// Bytes of file data written (the apparent size, holes of sparse files included).
    pub bytes: u64,
    /// Whiteout entries, opaque ones included (whether or not they had anything to remove).
    pub whiteouts: u64,
    /// Character and block devices, which are never made.
    pub skipped_devices: u64,
}

/// The most bytes of tar headers, long names, PAX records and unread entry data the stream
/// may hold between two entries. The tar crate reads long names and PAX records into memory
/// whole, so without this a few kilobytes of gzip could claim gigabytes of memory; with it,
/// the stream read is bounded by the file data allowed plus this per entry.
const HEADER_BUDGET: u64 = 1 << 20;

/// How much file data is copied at a time.
const CHUNK: usize = 64 << 10;

/// How often a resolution is retried when the kernel reports a concurrent rename (`EAGAIN`
/// from `openat2` with `RESOLVE_IN_ROOT`); nothing else should be writing the root.
const RESOLVE_TRIES: u32 = 8;

/// The stream decompressed by its magic bytes: gzip (1f 8b), zstd (28 b5 2f fd), else plain
/// tar (the media type of a layer is often wrong, and `docker save` stores plain tars).
pub fn decompressed<'a, R: BufRead + 'a>(mut r: R) -> io::Result<Box<dyn Read + 'a>> {
    // The magic is read rather than peeked with `fill_buf`, which may return fewer bytes
    // than the stream has.
    let mut magic = [0u8; 4];
    let mut len = 0;
    while len < magic.len() {
        match r.read(&mut magic[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let head = &magic[..len];
    let stream = io::Cursor::new(head.to_vec()).chain(r);
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        // Go's gzip reader, which Docker and Podman use, reads concatenated members.
        Box::new(flate2::bufread::MultiGzDecoder::new(stream))
    } else if head == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::with_buffer(stream)?)
    } else {
        Box::new(stream)
    })
}

/// Applies the layer tar `layer` (already decompressed) to `root`.
///
/// `used` is the bytes of file data written so far for this image (all layers); it grows by
/// each file's declared size before the file is written, and a file that would take it past
/// `limits.max_bytes` fails the call with [`Error::TooLarge`]. A layer with more than
/// `limits.max_entries` entries fails with [`Error::Invalid`]. Anything the layer may not do
/// (leave the root, link to what is not in it, ...) fails with [`Error::Invalid`] naming the
/// entry; nothing outside `root` is written before. A failure may leave `root` partly
/// written: the caller discards it.
///
/// File owners are applied only when the process runs as root; otherwise every file is ours.
pub fn apply(root: &Path, layer: impl Read, limits: &Limits, used: &mut u64) -> Result<Stats> {
    let root_fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Io {
        what: format!("Cannot open the root directory {}", root.display()),
        source: e.into(),
    })?;
    let budget = Rc::new(Cell::new(HEADER_BUDGET));
    let mut archive = tar::Archive::new(Budgeted {
        inner: layer,
        left: Rc::clone(&budget),
    });
    let mut entries = archive
        .entries()
        .map_err(|e| read_error("The layer is not a tar stream".into(), e))?;
    let mut unpacker = Unpacker {
        root: root_fd,
        limits,
        used,
        stats: Stats::default(),
        written: HashMap::new(),
        dirs: HashMap::new(),
        as_root: rustix::process::geteuid().is_root(),
        buf: vec![0; CHUNK],
    };
    let mut previous: Option<String> = None;
    loop {
        budget.set(HEADER_BUDGET);
        let next = entries.next();
        // File data is bounded by its declared size, checked against `max_bytes`.
        budget.set(u64::MAX);
        let Some(entry) = next else { break };
        let mut entry = entry.map_err(|e| {
            let context = match &previous {
                None => "The layer's first tar header is unreadable".to_owned(),
                Some(name) => format!("The layer's tar stream is unreadable after entry {name:?}"),
            };
            read_error(context, e)
        })?;
        unpacker.stats.entries += 1;
        if unpacker.stats.entries > limits.max_entries {
            return Err(Error::Invalid(format!(
                "The layer has more than {} entries",
                limits.max_entries
            )));
        }
        previous = Some(unpacker.entry(&mut entry)?);
    }
    unpacker.finish_dirs()?;
    Ok(unpacker.stats)
}

/// The layer stream, refusing to give more than `left` bytes (see [`HEADER_BUDGET`]).
struct Budgeted<R> {
    inner: R,
    left: Rc<Cell<u64>>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left.get();
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::other(format!(
                "more than {HEADER_BUDGET} bytes of tar headers for one entry"
            )));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left.set(left.saturating_sub(n as u64));
        Ok(n)
    }
}

/// The entries this layer wrote, by the directory that holds them (its device and inode)
/// and their name in it: what an opaque whiteout keeps. Inodes rather than paths, because a
/// path may reach the same place through symbolic links in many ways.
type Written = HashMap<(u64, u64), HashSet<Vec<u8>>>;

/// A directory whose mode and mtime are set once the whole layer is written: writing its
/// children changes its mtime, and a mode without write permission would stop them.
struct PendingDir {
    shown: String,
    id: (u64, u64),
    mode: Mode,
    mtime: Timespec,
}

struct Unpacker<'a> {
    root: OwnedFd,
    limits: &'a Limits,
    used: &'a mut u64,
    stats: Stats,
    written: Written,
    /// By normalised path: a directory listed twice takes its last entry's metadata.
    dirs: HashMap<Vec<u8>, PendingDir>,
    as_root: bool,
    buf: Vec<u8>,
}

/// An entry's name, normalised: relative to the root, without empty or `.` components.
struct EntryPath<'n> {
    parent: Vec<&'n [u8]>,
    name: &'n [u8],
}

impl<'n> EntryPath<'n> {
    /// `None` for the root itself. Leading `/` are dropped (Docker takes absolute names
    /// relative to the root); `..` is refused.
    fn parse(raw: &'n [u8]) -> Result<Option<Self>, &'static str> {
        if raw.contains(&0) {
            return Err("has a NUL byte");
        }
        let mut parts: Vec<&[u8]> = raw
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        if parts.iter().any(|c| *c == b"..") {
            return Err("leaves the root through `..`");
        }
        Ok(parts.pop().map(|name| EntryPath {
            parent: parts,
            name,
        }))
    }

    fn parent_path(&self) -> Vec<u8> {
        self.parent.join(&b'/')
    }

    fn full_path(&self) -> Vec<u8> {
        let mut path = self.parent_path();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(self.name);
        path
    }
}

/// What is wrong with an entry's header or PAX records.
#[derive(Debug, thiserror::Error)]
enum BadHeader {
    #[error("has an unusable {0}")]
    Field(&'static str),
    /// (Shown in one message with its cause: [`invalid`] takes only the text.)
    #[error("has unreadable PAX records: {0}")]
    Pax(io::Error),
    #[error("has a malformed PAX record")]
    PaxRecord,
    #[error("has a malformed PAX mtime")]
    PaxTime,
    #[error("has a NUL byte in an extended attribute's name")]
    XattrName,
}

/// The metadata of an entry, as the header and its PAX records say.
struct Meta {
    mode: Mode,
    uid: Uid,
    gid: Gid,
    mtime: Timespec,
    /// Only those this process may and should set (see [`xattr_wanted`]).
    xattrs: Vec<(CString, Vec<u8>)>,
}

impl Meta {
    fn read<R: Read>(
        entry: &mut tar::Entry<'_, R>,
        as_root: bool,
        is_dir: bool,
    ) -> Result<Self, BadHeader> {
        let header = entry.header();
        let old = header.as_old();
        let mode =
            number(header.mode().map(u64::from), &old.mode).ok_or(BadHeader::Field("mode"))?;
        let uid = number(header.uid(), &old.uid)
            .and_then(owner_id)
            .ok_or(BadHeader::Field("uid"))?;
        let gid = number(header.gid(), &old.gid)
            .and_then(owner_id)
            .ok_or(BadHeader::Field("gid"))?;
        let seconds = number(header.mtime(), &old.mtime).and_then(|t| i64::try_from(t).ok());
        let mut mtime = Timespec {
            tv_sec: seconds.ok_or(BadHeader::Field("mtime"))?,
            tv_nsec: 0,
        };
        let mut xattrs = Vec::new();
        let records = entry.pax_extensions().map_err(BadHeader::Pax)?;
        for record in records.into_iter().flatten() {
            let record = record.map_err(|_| BadHeader::PaxRecord)?;
            let key = record.key_bytes();
            if key == b"mtime" {
                // Go's tar reader keeps the PAX mtime to the nanosecond; so do Docker and
                // Podman.
                mtime = pax_time(record.value_bytes()).ok_or(BadHeader::PaxTime)?;
            } else if let Some(name) = key.strip_prefix(b"SCHILY.xattr.")
                && xattr_wanted(name, as_root, is_dir)
            {
                let name = CString::new(name).map_err(|_| BadHeader::XattrName)?;
                xattrs.push((name, record.value_bytes().to_vec()));
            }
        }
        Ok(Meta {
            // The permission bits, setuid, setgid and sticky; the file type is the entry's.
            mode: Mode::from_raw_mode((mode & 0o7777) as u32),
            uid: Uid::from_raw(uid),
            gid: Gid::from_raw(gid),
            mtime,
            xattrs,
        })
    }

    fn times(&self) -> Timestamps {
        times(self.mtime)
    }
}

impl Unpacker<'_> {
    /// Applies one entry; returns its name as shown in messages.
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<String> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let flag = entry.header().as_old().linkflag[0];
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            return Ok(shown);
        }
        let Some(path) = EntryPath::parse(&raw).map_err(|why| invalid(&shown, why))? else {
            return Ok(shown);
        };
        if let Some(hidden) = path.name.strip_prefix(b".wh.") {
            self.stats.whiteouts += 1;
            self.whiteout(&path, hidden, &shown)?;
            return Ok(shown);
        }
        // Old tars mark a directory by a trailing slash on a `\0`-typed entry; Go reads it so.
        let old_dir = flag == 0 && raw.ends_with(b"/");
        let is_dir = kind.is_dir() || old_dir;
        let meta = Meta::read(entry, self.as_root, is_dir).map_err(|why| invalid(&shown, why))?;
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        use tar::EntryType as T;
        match kind {
            _ if is_dir => self.directory(&path, &meta, &shown)?,
            T::Regular | T::Continuous | T::GNUSparse => {
                self.file(&path, &meta, entry, kind.is_gnu_sparse(), &shown)?
            }
            T::Symlink => self.symlink(&path, &meta, link, &shown)?,
            T::Link => self.hardlink(&path, link, &shown)?,
            T::Fifo => self.fifo(&path, &meta, &shown)?,
            // A device node would reach the host's device; the sandbox gets its own /dev.
            T::Char | T::Block => self.stats.skipped_devices += 1,
            _ => {
                return Err(invalid(
                    &shown,
                    format!(
                        "has tar entry type {:?}, which a layer may not hold",
                        char::from(flag)
                    ),
                ));
            }
        }
        Ok(shown)
    }

    fn file<R: Read>(
        &mut self,
        path: &EntryPath,
        meta: &Meta,
        data: &mut tar::Entry<'_, R>,
        sparse: bool,
        shown: &str,
    ) -> Result<()> {
        let size = data.size();
        let total = self
            .used
            .checked_add(size)
            .filter(|total| *total <= self.limits.max_bytes)
            .ok_or(Error::TooLarge {
                limit: self.limits.max_bytes,
            })?;
        *self.used = total;
        let parent = self.parent(path, shown)?;
        remove(&parent, path.name).map_err(failed(shown))?;
        let fd = rustix::fs::openat(
            &parent,
            path.name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(failed(shown))?;
        let mut file = File::from(fd);
        let written = self.copy(data, &mut file, sparse, shown)?;
        if written != size {
            return Err(invalid(
                shown,
                format!("is cut short: the layer holds {written} of its {size} bytes"),
            ));
        }
        self.stats.bytes += size;
        self.finish_node(&file, meta, shown)?;
        self.wrote(&parent, path.name, shown)
    }

    /// Copies the entry's data, leaving holes for runs of zeros when the entry is sparse
    /// (the tar crate expands a sparse map into zeros and does not expose it).
    fn copy(
        &mut self,
        from: &mut impl Read,
        to: &mut File,
        sparse: bool,
        shown: &str,
    ) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let n = fill(from, &mut self.buf).map_err(|e| {
                read_error(
                    format!("The data of layer entry {shown:?} is unreadable"),
                    e,
                )
            })?;
            if n == 0 {
                break;
            }
            let chunk = &self.buf[..n];
            let wrote = if sparse && chunk.iter().all(|b| *b == 0) {
                to.seek(SeekFrom::Current(n as i64)).map(drop)
            } else {
                to.write_all(chunk)
            };
            wrote.map_err(|e| Error::Io {
                what: format!("Cannot write layer entry {shown:?}"),
                source: e,
            })?;
            total += n as u64;
        }
        if sparse {
            to.set_len(total).map_err(|e| Error::Io {
                what: format!("Cannot write layer entry {shown:?}"),
                source: e,
            })?;
        }
        Ok(total)
    }

    fn directory(&mut self, path: &EntryPath, meta: &Meta, shown: &str) -> Result<()> {
        let parent = self.parent(path, shown)?;
        let existing = match rustix::fs::statat(&parent, path.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Some(file_type(&stat)),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(failed(shown)(e)),
        };
        if existing != Some(FileType::Directory) {
            if existing.is_some() {
                remove(&parent, path.name).map_err(failed(shown))?;
            }
            rustix::fs::mkdirat(&parent, path.name, Mode::RWXU).map_err(failed(shown))?;
        }
        let dir = open_dir(&parent, path.name).map_err(failed(shown))?;
        self.own(&dir, meta, shown)?;
        self.set_xattrs(&dir, meta, shown)?;
        self.wrote(&parent, path.name, shown)?;
        let stat = rustix::fs::fstat(&dir).map_err(failed(shown))?;
        self.dirs.insert(
            path.full_path(),
            PendingDir {
                shown: shown.to_owned(),
                id: id(&stat),
                mode: meta.mode,
                mtime: meta.mtime,
            },
        );
        Ok(())
    }

    fn symlink(
        &mut self,
        path: &EntryPath,
        meta: &Meta,
        target: Option<Vec<u8>>,
        shown: &str,
    ) -> Result<()> {
        // The target is stored as given: it is only ever followed inside a root, by the
        // resolution here or by the sandbox's own root.
        let target = target
            .filter(|t| !t.is_empty())
            .ok_or_else(|| invalid(shown, "is a symbolic link without a target"))?;
        if target.contains(&0) {
            return Err(invalid(shown, "has a NUL byte in its link target"));
        }
        let parent = self.parent(path, shown)?;
        remove(&parent, path.name).map_err(failed(shown))?;
        rustix::fs::symlinkat(target.as_slice(), &parent, path.name).map_err(failed(shown))?;
        if self.as_root {
            rustix::fs::chownat(
                &parent,
                path.name,
                Some(meta.uid),
                Some(meta.gid),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(failed(shown))?;
        }
        // Extended attributes are skipped: the kernel refuses `user.*` on a link, and a
        // link's own mode does not exist on Linux.
        rustix::fs::utimensat(&parent, path.name, &meta.times(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(failed(shown))?;
        self.wrote(&parent, path.name, shown)
    }

    /// A hard link shares its target's inode, so it takes no metadata of its own: the
    /// target's entry set it.
    fn hardlink(&mut self, path: &EntryPath, target: Option<Vec<u8>>, shown: &str) -> Result<()> {
        let target = target.ok_or_else(|| invalid(shown, "is a hard link without a target"))?;
        let target_shown = String::from_utf8_lossy(&target).into_owned();
        let link_invalid =
            |why: &str| invalid(shown, format!("links to {target_shown:?}, which {why}"));
        let to = EntryPath::parse(&target)
            .map_err(link_invalid)?
            .ok_or_else(|| link_invalid("is the root directory"))?;
        // The target's final component is not followed: the link is to what is there.
        let to_parent = match self.resolve(&to.parent_path(), OFlags::PATH) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Err(link_invalid("does not exist")),
            Err(Errno::NOTDIR) => return Err(link_invalid("has a parent that is not a directory")),
            Err(e) => return Err(resolve_error(shown, e)),
        };
        match rustix::fs::statat(&to_parent, to.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if file_type(&stat) == FileType::Directory => {
                return Err(link_invalid("is a directory"));
            }
            Ok(_) => {}
            Err(Errno::NOENT) => return Err(link_invalid("does not exist")),
            Err(e) => return Err(failed(shown)(e)),
        }
        let parent = self.parent(path, shown)?;
        remove(&parent, path.name).map_err(failed(shown))?;
        match rustix::fs::linkat(&to_parent, to.name, &parent, path.name, AtFlags::empty()) {
            Ok(()) => {}
            // Replacing the entry removed the target (a link to itself, or into itself).
            Err(Errno::NOENT) => return Err(link_invalid("does not exist")),
            Err(e) => return Err(failed(shown)(e)),
        }
        self.wrote(&parent, path.name, shown)
    }

    fn fifo(&mut self, path: &EntryPath, meta: &Meta, shown: &str) -> Result<()> {
        let parent = self.parent(path, shown)?;
        remove(&parent, path.name).map_err(failed(shown))?;
        rustix::fs::mknodat(
            &parent,
            path.name,
            FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .map_err(failed(shown))?;
        // Opened without blocking (no writer is needed) so that its metadata is set through
        // a descriptor, never a path.
        let fifo = rustix::fs::openat(
            &parent,
            path.name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(failed(shown))?;
        // No extended attributes: the kernel refuses `user.*` on special files.
        self.own(&fifo, meta, shown)?;
        rustix::fs::fchmod(&fifo, meta.mode).map_err(failed(shown))?;
        rustix::fs::futimens(&fifo, &meta.times()).map_err(failed(shown))?;
        self.wrote(&parent, path.name, shown)
    }

    /// Owner, extended attributes, mode and mtime of a file just written, in the order
    /// Docker uses: `chown` clears setuid and file capabilities, so it goes first, and the
    /// mode goes after the attributes, which may hold an ACL.
    fn finish_node(&self, file: &File, meta: &Meta, shown: &str) -> Result<()> {
        self.own(file, meta, shown)?;
        self.set_xattrs(file, meta, shown)?;
        rustix::fs::fchmod(file, meta.mode).map_err(failed(shown))?;
        rustix::fs::futimens(file, &meta.times()).map_err(failed(shown))
    }

    fn own(&self, fd: impl AsFd, meta: &Meta, shown: &str) -> Result<()> {
        if self.as_root {
            rustix::fs::fchown(fd, Some(meta.uid), Some(meta.gid)).map_err(failed(shown))?;
        }
        Ok(())
    }

    fn set_xattrs(&self, fd: impl AsFd, meta: &Meta, shown: &str) -> Result<()> {
        for (name, value) in &meta.xattrs {
            match rustix::fs::fsetxattr(&fd, name.as_c_str(), value, XattrFlags::empty()) {
                // The filesystem under the store has no such attributes; podman skips
                // them too.
                Ok(()) | Err(Errno::OPNOTSUPP) => {}
                Err(Errno::INVAL | Errno::RANGE | Errno::TOOBIG) => {
                    return Err(invalid(
                        shown,
                        format!("has extended attribute {name:?}, which the kernel refuses"),
                    ));
                }
                Err(e) => return Err(failed(shown)(e)),
            }
        }
        Ok(())
    }

    /// `.wh.<name>` removes `<name>`; `.wh..wh..opq` empties its directory of what the
    /// layers below put there. Neither is an error when there is nothing to remove.
    fn whiteout(&mut self, path: &EntryPath, hidden: &[u8], shown: &str) -> Result<()> {
        if hidden == b".wh..opq" {
            let dir = match self.resolve(&path.parent_path(), OFlags::RDONLY) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(()),
                Err(e) => return Err(resolve_error(shown, e)),
            };
            return clear(dir, Some(&self.written)).map_err(failed(shown));
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(invalid(shown, "is a whiteout of no file"));
        }
        let parent = match self.resolve(&path.parent_path(), OFlags::PATH) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(resolve_error(shown, e)),
        };
        remove(&parent, hidden).map_err(failed(shown))
    }

    /// The directory that holds `path`, resolved in the root; missing directories are made
    /// (mode 0755, owned by root), as Docker does.
    fn parent(&mut self, path: &EntryPath, shown: &str) -> Result<OwnedFd> {
        match self.resolve(&path.parent_path(), OFlags::PATH) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(resolve_error(shown, e)),
        }
        let mut dir = self.resolve(b"", OFlags::PATH).map_err(failed(shown))?;
        for depth in 1..=path.parent.len() {
            dir = match self.resolve(&path.parent[..depth].join(&b'/'), OFlags::PATH) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => self.make_parent(&dir, path.parent[depth - 1], shown)?,
                Err(e) => return Err(resolve_error(shown, e)),
            };
        }
        Ok(dir)
    }

    fn make_parent(&mut self, dir: &OwnedFd, name: &[u8], shown: &str) -> Result<OwnedFd> {
        let mode = Mode::RWXU | Mode::RGRP | Mode::XGRP | Mode::ROTH | Mode::XOTH;
        match rustix::fs::mkdirat(dir, name, mode) {
            Ok(()) => {}
            // It resolved to nothing, yet something is there: a link to nowhere.
            Err(Errno::EXIST) => {
                return Err(invalid(
                    shown,
                    "has a parent that is a symbolic link to nothing",
                ));
            }
            Err(e) => return Err(failed(shown)(e)),
        }
        let made = open_dir(dir, name).map_err(failed(shown))?;
        if self.as_root {
            rustix::fs::fchown(&made, Some(Uid::ROOT), Some(Gid::ROOT)).map_err(failed(shown))?;
        }
        // Not the umask's choice, nor a setgid parent's.
        rustix::fs::fchmod(&made, mode).map_err(failed(shown))?;
        self.wrote(dir, name, shown)?;
        Ok(made)
    }

    /// Opens the directory `path` (relative, `/`-separated, empty for the root) inside the
    /// root: every symbolic link on the way, absolute or with `..`, stays in it.
    fn resolve(&self, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        let path = if path.is_empty() { b"." } else { path };
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(
                &self.root,
                path,
                flags | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            ) {
                Err(Errno::AGAIN) if tries < RESOLVE_TRIES => tries += 1,
                result => return result,
            }
        }
    }

    /// Notes that this layer wrote `name` in `dir`, for a later opaque whiteout to keep.
    fn wrote(&mut self, dir: impl AsFd, name: &[u8], shown: &str) -> Result<()> {
        let stat = rustix::fs::fstat(dir).map_err(failed(shown))?;
        self.written
            .entry(id(&stat))
            .or_default()
            .insert(name.to_vec());
        Ok(())
    }

    /// Sets the deferred modes and mtimes of the layer's directories, deepest first so that
    /// a parent's mode cannot shut us out of its children. A directory replaced later in
    /// the layer is left alone.
    fn finish_dirs(&mut self) -> Result<()> {
        let mut dirs: Vec<_> = self.dirs.drain().collect();
        dirs.sort_by_key(|(path, _)| {
            std::cmp::Reverse(path.iter().filter(|b| **b == b'/').count())
        });
        for (path, dir) in dirs {
            let fd = match self.resolve(&path, OFlags::RDONLY) {
                Ok(fd) => fd,
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                Err(e) => return Err(failed(&dir.shown)(e)),
            };
            let stat = rustix::fs::fstat(&fd).map_err(failed(&dir.shown))?;
            if id(&stat) != dir.id {
                continue;
            }
            rustix::fs::fchmod(&fd, dir.mode).map_err(failed(&dir.shown))?;
            rustix::fs::futimens(&fd, &times(dir.mtime)).map_err(failed(&dir.shown))?;
        }
        Ok(())
    }
}

/// Removes `name` from `dir` if it is there, a directory with everything in it; never
/// follows a symbolic link.
fn remove(dir: impl AsFd, name: &[u8]) -> Result<(), Errno> {
    match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR) => {
            clear(open_dir(&dir, name)?, None)?;
            rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
        }
        Err(e) => Err(e),
    }
}

/// One directory being emptied by [`clear`].
struct Level {
    dir: OwnedFd,
    id: (u64, u64),
    names: Vec<Vec<u8>>,
    /// Its name in the level above, when it is removed once empty.
    removed_as: Option<Vec<u8>>,
}

impl Level {
    fn open(dir: OwnedFd, removed_as: Option<Vec<u8>>) -> Result<Self, Errno> {
        let mut names = Vec::new();
        for entry in Dir::read_from(&dir)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(name);
            }
        }
        let id = id(&rustix::fs::fstat(&dir)?);
        Ok(Level {
            dir,
            id,
            names,
            removed_as,
        })
    }
}

/// Removes everything in `top` except what `keep` lists (and, in a kept directory, its
/// own kept entries). The walk keeps its own stack, so a hostile depth cannot overflow
/// ours; it never follows a symbolic link.
fn clear(top: OwnedFd, keep: Option<&Written>) -> Result<(), Errno> {
    let mut stack = vec![Level::open(top, None)?];
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.names.pop() else {
            let removed_as = level.removed_as.take();
            stack.pop();
            if let (Some(name), Some(parent)) = (removed_as, stack.last()) {
                rustix::fs::unlinkat(&parent.dir, name.as_slice(), AtFlags::REMOVEDIR)?;
            }
            continue;
        };
        let kept = level.removed_as.is_none()
            && keep.is_some_and(|k| k.get(&level.id).is_some_and(|n| n.contains(&name)));
        let child = if kept {
            match open_dir(&level.dir, &name) {
                // A kept directory still loses what the layers below put in it.
                Ok(dir) => Some(Level::open(dir, None)?),
                Err(Errno::NOTDIR | Errno::LOOP) => None,
                Err(e) => return Err(e),
            }
        } else {
            match rustix::fs::unlinkat(&level.dir, name.as_slice(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => None,
                Err(Errno::ISDIR) => {
                    let dir = open_dir(&level.dir, &name)?;
                    Some(Level::open(dir, Some(name))?)
                }
                Err(e) => return Err(e),
            }
        };
        stack.extend(child);
    }
    Ok(())
}

/// Opens the directory `name` in `dir` for reading, not following a link.
fn open_dir(dir: impl AsFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Which extended attributes a layer may set: `user.*` always; as root, `security.*` (file
/// capabilities, labels) and the POSIX ACLs (a default ACL only on a directory, the only
/// place it exists). `trusted.*` and the rest of `system.*` are the host's business.
fn xattr_wanted(name: &[u8], as_root: bool, is_dir: bool) -> bool {
    if name.starts_with(b"user.") {
        true
    } else if name.starts_with(b"security.") || name == b"system.posix_acl_access" {
        as_root
    } else if name == b"system.posix_acl_default" {
        as_root && is_dir
    } else {
        false
    }
}

/// A numeric header field. An empty one reads as 0, as Go's tar reader (Docker's, Podman's)
/// reads it.
fn number(value: io::Result<u64>, raw: &[u8]) -> Option<u64> {
    match value {
        Ok(n) => Some(n),
        Err(_) => raw.iter().all(|b| matches!(b, 0 | b' ')).then_some(0),
    }
}

/// A uid or gid as `chown` takes it: `u32::MAX` means "unchanged" there.
fn owner_id(id: u64) -> Option<u32> {
    u32::try_from(id).ok().filter(|id| *id != u32::MAX)
}

/// A PAX time: seconds, optionally negative, with an optional fraction (kept to the
/// nanosecond, as Go does).
fn pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds: i64 = whole.parse().ok()?;
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = &fraction.as_bytes()[..fraction.len().min(9)];
    let mut nanos = digits
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    for _ in digits.len()..9 {
        nanos *= 10;
    }
    Some(if whole.starts_with('-') && nanos > 0 {
        Timespec {
            tv_sec: seconds - 1,
            tv_nsec: 1_000_000_000 - nanos,
        }
    } else {
        Timespec {
            tv_sec: seconds,
            tv_nsec: nanos,
        }
    })
}

/// Access and modification time both `mtime`, as `podman` leaves them.
fn times(mtime: Timespec) -> Timestamps {
    Timestamps {
        last_access: mtime,
        last_modification: mtime,
    }
}

fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

fn id(stat: &Stat) -> (u64, u64) {
    (stat.st_dev, stat.st_ino)
}

/// Reads until `buf` is full or the stream ends.
fn fill(from: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = 0;
    while len < buf.len() {
        match from.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(len)
}

fn invalid(shown: &str, why: impl Display) -> Error {
    Error::Invalid(format!("Layer entry {shown:?} {why}"))
}

fn failed(shown: &str) -> impl FnOnce(Errno) -> Error + '_ {
    move |e| Error::Io {
        what: format!("Cannot unpack layer entry {shown:?}"),
        source: e.into(),
    }
}

fn resolve_error(shown: &str, e: Errno) -> Error {
    match e {
        Errno::NOTDIR => invalid(shown, "has a parent that is not a directory"),
        Errno::LOOP => invalid(shown, "has a parent behind too many symbolic links"),
        e => failed(shown)(e),
    }
}

/// A failure to read the layer. The tar crate, the decompressors and [`Budgeted`] report a
/// malformed stream with these kinds: the layer's fault. Any other kind is the machine's.
fn read_error(context: String, e: io::Error) -> Error {
    use io::ErrorKind as K;
    match e.kind() {
        K::InvalidData | K::InvalidInput | K::UnexpectedEof | K::Other => {
            Error::Invalid(format!("{context}: {e}"))
        }
        _ => Error::Io {
            what: context,
            source: e,
        },
    }
}
