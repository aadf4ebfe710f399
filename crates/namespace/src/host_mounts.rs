//! Host folders and named volumes bind-mounted into a namespace sandbox: the one hole in the
//! jar, so it is opened with care.
//!
//! - The host path is opened by [`open_dir`] without following any symlink (`openat2` with
//!   `RESOLVE_NO_SYMLINKS`), as the caller (`setfsuid`/`setfsgid` and the caller's groups, on
//!   a thread of its own, so the kernel checks the caller's permissions, not the daemon's),
//!   and everything after works on that descriptor: a rename or a symlink swapped in later
//!   cannot redirect the mount.
//! - The mount is an `open_tree(OPEN_TREE_CLONE)` of that descriptor (the folder alone, not
//!   the mounts below it), made `nosuid`, `nodev` and, for `:ro`, read-only by
//!   `mount_setattr`, and id-mapped: a host folder's owner is the sandbox's user
//!   ([`SANDBOX_USER`]) inside, so what the sandbox writes belongs to that owner on the host;
//!   a volume keeps the sandbox's own ids. PID 1 attaches it after the pivot, so the target
//!   path resolves inside the sandbox's root.
//! - Inside, the kernel resolves paths within the sandbox's root: a symlink in the folder to
//!   `/etc/shadow` reaches the sandbox's file, `..` from the mount's root stays in the
//!   sandbox, and a hard link across the mount's edge is `EXDEV`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::child::{MountAttr, Step};
use crate::idmap::{Extent, IdMap};
use crate::mounts::c;

/// The sandbox's user (`belljar`), whom a host folder's owner becomes inside.
pub const SANDBOX_USER: u32 = 1000;

/// A host folder or volume to mount at a path of the sandbox.
#[derive(Debug, Clone)]
pub struct BindMount {
    /// The directory, as [`open_dir`] opened it (`O_PATH`).
    pub source: Arc<OwnedFd>,
    /// Absolute path in the sandbox; not `/`, without `.` or `..`.
    pub path: PathBuf,
    pub read_only: bool,
    /// The host uid and gid shown as [`SANDBOX_USER`] inside (a host folder's owner); `None`:
    /// the sandbox's own id map (a volume, whose files are stored with sandbox ids).
    pub owner: Option<(u32, u32)>,
}

impl PartialEq for BindMount {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.source, &other.source)
            && self.path == other.path
            && self.read_only == other.read_only
            && self.owner == other.owner
    }
}

/// Who opens a host folder: the kernel checks that caller's permissions on every component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opener {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Opener {
    /// The user `uid` with its primary group and supplementary groups from the host's
    /// user database (just `uid`'s own id as its group when it has no entry).
    pub fn for_uid(uid: u32) -> Self {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten();
        match user {
            Some(u) => {
                let name = CString::new(u.name.as_bytes()).unwrap_or_default();
                let groups = nix::unistd::getgrouplist(&name, u.gid)
                    .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                    .unwrap_or_else(|_| vec![u.gid.as_raw()]);
                Self {
                    uid,
                    gid: u.gid.as_raw(),
                    groups,
                }
            }
            None => Self {
                uid,
                gid: uid,
                groups: Vec::new(),
            },
        }
    }
}

/// Why a host folder cannot be mounted.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{} does not exist", .0.display())]
    NotFound(PathBuf),
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A component is a symlink: the daemon mounts only the path as given.
    #[error("{} goes through a symlink; give the path it points to", .0.display())]
    Symlink(PathBuf),
    #[error("The caller may not {what} {}", path.display())]
    Denied { path: PathBuf, what: &'static str },
    #[error("{} is not under a mount root the daemon allows", .0.display())]
    NotBeneath(PathBuf),
    #[error("{} cannot be mounted into a sandbox: {why}", path.display())]
    Forbidden { path: PathBuf, why: String },
    #[error("Cannot open {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl OpenError {
    /// Whether this is the caller's lack of permission (or a folder nobody may mount), as
    /// opposed to a path that does not exist or a host failure.
    pub fn is_denied(&self) -> bool {
        matches!(
            self,
            Self::Denied { .. } | Self::NotBeneath(_) | Self::Forbidden { .. }
        )
    }
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// `struct open_how` for `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn openat2(dir: i32, path: &Path, resolve: u64) -> io::Result<OwnedFd> {
    let p = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: a valid C path and an initialised `open_how` of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            p.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let fd = crate::conv::fd(fd)?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the calling thread may `mode` (`R_OK`...) the directory `fd`, as its fs ids.
fn access(fd: &OwnedFd, mode: i32) -> bool {
    // SAFETY: faccessat2 on a descriptor we own with an empty path.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    };
    ret == 0
}

/// Opens the directory `path` (absolute) for a mount, as `opener` (the daemon's own identity
/// when `None`), never through a symlink; with `beneath`, only below that root (opened by
/// the daemon), never `..` out of it. `write`: the caller must also be able to write it.
/// `forbidden`: directories (the daemon's own) that the folder may neither be inside of nor
/// contain.
pub fn open_dir(
    path: &Path,
    opener: Option<&Opener>,
    beneath: Option<&Path>,
    write: bool,
    forbidden: &[PathBuf],
) -> Result<OwnedFd, OpenError> {
    if !path.is_absolute() {
        return Err(OpenError::Forbidden {
            path: path.to_owned(),
            why: "not an absolute path".into(),
        });
    }
    let root = match beneath {
        Some(root) => {
            let rel = path
                .strip_prefix(root)
                .map_err(|_| OpenError::NotBeneath(path.to_owned()))?;
            let fd = openat2(libc::AT_FDCWD, root, 0).map_err(|source| OpenError::Io {
                path: root.to_owned(),
                source,
            })?;
            Some((fd, rel.to_owned()))
        }
        None => None,
    };
    let opener = opener.cloned();
    let opened = std::thread::scope(|s| {
        s.spawn(move || open_as(path, root, opener.as_ref(), write))
            .join()
            .unwrap_or_else(|_| {
                Err(OpenError::Io {
                    path: path.to_owned(),
                    source: io::Error::other("the opening thread panicked"),
                })
            })
    })?;
    check_allowed(&opened, path, forbidden)?;
    Ok(opened)
}

/// On a thread of its own, which ends with it: take the caller's fs ids and groups (the
/// kernel clears the thread's file capabilities when its fs uid leaves 0), open, check.
fn open_as(
    path: &Path,
    root: Option<(OwnedFd, PathBuf)>,
    opener: Option<&Opener>,
    write: bool,
) -> Result<OwnedFd, OpenError> {
    if let Some(o) = opener {
        // SAFETY: raw system calls change this thread's credentials only (glibc's wrappers
        // would change every thread's); the thread ends after this function.
        unsafe {
            let ok = libc::syscall(libc::SYS_setgroups, o.groups.len(), o.groups.as_ptr()) == 0;
            libc::syscall(libc::SYS_setfsgid, o.gid);
            libc::syscall(libc::SYS_setfsuid, o.uid);
            let (fsuid, fsgid) = (
                u32::try_from(libc::syscall(libc::SYS_setfsuid, u32::MAX)).ok(),
                u32::try_from(libc::syscall(libc::SYS_setfsgid, u32::MAX)).ok(),
            );
            if !ok || fsuid != Some(o.uid) || fsgid != Some(o.gid) {
                return Err(OpenError::Io {
                    path: path.to_owned(),
                    source: io::Error::other("cannot take the caller's identity"),
                });
            }
        }
    }
    let resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    let opened = match &root {
        Some((fd, rel)) if rel.as_os_str().is_empty() => {
            openat2(fd.as_raw_fd(), Path::new("."), resolve | RESOLVE_BENEATH)
        }
        Some((fd, rel)) => openat2(fd.as_raw_fd(), rel, resolve | RESOLVE_BENEATH),
        None => openat2(libc::AT_FDCWD, path, resolve),
    };
    let fd = opened.map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => OpenError::NotFound(path.to_owned()),
        Some(libc::ENOTDIR) => OpenError::NotADirectory(path.to_owned()),
        Some(libc::ELOOP) => OpenError::Symlink(path.to_owned()),
        Some(libc::EXDEV) => OpenError::NotBeneath(path.to_owned()),
        Some(libc::EACCES | libc::EPERM) => OpenError::Denied {
            path: path.to_owned(),
            what: "search the way to",
        },
        _ => OpenError::Io {
            path: path.to_owned(),
            source: e,
        },
    })?;
    if !access(&fd, libc::R_OK | libc::X_OK) {
        return Err(OpenError::Denied {
            path: path.to_owned(),
            what: "read",
        });
    }
    if write && !access(&fd, libc::W_OK) {
        return Err(OpenError::Denied {
            path: path.to_owned(),
            what: "write (mount it read-only with :ro)",
        });
    }
    Ok(fd)
}

/// Refuses `/`, the kernel's own filesystems, and the daemon's directories (inside them or
/// holding them), by where the opened directory really is.
fn check_allowed(fd: &OwnedFd, asked: &Path, forbidden: &[PathBuf]) -> Result<(), OpenError> {
    let deny = |why: String| {
        Err(OpenError::Forbidden {
            path: asked.to_owned(),
            why,
        })
    };
    let real =
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|source| {
            OpenError::Io {
                path: asked.to_owned(),
                source,
            }
        })?;
    if real == Path::new("/") {
        return deny("the host's root".into());
    }
    for kernel in ["/proc", "/sys", "/dev"] {
        if real.starts_with(kernel) {
            return deny(format!("{kernel} is the host kernel's"));
        }
    }
    // SAFETY: fstatfs into a zeroed struct on a descriptor we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes for the call; `fd` is open.
    let got = unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) };
    if got == 0 {
        const KERNEL_FS: [i64; 8] = [
            0x9fa0,      // proc
            0x6265_6572, // sysfs
            0x2762_3eca, // cgroup (v1)
            0x6367_7270, // cgroup2
            0x6462_6720, // debugfs
            0x7363_6673, // securityfs
            0xcafe_4a11, // bpf
            0x1373,      // devfs
        ];
        if KERNEL_FS.contains(&(st.f_type as i64)) {
            return deny("it is one of the kernel's own filesystems".into());
        }
    }
    for dir in forbidden {
        if real.starts_with(dir) || dir.starts_with(&real) {
            return deny(format!(
                "{} is the daemon's own (sandboxes, images, state)",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Refuses a mount path the sandbox cannot take: relative, `/`, `.` or `..` components, or
/// a place the sandbox's own set-up owns (`/proc`, `/sys`, `/dev`, `/run/belljar`, the agent).
pub fn check_path(path: &Path) -> Result<(), crate::snapshot_mounts::PathError> {
    crate::snapshot_mounts::components(path)?;
    for own in [
        "/proc",
        "/sys",
        "/dev",
        "/run/belljar",
        crate::AGENT_PATH_IN_SANDBOX,
    ] {
        if path.starts_with(own) {
            return Err(crate::snapshot_mounts::PathError::Reserved(
                path.to_owned(),
                own,
            ));
        }
    }
    Ok(())
}

/// The mount trees PID 1 attaches: each bind cloned, id-mapped and flagged. `userns` is the
/// sandbox's own (for volumes); `root_ids` the host uid and gid of the sandbox's root.
pub(crate) fn trees(
    binds: &[BindMount],
    userns: &OwnedFd,
    (root_uid, root_gid): (u32, u32),
) -> Result<Vec<OwnedFd>, crate::lifecycle::Error> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let fail = crate::lifecycle::Error::Idmap;
    binds
        .iter()
        .map(|b| {
            // SAFETY: open_tree on a descriptor we hold, with an empty path.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_open_tree,
                    b.source.as_raw_fd(),
                    c"".as_ptr(),
                    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as u32,
                )
            };
            let fd = crate::conv::fd(fd).map_err(fail)?;
            // SAFETY: the kernel just returned this fd; nobody else owns it.
            let tree = unsafe { OwnedFd::from_raw_fd(fd) };
            let owner_ns = match b.owner {
                Some((uid, gid)) => {
                    let one = |inside, outside| {
                        vec![Extent {
                            inside,
                            outside,
                            count: 1,
                        }]
                    };
                    let map = IdMap {
                        uids: one(uid, root_uid + SANDBOX_USER),
                        gids: one(gid, root_gid + SANDBOX_USER),
                        use_helpers: false,
                        deny_setgroups: false,
                    };
                    Some(map.create_namespace()?)
                }
                None => None,
            };
            let ns = owner_ns.as_ref().unwrap_or(userns);
            let mut set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
            if b.read_only {
                set |= MOUNT_ATTR_RDONLY;
            }
            let attr = MountAttr {
                attr_set: set,
                attr_clr: 0,
                propagation: 0,
                userns_fd: ns.as_raw_fd() as u64,
            };
            // SAFETY: mount_setattr on our detached tree with a valid, initialised attr.
            let ret = unsafe {
                libc::syscall(
                    libc::SYS_mount_setattr,
                    tree.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH,
                    &attr as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                )
            };
            if ret < 0 {
                return Err(fail(io::Error::last_os_error()));
            }
            Ok(tree)
        })
        .collect()
}

/// PID 1's steps after the pivot: make the path's missing directories (inside the sandbox's
/// root) and attach each tree there.
pub(crate) fn steps(binds: &[BindMount], trees: &[OwnedFd]) -> Vec<Step> {
    let mut steps = Vec::new();
    for (b, tree) in binds.iter().zip(trees) {
        let mut target = PathBuf::from("/");
        for comp in b.path.components().skip(1) {
            target.push(comp);
            steps.push(Step::Mkdir {
                path: c(&target.to_string_lossy()),
                mode: 0o755,
            });
        }
        steps.push(Step::Attach {
            fd: tree.as_raw_fd(),
            target: c(&target.to_string_lossy()),
        });
    }
    steps
}

/// A sized volume's filesystem: an ext4 file of `bytes` (`image`, made sparse once) mounted at
/// `mnt` in the host's mount namespace, so the kernel stops writes past the size (`ENOSPC`).
/// Mounted once and then shared by every sandbox that mounts the volume: a second
/// filesystem from the same file would corrupt it, so an image some loop device still reads
/// (a sandbox holds the last mount) is waited for, then refused ([`crate::disk::Error::Busy`]).
pub fn mount_volume_disk(image: &Path, mnt: &Path, bytes: u64) -> Result<(), crate::disk::Error> {
    use crate::disk;
    if disk::is_mount_point(mnt) {
        return Ok(());
    }
    if bytes < disk::MIN_DISK_BYTES {
        return Err(disk::Error::TooSmall(bytes));
    }
    if image.exists() {
        disk::wait_released(image, disk::RELEASE_TIMEOUT)?;
    } else {
        disk::create(image, bytes)?;
    }
    std::fs::create_dir_all(mnt).map_err(|source| disk::Error::Mount {
        path: mnt.to_owned(),
        source,
    })?;
    let device = disk::attach_loop(image)?;
    let result = nix::mount::mount(
        Some(device.path.as_path()),
        mnt,
        Some("ext4"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(disk::MOUNT_OPTIONS),
    );
    drop(device);
    result.map_err(|e| disk::Error::Mount {
        path: mnt.to_owned(),
        source: e.into(),
    })
}

/// Unmounts a sized volume's filesystem (before the volume is removed); no sandbox may
/// mount it any more.
pub fn unmount_volume_disk(mnt: &Path) {
    if crate::disk::is_mount_point(mnt) {
        let _ = nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths() {
        for ok in ["/workspace", "/home/belljar/project", "/run/other"] {
            check_path(Path::new(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "/",
            "rel",
            "/a/../b",
            "/proc/x",
            "/dev",
            "/run/belljar/x",
            "/sbin/belljar-agent",
        ] {
            assert!(check_path(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn opening_refuses_symlinks_and_the_daemons_own_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("link")).unwrap();
        open_dir(&real, None, None, true, &[]).unwrap();
        assert!(matches!(
            open_dir(&tmp.path().join("link"), None, None, true, &[]),
            Err(OpenError::Symlink(_))
        ));
        assert!(matches!(
            open_dir(&tmp.path().join("gone"), None, None, true, &[]),
            Err(OpenError::NotFound(_))
        ));
        let own = [real.join("state")];
        assert!(
            open_dir(&real, None, None, true, &own)
                .unwrap_err()
                .is_denied()
        );
        assert!(
            open_dir(Path::new("/"), None, None, false, &[])
                .unwrap_err()
                .is_denied()
        );
        assert!(
            open_dir(Path::new("/proc/sys"), None, None, false, &[])
                .unwrap_err()
                .is_denied()
        );
        // Beneath a root: inside is fine, outside is refused.
        open_dir(&real, None, Some(tmp.path()), true, &[]).unwrap();
        assert!(matches!(
            open_dir(Path::new("/etc"), None, Some(tmp.path()), false, &[]),
            Err(OpenError::NotBeneath(_))
        ));
    }

    #[test]
    fn the_callers_permissions_decide() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: skipped");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("private");
        std::fs::create_dir(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = Opener {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        assert!(matches!(
            open_dir(&dir, Some(&nobody), None, false, &[]),
            Err(OpenError::Denied { .. })
        ));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        open_dir(&dir, Some(&nobody), None, false, &[]).unwrap();
        assert!(matches!(
            open_dir(&dir, Some(&nobody), None, true, &[]),
            Err(OpenError::Denied { .. })
        ));
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        open_dir(&dir, Some(&nobody), None, true, &[]).unwrap();
        // The daemon's own thread kept root's identity.
        assert_eq!(nix::unistd::geteuid().as_raw(), 0);
    }
}
