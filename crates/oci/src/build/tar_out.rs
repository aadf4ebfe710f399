//! Writing OCI layer tars: the entries a build step made, in a stable order and with stable
//! headers, so that the same files always give the same bytes (and the same diff id).
//!
//! A captured writable layer ([`overlay_layer`]) is in overlayfs's form: a whiteout is a
//! character device 0:0 and an opaque directory carries `user.overlay.opaque`. They become
//! the OCI spec's `.wh.NAME` and `.wh..wh..opq` entries.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// An entry's owner, mode and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u64,
}

impl Meta {
    pub fn of(m: &fs::Metadata) -> Self {
        Self {
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            mtime: m.mtime().max(0) as u64,
        }
    }
}

/// A layer tar being written.
pub struct TarOut<W: Write> {
    builder: tar::Builder<W>,
}

impl<W: Write> TarOut<W> {
    pub fn new(out: W) -> Self {
        let mut builder = tar::Builder::new(out);
        builder.mode(tar::HeaderMode::Complete);
        builder.follow_symlinks(false);
        Self { builder }
    }

    fn header(kind: tar::EntryType, meta: &Meta, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(meta.mode);
        h.set_uid(meta.uid.into());
        h.set_gid(meta.gid.into());
        h.set_mtime(meta.mtime);
        h.set_size(size);
        h
    }

    /// Extended attributes as a PAX header before the entry they belong to.
    fn xattrs(&mut self, path: &[u8], xattrs: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
        if xattrs.is_empty() {
            return Ok(());
        }
        let mut data = Vec::new();
        for (name, value) in xattrs {
            let mut key = b"SCHILY.xattr.".to_vec();
            key.extend_from_slice(name);
            data.extend(pax_record(&key, value));
        }
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        let mut name = b"PaxHeaders/".to_vec();
        name.extend(path.iter().rev().take(80).rev());
        self.builder.append_data(
            &mut h,
            Path::new(std::ffi::OsStr::from_bytes(&name)),
            &data[..],
        )
    }

    pub fn dir(
        &mut self,
        path: &[u8],
        meta: &Meta,
        xattrs: &[(Vec<u8>, Vec<u8>)],
    ) -> io::Result<()> {
        self.xattrs(path, xattrs)?;
        let mut h = Self::header(tar::EntryType::Directory, meta, 0);
        let mut name = path.to_vec();
        name.push(b'/');
        self.builder
            .append_data(&mut h, os_path(&name), io::empty())
    }

    pub fn file(
        &mut self,
        path: &[u8],
        meta: &Meta,
        size: u64,
        data: impl Read,
        xattrs: &[(Vec<u8>, Vec<u8>)],
    ) -> io::Result<()> {
        self.xattrs(path, xattrs)?;
        let mut h = Self::header(tar::EntryType::Regular, meta, size);
        // A file that shrinks while read would make a short entry: read exactly `size`.
        let mut limited = data.take(size);
        let mut padded = Padded {
            inner: &mut limited,
            left: size,
        };
        self.builder.append_data(&mut h, os_path(path), &mut padded)
    }

    /// The regular file or symbolic link at `p` (of metadata `m`) as entry `path`; a file
    /// whose inode an earlier entry of `links` had becomes a hard link to it.
    pub fn entry_of(
        &mut self,
        path: &[u8],
        p: &Path,
        m: &fs::Metadata,
        links: &mut HashMap<(u64, u64), Vec<u8>>,
    ) -> io::Result<()> {
        let meta = Meta::of(m);
        if m.file_type().is_symlink() {
            let target = fs::read_link(p)?;
            return self.symlink(path, &meta, target.as_os_str().as_bytes());
        }
        if let Some(first) = links.get(&(m.dev(), m.ino())) {
            return self.hardlink(path, &meta, first);
        }
        links.insert((m.dev(), m.ino()), path.to_vec());
        let file = fs::File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(p)?;
        self.file(path, &meta, m.len(), file, &kept_xattrs(p))
    }

    pub fn symlink(&mut self, path: &[u8], meta: &Meta, target: &[u8]) -> io::Result<()> {
        let mut h = Self::header(tar::EntryType::Symlink, meta, 0);
        self.builder
            .append_link(&mut h, os_path(path), os_path(target))
    }

    pub fn hardlink(&mut self, path: &[u8], meta: &Meta, target: &[u8]) -> io::Result<()> {
        let mut h = Self::header(tar::EntryType::Link, meta, 0);
        self.builder
            .append_link(&mut h, os_path(path), os_path(target))
    }

    /// `.wh.NAME` beside the entry it hides (or `.wh..wh..opq` with `name` empty).
    pub fn whiteout(&mut self, parent: &[u8], name: &[u8]) -> io::Result<()> {
        let mut path = parent.to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(b".wh.");
        path.extend_from_slice(if name.is_empty() { b".wh..opq" } else { name });
        let meta = Meta {
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
        };
        let mut h = Self::header(tar::EntryType::Regular, &meta, 0);
        self.builder
            .append_data(&mut h, os_path(&path), io::empty())
    }

    pub fn finish(self) -> io::Result<W> {
        self.builder.into_inner()
    }
}

/// Gives exactly `left` bytes: the reader's, then zeros if it ended early.
struct Padded<'a, R> {
    inner: &'a mut R,
    left: u64,
}

impl<R: Read> Read for Padded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let left = usize::try_from(self.left).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        let mut n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn os_path(bytes: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(bytes))
}

/// One PAX record: `<len> <key>=<value>\n`, the length counting itself.
fn pax_record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} ").into_bytes();
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

/// The extended attributes a layer keeps (what the unpacker restores), without overlayfs's
/// own marks.
pub fn kept_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut names = vec![0u8; 64 << 10];
    let Ok(n) = rustix::fs::llistxattr(path, &mut names[..]) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let wanted = (name.starts_with(b"user.") && !name.starts_with(b"user.overlay."))
            || name == b"security.capability";
        if !wanted {
            continue;
        }
        let mut value = vec![0u8; 64 << 10];
        if let Ok(len) = rustix::fs::lgetxattr(path, name, &mut value[..]) {
            out.push((name.to_vec(), value[..len].to_vec()));
        }
    }
    out
}

fn is_opaque(path: &Path) -> bool {
    let mut v = [0u8; 4];
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|n| rustix::fs::lgetxattr(path, *n, &mut v[..]).is_ok_and(|len| v[..len] == *b"y"))
}

/// Writes the captured writable layer `dir` (overlayfs's form, owners already the image's)
/// as an OCI layer tar. Paths in `skip` (relative, as `etc/hosts`) are left out: what the
/// sandbox's set-up wrote there is not the step's.
pub fn overlay_layer<W: Write>(dir: &Path, out: W, skip: &[&str]) -> Result<W, Error> {
    let mut tar = TarOut::new(out);
    let failed = |p: &Path| {
        let shown = p.display().to_string();
        move |e: io::Error| Error::Io {
            what: format!("Cannot read {shown}"),
            source: e,
        }
    };
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(dir.to_owned(), Vec::new())];
    while let Some((path, rel)) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&path)
            .map_err(failed(&path))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(failed(&path))?;
        names.sort();
        // Directories are walked after this one's entries, in order (the stack is LIFO).
        let mut subdirs = Vec::new();
        for name in names {
            let p = path.join(&name);
            let r = super::copy::join(&rel, name.as_bytes());
            if skip.iter().any(|s| s.as_bytes() == r.as_slice()) {
                continue;
            }
            let m = fs::symlink_metadata(&p).map_err(failed(&p))?;
            let meta = Meta::of(&m);
            let ft = m.file_type();
            if ft.is_char_device() && m.rdev() == 0 {
                tar.whiteout(&rel, name.as_bytes()).map_err(failed(&p))?;
            } else if ft.is_dir() {
                tar.dir(&r, &meta, &kept_xattrs(&p)).map_err(failed(&p))?;
                if is_opaque(&p) {
                    tar.whiteout(&r, b"").map_err(failed(&p))?;
                }
                subdirs.push((p, r));
            } else if ft.is_symlink() || ft.is_file() {
                tar.entry_of(&r, &p, &m, &mut links).map_err(failed(&p))?;
            }
            // Devices, fifos and sockets a step made are left out, as the unpacker would.
        }
        stack.extend(subdirs.into_iter().rev());
    }
    tar.finish().map_err(|e| Error::Io {
        what: "Cannot write the layer".into(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        let r = pax_record(b"SCHILY.xattr.user.a", b"v");
        let text = String::from_utf8(r.clone()).unwrap();
        let len: usize = text.split(' ').next().unwrap().parse().unwrap();
        assert_eq!(len, r.len());
    }

    #[test]
    fn an_overlay_layer_becomes_an_oci_tar() {
        let t = tempfile::tempdir().unwrap();
        let up = t.path().join("up");
        fs::create_dir_all(up.join("etc/opq")).unwrap();
        fs::write(up.join("etc/new"), b"hi").unwrap();
        fs::hard_link(up.join("etc/new"), up.join("etc/twin")).unwrap();
        fs::write(up.join("etc/hosts"), b"sandbox's").unwrap();
        std::os::unix::fs::symlink("new", up.join("etc/link")).unwrap();
        let _ = rustix::fs::lsetxattr(
            up.join("etc/opq"),
            "user.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        );
        let tar = overlay_layer(&up, Vec::new(), &["etc/hosts"]).unwrap();
        let mut a = tar::Archive::new(&tar[..]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert!(names.contains(&"etc/new".to_owned()), "{names:?}");
        assert!(names.contains(&"etc/twin".to_owned()), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("hosts")), "{names:?}");
        assert_eq!(names.iter().position(|n| n == "etc/"), Some(0), "{names:?}");
        // The same tree, the same bytes.
        assert_eq!(overlay_layer(&up, Vec::new(), &["etc/hosts"]).unwrap(), tar);
    }
}
