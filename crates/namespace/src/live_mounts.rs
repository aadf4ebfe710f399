//! Mounting a directory snapshot into a sandbox that already runs, and unmounting it again
//! (Modal's `mount_image` / `unmount_image` after create).
//!
//! At create PID 1 mounts the snapshots before its pivot (see [`crate::snapshot_mounts`]);
//! a running sandbox's mount namespace is pivoted and owned by its user namespace, so a
//! helper forked from the daemon builds the same copy-on-write overlay detached and moves it
//! in:
//!
//! 1. still the daemon's identity: change into `state_dir/fs` (only host root may search the
//!    state directory), keep the idmapped trees of the layers (made before the fork);
//! 2. join the sandbox's user namespace and become its root, unshare a private mount
//!    namespace (owned by that user namespace, so overlayfs mounts there exactly as PID 1's
//!    did: same owner, same `userxattr`), attach the layer trees, build the overlay with the
//!    new mount API (`fsopen`/`fsconfig`/`fsmount`): a mount that belongs to no namespace;
//! 3. join the sandbox's mount namespace (root and cwd become the sandbox's `/`), walk the
//!    path one component at a time with `openat2` (no symlink, no magic link, never above
//!    the directory it starts from: the sandbox may have replaced any component), making the
//!    missing ones as the sandbox's root, and `move_mount` the overlay onto the last one.
//!
//! The sandbox's writes under the mount go to `state_dir/fs/mounts/<slot>/upper`, as at
//! create. Unmounting detaches the overlay and discards that layer.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libc::c_void;

use crate::LayerMount;
use crate::mounts::{c, c_path};
use crate::snapshot_mounts::{self, PathError};
use crate::state::State;

/// Why a mount into (or out of) a running sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("The sandbox is not running")]
    NotRunning,
    #[error(transparent)]
    Path(#[from] PathError),
    /// The layers cannot be mounted (not absolute directories a mount option can carry).
    #[error("Invalid mount")]
    Invalid(#[from] crate::snapshot_mounts::MountError),
    /// A component of the path in the sandbox is a file or a symlink.
    #[error("Mount path {0} crosses something that is not a directory")]
    NotADirectory(String),
    /// The path cannot carry a mount in the sandbox (a component cannot be made or opened:
    /// a read-only or pseudo filesystem, say).
    #[error("Cannot mount at {0}: {1}")]
    Unusable(String, String),
    /// Nothing is mounted at the path (unmount).
    #[error("Nothing is mounted at {0}")]
    NotMounted(String),
    #[error(transparent)]
    State(#[from] crate::state::Error),
    #[error("Cannot prepare {}", path.display())]
    Prepare {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Tree(#[from] crate::lifecycle::Error),
    #[error("Mounting into the sandbox failed: {0}")]
    Helper(String),
}

pub(crate) const FSOPEN_CLOEXEC: libc::c_uint = 1;
pub(crate) const FSCONFIG_SET_FLAG: libc::c_uint = 0;
pub(crate) const FSCONFIG_SET_STRING: libc::c_uint = 1;
pub(crate) const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
pub(crate) const FSMOUNT_CLOEXEC: libc::c_uint = 1;
pub(crate) const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
pub(crate) const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
/// The first line of the helper's error report when the path crosses a non-directory.
const NOT_A_DIRECTORY: &str = "not_a_directory";
const NOT_MOUNTED: &str = "not_mounted";
const UNUSABLE: &str = "unusable";

/// `struct open_how` for `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The live sandbox of `state_dir` and descriptors of its user and mount namespaces.
fn namespaces(state_dir: &Path) -> Result<(State, OwnedFd, OwnedFd), LiveError> {
    let st = State::load(state_dir)?
        .filter(State::is_alive)
        .ok_or(LiveError::NotRunning)?;
    let open = |ns: &str| {
        fs::File::open(format!("/proc/{}/ns/{ns}", st.pid))
            .map(OwnedFd::from)
            .map_err(|_| LiveError::NotRunning)
    };
    let (user, mnt) = (open("user")?, open("mnt")?);
    // The pid could have been reused between the load and the opens.
    if !st.is_alive() {
        return Err(LiveError::NotRunning);
    }
    Ok((st, user, mnt))
}

fn slot_dir(slot: usize) -> String {
    format!("mounts/{slot}")
}

/// Mounts `m` (its `slot` names its directories under `state_dir/fs`) into the running
/// sandbox of `state_dir`.
pub fn mount(state_dir: &Path, m: &LayerMount) -> Result<(), LiveError> {
    let comps: Vec<CString> = snapshot_mounts::components(&m.path)?
        .into_iter()
        .map(|s| CString::new(s.as_bytes()).expect("checked: no NUL"))
        .collect();
    snapshot_mounts::check_layers(m)?;
    let (st, userns, mntns) = namespaces(state_dir)?;
    let fs_dir = state_dir.join("fs");
    let slot = slot_dir(m.slot);
    let prepare = |source, path: &Path| LiveError::Prepare {
        path: path.to_owned(),
        source,
    };
    let root = fs_dir.join(&slot);
    // A layer left by an earlier mount of this slot (a failed unmount) must not show.
    match fs::remove_dir_all(&root) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(prepare(e, &root)),
        _ => {}
    }
    for (sub, mode) in snapshot_mounts::slot_directories(m) {
        let path = fs_dir.join(&sub);
        let made = match fs::DirBuilder::new().create(&path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && sub == "mounts" => Ok(()),
            other => other,
        };
        made.and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
        })
        .and_then(|()| {
            if st.rootless {
                Ok(())
            } else {
                std::os::unix::fs::lchown(&path, Some(st.root_uid), Some(st.root_uid))
            }
        })
        .map_err(|e| prepare(e, &path))?;
    }
    let trees = if st.rootless {
        Vec::new()
    } else {
        m.layers
            .iter()
            .map(|l| crate::mounts::idmapped_tree(l, &userns))
            .collect::<Result<Vec<_>, _>>()?
    };
    let lowers: Vec<String> = if st.rootless {
        m.layers
            .iter()
            .map(|l| l.to_string_lossy().into_owned())
            .collect()
    } else {
        (0..trees.len()).map(|i| format!("{slot}/l{i}")).collect()
    };
    let plan = MountPlan {
        workdir: c_path(&fs_dir),
        userns,
        mntns,
        attach: trees
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_raw_fd(), c(&format!("{slot}/l{i}"))))
            .collect(),
        lowerdir: c(&lowers.join(":")),
        upperdir: c(&format!("{slot}/upper")),
        workdir_ovl: c(&format!("{slot}/work")),
        comps,
    };
    let shown = m.path.display().to_string();
    run_helper(|err| mount_helper(&plan, err)).map_err(|e| helper_error(e, &shown))
}

/// Unmounts the mount of `slot` at `path` from the running sandbox of `state_dir` and
/// discards the sandbox's writes under it. A sandbox that no longer runs has nothing
/// mounted; its slot is discarded all the same.
pub fn unmount(state_dir: &Path, slot: usize, path: &Path) -> Result<(), LiveError> {
    let comps = snapshot_mounts::components(path)?;
    let discard = || {
        let dir = state_dir.join("fs").join(slot_dir(slot));
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LiveError::Prepare {
                path: dir,
                source: e,
            }),
            _ => Ok(()),
        }
    };
    let (_, userns, mntns) = match namespaces(state_dir) {
        Ok(ns) => ns,
        Err(LiveError::NotRunning) => return discard(),
        Err(e) => return Err(e),
    };
    let (last, parents) = comps.split_last().expect("components: never empty");
    let plan = UnmountPlan {
        userns,
        mntns,
        parents: parents
            .iter()
            .map(|s| CString::new(s.as_bytes()).expect("checked: no NUL"))
            .collect(),
        last: CString::new(last.as_bytes()).expect("checked: no NUL"),
    };
    let shown = path.display().to_string();
    run_helper(|err| unmount_helper(&plan, err)).map_err(|e| helper_error(e, &shown))?;
    discard()
}

fn helper_error(failure: HelperFailure, path: &str) -> LiveError {
    let text = match failure {
        HelperFailure::Reported(text) => text,
        HelperFailure::Spawn(what, e) => return LiveError::Helper(format!("{what}: {e}")),
        HelperFailure::Ended(status) => {
            return LiveError::Helper(format!("the helper ended with {status}"));
        }
    };
    match text.split_once('\n') {
        Some((NOT_A_DIRECTORY, _)) => LiveError::NotADirectory(path.to_owned()),
        Some((NOT_MOUNTED, _)) => LiveError::NotMounted(path.to_owned()),
        Some((UNUSABLE, why)) => LiveError::Unusable(path.to_owned(), why.to_owned()),
        _ => LiveError::Helper(text.replace('\n', ": ")),
    }
}

/// How a forked helper failed.
enum HelperFailure {
    /// The pipe or the child could not be made.
    Spawn(&'static str, nix::Error),
    /// The helper wrote `code\nwhat: errno` to its pipe.
    Reported(String),
    /// The helper ended without a report, this way.
    Ended(String),
}

/// What the mount helper needs, prepared before the fork.
struct MountPlan {
    workdir: CString,
    userns: OwnedFd,
    mntns: OwnedFd,
    attach: Vec<(RawFd, CString)>,
    lowerdir: CString,
    upperdir: CString,
    workdir_ovl: CString,
    comps: Vec<CString>,
}

struct UnmountPlan {
    userns: OwnedFd,
    mntns: OwnedFd,
    parents: Vec<CString>,
    last: CString,
}

/// Forks `helper` (which ends in `_exit`: it never returns) and returns the text it reported, if any.
fn run_helper(helper: impl FnOnce(RawFd)) -> Result<(), HelperFailure> {
    use nix::fcntl::OFlag;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| HelperFailure::Spawn("cannot create a pipe", e))?;
    // SAFETY: the child only makes system calls on data prepared before the fork (plus small
    // formatting allocations on error paths, which glibc's fork-aware malloc allows) and
    // never returns: `helper` ends in `_exit`.
    match unsafe { nix::unistd::fork() }.map_err(|e| HelperFailure::Spawn("cannot fork", e))? {
        nix::unistd::ForkResult::Child => {
            drop(err_r);
            helper(err_w.as_raw_fd());
            // SAFETY: `_exit` is always safe; the helpers end in it themselves.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(err_w);
            let mut text = String::new();
            let _ = fs::File::from(err_r).read_to_string(&mut text);
            let status = nix::sys::wait::waitpid(child, None);
            match status {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) if text.is_empty() => Ok(()),
                _ if !text.is_empty() => Err(HelperFailure::Reported(text)),
                other => Err(HelperFailure::Ended(format!("{other:?}"))),
            }
        }
    }
}

/// Writes `code\nwhat: <errno text>` to the error pipe and exits.
fn fail(err_fd: RawFd, code: &str, what: &str) -> ! {
    let errno = io::Error::last_os_error();
    let msg = format!("{code}\n{what}: {errno}");
    // SAFETY: writing a valid buffer to an fd we own; `_exit` never returns.
    unsafe {
        libc::write(err_fd, msg.as_ptr().cast::<c_void>(), msg.len());
        libc::_exit(1)
    }
}

fn check(ret: i64, err_fd: RawFd, what: &str) -> i64 {
    if ret < 0 {
        fail(err_fd, "error", what);
    }
    ret
}

/// Joins the sandbox's user namespace as its root (from the daemon's identity).
///
/// # Safety
/// Only in a freshly forked, single-threaded helper.
unsafe fn become_sandbox_root(userns: &OwnedFd, err: RawFd) {
    // SAFETY: plain system calls; see the function's contract.
    unsafe {
        check(
            libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER).into(),
            err,
            "setns user",
        );
        // Denied where the daemon wrote `deny` (rootless without subordinate ids): the
        // helper then keeps the one group it has, which is mapped.
        libc::setgroups(0, std::ptr::null());
        check(libc::setresgid(0, 0, 0).into(), err, "setresgid");
        check(libc::setresuid(0, 0, 0).into(), err, "setresuid");
    }
}

/// Opens directory `name` below `dir` without following any link.
///
/// # Safety
/// `dir` is an open directory descriptor.
unsafe fn open_below(dir: RawFd, name: &CString) -> RawFd {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH,
    };
    // SAFETY: a valid C string and a fully initialised `open_how` of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    crate::conv::c_int(ret)
}

/// Joins the sandbox's mount namespace and opens the directory `comps` names below its
/// root, a component at a time and never through a link; with `create`, missing directories
/// are made. Returns the directory (`O_PATH`); a component that cannot be opened ends the
/// helper with the code `code_of` gives its errno.
///
/// # Safety
/// Only in a forked helper that already joined the sandbox's user namespace.
unsafe fn walk_in_sandbox(
    mntns: &OwnedFd,
    comps: &[CString],
    create: bool,
    err: RawFd,
    code_of: fn(Option<i32>) -> &'static str,
) -> RawFd {
    // SAFETY: plain system calls on fds we hold and C strings that outlive them.
    unsafe {
        check(
            libc::setns(mntns.as_raw_fd(), libc::CLONE_NEWNS).into(),
            err,
            "setns mnt",
        );
        let mut dir = libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
        check(dir.into(), err, "open /");
        for comp in comps {
            let mut next = open_below(dir, comp);
            if create && next < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT)
            {
                if libc::mkdirat(dir, comp.as_ptr(), 0o755) < 0
                    && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    fail(err, UNUSABLE, &format!("mkdir {comp:?}"));
                }
                next = open_below(dir, comp);
            }
            if next < 0 {
                let code = code_of(io::Error::last_os_error().raw_os_error());
                fail(err, code, &format!("open {comp:?}"));
            }
            libc::close(dir);
            dir = next;
        }
        dir
    }
}

fn mount_helper(plan: &MountPlan, err: RawFd) -> ! {
    // SAFETY: (for every block in this function) plain system calls on fds and C strings
    // owned by `plan`, which outlives them; all pointers are valid for each call.
    unsafe {
        check(libc::chdir(plan.workdir.as_ptr()).into(), err, "chdir");
        become_sandbox_root(&plan.userns, err);
        check(libc::unshare(libc::CLONE_NEWNS).into(), err, "unshare");
        check(
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
            .into(),
            err,
            "make / private",
        );
        for (fd, target) in &plan.attach {
            let ret = libc::syscall(
                libc::SYS_move_mount,
                *fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            );
            check(ret, err, "attach a layer");
        }
        let fsfd = check(
            libc::syscall(libc::SYS_fsopen, c"overlay".as_ptr(), FSOPEN_CLOEXEC),
            err,
            "fsopen overlay",
        );
        let set = |key: &std::ffi::CStr, value: Option<&CString>| {
            let (cmd, v) = match value {
                Some(v) => (FSCONFIG_SET_STRING, v.as_ptr()),
                None => (FSCONFIG_SET_FLAG, std::ptr::null()),
            };
            let ret = libc::syscall(libc::SYS_fsconfig, fsfd, cmd, key.as_ptr(), v, 0);
            check(ret, err, &format!("overlay option {key:?}"));
        };
        set(c"lowerdir", Some(&plan.lowerdir));
        set(c"upperdir", Some(&plan.upperdir));
        set(c"workdir", Some(&plan.workdir_ovl));
        set(c"userxattr", None);
        let ret = libc::syscall(
            libc::SYS_fsconfig,
            fsfd,
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<c_void>(),
            0,
        );
        check(ret, err, "create the overlay");
        let mnt = crate::conv::c_int(libc::syscall(
            libc::SYS_fsmount,
            fsfd,
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NODEV,
        ));
        check(mnt.into(), err, "fsmount");
        let dir = walk_in_sandbox(&plan.mntns, &plan.comps, true, err, |errno| match errno {
            Some(libc::ENOTDIR | libc::ELOOP | libc::EXDEV) => NOT_A_DIRECTORY,
            _ => UNUSABLE,
        });
        let ret = libc::syscall(
            libc::SYS_move_mount,
            mnt,
            c"".as_ptr(),
            dir,
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        );
        if ret < 0 {
            fail(err, UNUSABLE, "move the overlay into the sandbox");
        }
        libc::_exit(0)
    }
}

fn unmount_helper(plan: &UnmountPlan, err: RawFd) -> ! {
    // SAFETY: (for every block in this function) as in `mount_helper`.
    unsafe {
        become_sandbox_root(&plan.userns, err);
        let dir = walk_in_sandbox(&plan.mntns, &plan.parents, false, err, |_| NOT_MOUNTED);
        check(libc::fchdir(dir).into(), err, "fchdir");
        if libc::umount2(plan.last.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) < 0 {
            let code = match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINVAL | libc::ENOENT | libc::ENOTDIR) => NOT_MOUNTED,
                _ => "error",
            };
            fail(err, code, "umount");
        }
        libc::_exit(0)
    }
}
