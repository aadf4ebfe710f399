//! What a directory capture may read of a running sandbox's view: only what the sandbox's own
//! root could read there, and nothing of a pseudo-filesystem.
//!
//! A directory snapshot reads the sandbox's view through `/proc/<pid>/root` as the daemon, host
//! root, whose capabilities reach every file. The sandbox's root has its capabilities only in
//! its user namespace: the kernel lets it override a file's permissions only when the file's
//! owner and group are both mapped in that namespace (`capable_wrt_inode_uidgid`); any other
//! file (the host's, bind-mounted or seen through `/sys`) it reads only as its mode allows
//! "other" (or its group, where the group is the sandbox root's). Without this check a
//! snapshot of `/sys/firmware/acpi/tables`, mounted into a second sandbox, handed it files the
//! first could not read. The same rule is applied here to every directory listed and every
//! file read, and a capture that meets a file the sandbox could not read fails, naming it,
//! rather than leave it out unseen.
//!
//! Pseudo-filesystems (`proc`, `sysfs`, `devpts`, cgroups, ...) describe the host's kernel,
//! not the sandbox's files, and their files change as they are read: a capture that reaches
//! one fails, and the paths `/proc`, `/sys` and `/dev` are refused before anything is read.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::ID_BLOCK;

/// The paths of a sandbox a directory snapshot refuses, with everything below them.
pub const REFUSED_PATHS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Filesystem types (`statfs`'s `f_type`) that hold no files of the sandbox's.
const PSEUDO_MAGICS: [i64; 16] = [
    0x9fa0,      // proc
    0x6265_6572, // sysfs
    0x1cd1,      // devpts
    0x6463_6762, // debugfs
    0x7472_6163, // tracefs
    0x7363_6673, // securityfs
    0x0027_e0eb, // cgroup
    0x6367_7270, // cgroup2
    0xcafe_4a11, // bpf
    0x6265_6570, // configfs
    0x6573_5546, // fusectl
    0x6165_676c, // pstore
    0xde5e_81e4, // efivarfs
    0x1980_0202, // mqueue
    0x4249_4e4d, // binfmt_misc
    0xf97c_ff8c, // selinuxfs
];

/// Whether the filesystem at `path` is a pseudo-filesystem.
pub fn is_pseudo(path: &Path) -> io::Result<bool> {
    let st = nix::sys::statfs::statfs(path).map_err(io::Error::from)?;
    let magic = st.filesystem_type().0 as i64;
    Ok(PSEUDO_MAGICS.contains(&magic))
}

/// Whether `path` (plain and absolute) is one of [`REFUSED_PATHS`] or below one.
pub fn is_refused_path(path: &str) -> bool {
    REFUSED_PATHS.iter().any(|p| {
        path == *p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// Why an entry may not be read.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The sandbox's root could not read it.
    Unreadable,
    /// It lies on a pseudo-filesystem.
    Pseudo,
    /// Its filesystem could not be told.
    Statfs(io::Error),
}

/// The sandbox's root as the kernel sees it: host ids `base..base+65536` are its own.
#[derive(Debug)]
pub(crate) struct GuestView {
    base: u32,
    /// The capture root's device; a directory on another is a mount, checked once per device.
    root_dev: Option<u64>,
    pseudo: HashMap<u64, bool>,
}

impl GuestView {
    pub(crate) fn new(base: u32) -> Self {
        Self {
            base,
            root_dev: None,
            pseudo: HashMap::new(),
        }
    }

    /// Checks the entry at `path` before the capture lists it (a directory) or reads it (a
    /// regular file); other entries are copied as what they are and read nothing.
    pub(crate) fn check(&mut self, path: &Path, meta: &fs::Metadata) -> Result<(), Refusal> {
        let want = if meta.is_dir() {
            let root = *self.root_dev.get_or_insert(meta.dev());
            if meta.dev() != root {
                let pseudo = match self.pseudo.get(&meta.dev()) {
                    Some(p) => *p,
                    None => {
                        let p = is_pseudo(path).map_err(Refusal::Statfs)?;
                        self.pseudo.insert(meta.dev(), p);
                        p
                    }
                };
                if pseudo {
                    return Err(Refusal::Pseudo);
                }
            }
            0o5
        } else if meta.is_file() {
            0o4
        } else {
            return Ok(());
        };
        if self.may(meta, want) {
            Ok(())
        } else {
            Err(Refusal::Unreadable)
        }
    }

    /// Whether the sandbox's root has the `want` bits (r = 4, x = 1) on the entry.
    fn may(&self, meta: &fs::Metadata, want: u32) -> bool {
        let mapped = |id: u32| id.checked_sub(self.base).is_some_and(|n| n < ID_BLOCK);
        if mapped(meta.uid()) && mapped(meta.gid()) {
            // CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH in its namespace.
            return true;
        }
        let mode = meta.mode();
        let bits = if meta.uid() == self.base {
            mode >> 6
        } else if meta.gid() == self.base {
            mode >> 3
        } else {
            mode
        } & 0o7;
        bits & want == want
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_refused_paths_and_what_is_below_them() {
        for p in ["/proc", "/sys/firmware/acpi/tables", "/dev", "/dev/shm"] {
            assert!(is_refused_path(p), "{p}");
        }
        for p in [
            "/procs",
            "/system",
            "/devices",
            "/workspace/sys",
            "/home/dev",
        ] {
            assert!(!is_refused_path(p), "{p}");
        }
    }

    #[test]
    fn proc_and_sys_are_pseudo_and_tmp_is_not() {
        assert!(is_pseudo(Path::new("/proc/self")).unwrap());
        assert!(is_pseudo(Path::new("/sys/kernel")).unwrap());
        assert!(!is_pseudo(&std::env::temp_dir()).unwrap());
    }

    /// As root: a file of the host's (unmapped owner) with no "other" read is refused; the
    /// same with "other" read, or owned inside the block, is allowed.
    #[test]
    fn the_sandbox_root_reads_its_own_files_and_the_world_readable_only() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: cannot give files away");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        fs::write(&f, b"x").unwrap();
        let base = 300_000;
        let view = |uid: u32, gid: u32, mode: u32| {
            std::os::unix::fs::chown(&f, Some(uid), Some(gid)).unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
            GuestView::new(base).check(&f, &fs::metadata(&f).unwrap())
        };
        assert!(matches!(view(0, 0, 0o400), Err(Refusal::Unreadable)));
        assert!(view(0, 0, 0o404).is_ok());
        assert!(view(base + 5, base, 0o000).is_ok());
        assert!(matches!(view(base + 5, 0, 0o000), Err(Refusal::Unreadable)));
        assert!(view(0, base, 0o040).is_ok());
    }
}
