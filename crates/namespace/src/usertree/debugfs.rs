//! The per-user image copy through `debugfs` (e2fsprogs), and what its `rdump` leaves out put
//! back from the image itself.
//!
//! `rdump` copies the data about seven times faster than `ext4_view` (which matters under
//! emulation), but it writes each name of a hard-linked file as a file of its own (so every
//! link costs its size again and a write through one name no longer shows through the other)
//! and it drops extended attributes, so a file capability (`security.capability`: how a
//! package lets `ping` or a server bind a low port without setuid) would be lost. The same
//! `debugfs` lists the image's directories by inode (`ls -p <ino>`, one batch per depth, so no
//! path ever needs quoting), which gives the links, and reads each inode's attributes
//! (`ea_list`, then `ea_get -f` for the few that have some).
//!
//! This runs as root of the sandbox's user namespace. There the kernel lets the copy's owner
//! set a file capability and records it (version 3) as valid in namespaces whose root is this
//! user's uid — every rootless sandbox of this user, and none of anyone else's.
//!
//! Copied: `security.capability`, `user.*` and POSIX ACLs. Not copied: `trusted.*` (only
//! `CAP_SYS_ADMIN` on the host may set them), other `security.*` names (labels of an LSM that a
//! sandbox does not load) and `system.data` (ext4's inline data, not an attribute).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{UnpackError, copy_err};

/// An [`UnpackError::Debugfs`] with what the tool printed (or why it could not run).
fn failed(tool: &Path, detail: impl AsRef<str>) -> UnpackError {
    UnpackError::Debugfs {
        tool: tool.to_owned(),
        detail: detail.as_ref().trim().to_owned(),
    }
}

/// ext4's root directory inode.
const ROOT_INO: u32 = 2;
const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;

/// `debugfs` from e2fsprogs; often outside an ordinary user's `PATH` (`/usr/sbin`).
pub(super) fn debugfs() -> Option<PathBuf> {
    ["/usr/sbin/debugfs", "/sbin/debugfs"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|d| d.join("debugfs"))
                .find(|p| p.is_file())
        })
}

/// A path inside a `debugfs` command, in double quotes (its parser's only quoting).
fn quoted(path: &Path) -> Result<String, UnpackError> {
    let text = path.to_string_lossy();
    if text.contains('"') {
        return Err(UnpackError::Unquotable(text.into_owned()));
    }
    Ok(format!("\"{text}\""))
}

/// `debugfs -R 'rdump / DEST' IMAGE`: the image's root directory's contents into `dest`.
pub(super) fn rdump(debugfs: &Path, ext4: &Path, dest: &Path) -> Result<(), UnpackError> {
    let out = std::process::Command::new(debugfs)
        .arg("-R")
        .arg(format!("rdump / {}", quoted(dest)?))
        .arg(ext4)
        .output()
        .map_err(|e| failed(debugfs, e.to_string()))?;
    if !out.status.success() {
        return Err(failed(debugfs, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// Runs the commands of `script` (one per line) in one `debugfs` process; its standard output,
/// where each command's output follows a `debugfs: COMMAND` line. The script goes through a
/// file in `scratch`: this runs in a forked child, where a writer thread is best avoided.
fn batch(
    debugfs: &Path,
    ext4: &Path,
    scratch: &Path,
    script: &str,
) -> Result<Vec<u8>, UnpackError> {
    let file = scratch.join("debugfs-commands");
    fs::write(&file, script).map_err(copy_err(&file))?;
    let out = std::process::Command::new(debugfs)
        .arg("-f")
        .arg(&file)
        .arg(ext4)
        .output()
        .map_err(|e| failed(debugfs, e.to_string()))?;
    let _ = fs::remove_file(&file);
    if !out.status.success() {
        return Err(failed(debugfs, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(out.stdout)
}

/// One name in the image: its path below the root, its inode and mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub path: PathBuf,
    pub ino: u32,
    pub mode: u32,
}

/// The inode a `debugfs: CMD <ino>` echo line names, for lines of command `cmd`.
fn echoed_ino(line: &[u8], cmd: &str) -> Option<u32> {
    let rest = line.strip_prefix(format!("debugfs: {cmd} <").as_bytes())?;
    let end = rest.iter().position(|b| *b == b'>')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// One line of `ls -p`: `/INO/MODE/UID/GID/NAME/SIZE/`. A name holding a newline splits its
/// line in two, neither of which parses, so such an entry is left out, never misread.
fn parse_ls(line: &[u8]) -> Option<(u32, u32, &[u8])> {
    let inner = line.strip_prefix(b"/")?.strip_suffix(b"/")?;
    let mut fields = inner.splitn(5, |b| *b == b'/');
    let number = |f: Option<&[u8]>, radix| {
        std::str::from_utf8(f?)
            .ok()
            .and_then(|t| u32::from_str_radix(t, radix).ok())
    };
    let ino = number(fields.next(), 10)?;
    let mode = number(fields.next(), 8)?;
    fields.next()?;
    fields.next()?;
    let rest = fields.next()?;
    let cut = rest.iter().rposition(|b| *b == b'/')?;
    Some((ino, mode, &rest[..cut]))
}

/// Every name below the image's root (but `lost+found`), listed breadth first, one `debugfs`
/// run per depth.
pub(super) fn list(debugfs: &Path, ext4: &Path, scratch: &Path) -> Result<Vec<Entry>, UnpackError> {
    let mut entries = Vec::new();
    let mut seen = HashSet::from([ROOT_INO]);
    let mut level = vec![(ROOT_INO, PathBuf::new())];
    while !level.is_empty() {
        let script: String = level
            .iter()
            .map(|(ino, _)| format!("ls -p <{ino}>\n"))
            .collect();
        let out = batch(debugfs, ext4, scratch, &script)?;
        let dirs: HashMap<u32, PathBuf> = level.drain(..).collect();
        let mut current = None;
        for line in out.split(|b| *b == b'\n') {
            if let Some(ino) = echoed_ino(line, "ls -p") {
                current = dirs.get(&ino);
                continue;
            }
            let (Some(dir), Some((ino, mode, name))) = (current, parse_ls(line)) else {
                continue;
            };
            let top = dir.as_os_str().is_empty();
            if name == b"." || name == b".." || (top && name == b"lost+found") {
                continue;
            }
            let path = dir.join(OsStr::from_bytes(name));
            // A directory seen twice would be a corrupt image's loop.
            if mode & S_IFMT == S_IFDIR && seen.insert(ino) {
                level.push((ino, path.clone()));
            }
            entries.push(Entry { path, ino, mode });
        }
    }
    Ok(entries)
}

/// Makes every further name of a hard-linked regular file a link to its first name again.
/// Returns the directories whose entries changed (their times need setting back).
pub(super) fn relink(entries: &[Entry], dest: &Path) -> Result<BTreeSet<PathBuf>, UnpackError> {
    let mut first: HashMap<u32, &Path> = HashMap::new();
    let mut touched = BTreeSet::new();
    for e in entries.iter().filter(|e| e.mode & S_IFMT == S_IFREG) {
        let Some(original) = first.get(&e.ino) else {
            first.insert(e.ino, &e.path);
            continue;
        };
        let to = dest.join(&e.path);
        fs::remove_file(&to).map_err(copy_err(&to))?;
        fs::hard_link(dest.join(original), &to).map_err(copy_err(&to))?;
        touched.insert(e.path.parent().map(Path::to_owned).unwrap_or_default());
    }
    Ok(touched)
}

/// The attributes a rootless copy keeps (see the module's comment).
fn kept(name: &str) -> bool {
    name == "security.capability"
        || name.starts_with("user.")
        || name == "system.posix_acl_access"
        || name == "system.posix_acl_default"
}

/// The names `ea_list` printed for each inode: `  NAME (LEN) = VALUE` under its echo line.
fn parse_ea_list(out: &[u8]) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let mut current = None;
    for line in out.split(|b| *b == b'\n') {
        if let Some(ino) = echoed_ino(line, "ea_list") {
            current = Some(ino);
            continue;
        }
        let (Some(ino), Some(rest)) = (current, line.strip_prefix(b"  ")) else {
            continue;
        };
        let Some(end) = rest.windows(2).position(|w| w == b" (") else {
            continue;
        };
        if let Ok(name) = std::str::from_utf8(&rest[..end]) {
            found.push((ino, name.to_owned()));
        }
    }
    found
}

/// Sets on the copy the kept attributes of every inode of `entries` (and of the root), read
/// from the image. Returns how many were set.
pub(super) fn copy_xattrs(
    debugfs: &Path,
    ext4: &Path,
    entries: &[Entry],
    dest: &Path,
    scratch: &Path,
) -> Result<usize, UnpackError> {
    let mut path_of: HashMap<u32, PathBuf> = HashMap::from([(ROOT_INO, PathBuf::new())]);
    for e in entries {
        path_of.entry(e.ino).or_insert_with(|| e.path.clone());
    }
    let mut inodes: Vec<u32> = path_of.keys().copied().collect();
    inodes.sort_unstable();
    let script: String = inodes
        .iter()
        .map(|ino| format!("ea_list <{ino}>\n"))
        .collect();
    let listed = parse_ea_list(&batch(debugfs, ext4, scratch, &script)?);
    let wanted: Vec<(u32, String)> = listed.into_iter().filter(|(_, n)| kept(n)).collect();
    if wanted.is_empty() {
        return Ok(0);
    }
    let mut script = String::new();
    for (i, (ino, name)) in wanted.iter().enumerate() {
        if name.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\') {
            return Err(UnpackError::Unquotable(format!("inode {ino}'s {name:?}")));
        }
        let file = quoted(&scratch.join(format!("xattr-{i}")))?;
        script.push_str(&format!("ea_get -f {file} <{ino}> {name}\n"));
    }
    batch(debugfs, ext4, scratch, &script)?;
    let mut set = 0;
    for (i, (ino, name)) in wanted.iter().enumerate() {
        let file = scratch.join(format!("xattr-{i}"));
        let value = fs::read(&file).map_err(copy_err(&file))?;
        let _ = fs::remove_file(&file);
        let to = dest.join(&path_of[ino]);
        match crate::layer::xattr::set_xattr(&to, OsStr::new(name), &value) {
            Ok(()) => set += 1,
            // A filesystem without user attributes or ACLs (tmpfs before Linux 6.6) under the
            // cache: the sandbox could not have kept them either. A capability is never
            // dropped silently.
            Err(e)
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) && name != "security.capability" => {}
            Err(source) => {
                return Err(UnpackError::Attribute {
                    path: to,
                    name: name.clone(),
                    source,
                });
            }
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls_lines_parse_and_broken_ones_are_left_out() {
        assert_eq!(
            parse_ls(b"/12/100644/0/0/a b/3/"),
            Some((12, 0o100644, &b"a b"[..]))
        );
        assert_eq!(
            parse_ls(b"/13/040755/1000/1000/d//"),
            Some((13, 0o040755, &b"d"[..]))
        );
        // A name with a newline: `/14/100644/0/0/x` and `y/5/`.
        assert_eq!(parse_ls(b"/14/100644/0/0/x"), None);
        assert_eq!(parse_ls(b"y/5/"), None);
        assert_eq!(parse_ls(b""), None);
        assert_eq!(echoed_ino(b"debugfs: ls -p <575>", "ls -p"), Some(575));
        assert_eq!(echoed_ino(b"debugfs: ea_list <9>", "ls -p"), None);
    }

    #[test]
    fn ea_list_output_names_each_inodes_attributes() {
        let out =
            b"debugfs: ea_list <12>\nExtended attributes:\n  user.foo (5) = 62 61 72 00 01 \n\
                    debugfs: ea_list <13>\ndebugfs: ea_list <14>\nExtended attributes:\n  \
                    security.capability (20) = 01 00 00 02 \n  system.data (0)\n";
        assert_eq!(
            parse_ea_list(out),
            [
                (12, "user.foo".to_owned()),
                (14, "security.capability".to_owned()),
                (14, "system.data".to_owned())
            ]
        );
        assert!(kept("security.capability") && kept("user.foo"));
        assert!(!kept("system.data") && !kept("trusted.overlay.opaque"));
    }
}
