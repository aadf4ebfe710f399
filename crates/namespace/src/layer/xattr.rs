//! Extended attributes and times of paths that must not be followed (every path in a layer
//! or a writable layer may be a symlink a sandbox planted): the `l*xattr` calls and
//! `utimensat` with `AT_SYMLINK_NOFOLLOW`, which std does not offer.

use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::mounts;

pub(super) fn set_times(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    let p = mounts::c_path(path);
    let times = [
        libc::timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec(),
        },
        libc::timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec(),
        },
    ];
    // SAFETY: a valid C path and two initialised timespecs; no symlink is followed.
    let ret = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn list_xattrs(path: &Path) -> io::Result<Vec<OsString>> {
    let p = mounts::c_path(path);
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: a valid C path and a buffer of `buf.len()` writable bytes.
        let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    }
    Ok(buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| OsString::from_vec(n.to_vec()))
        .collect())
}

pub(crate) fn get_xattr(path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
    let p = mounts::c_path(path);
    let n = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: valid C strings and a buffer of `buf.len()` writable bytes.
        let len =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if len >= 0 {
            buf.truncate(len as usize);
            return Ok(Some(buf));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < 1 << 16 => buf.resize(buf.len() * 16, 0),
            Some(libc::ENODATA) => return Ok(None),
            _ => return Err(e),
        }
    }
}

pub(crate) fn set_xattr(path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()> {
    let p = mounts::c_path(path);
    let n = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    // SAFETY: valid C strings and a value buffer of `value.len()` readable bytes.
    let ret = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn remove_xattr(path: &Path, name: &OsStr) -> io::Result<()> {
    let p = mounts::c_path(path);
    let n = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    // SAFETY: valid C strings; no symlink is followed.
    let ret = unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) };
    if ret != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENODATA) {
            return Err(e);
        }
    }
    Ok(())
}
