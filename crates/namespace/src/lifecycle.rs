//! The life of one namespace sandbox: launch, adopt, stop, destroy, freeze, usage.
//!
//! State directory layout (all made by [`launch`]):
//!
//! ```text
//! state_dir/            0700, host root (or the rootless user); the sandbox reaches none of it
//!   sandbox.json        pid, start time, cgroups, limits report (see `state`)
//!   sandbox.pid         the pid alone
//!   idblock             first host uid/gid of the sandbox's 65536 ids (root only)
//!   agent.log           the agent's stdout and stderr
//!   agent.sock          the agent's listening socket, bound here and passed to PID 1
//!   disk.ext4           the sandbox's disk (root only), mounted at fs/
//!   fs/                 owned by the sandbox's root uid; PID 1 resolves the mounts from here
//!     upper/ work/      the overlay's writable layer
//!     lower/            where the idmapped image is attached (root only)
//!     merged/           the overlay mount point, the sandbox's `/`
//!     run/              bind-mounted at /run/belljar inside: the sandbox may change anything
//!                       here, so the host never opens a path below fs/
//! ```

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::Uid;

use crate::cgroup::{self, Groups, Hierarchies, Usage};
use crate::child::{self, MountAttr, Plan, Step};
use crate::idmap::{self, IdMap};
use crate::state::{self, State, start_time};
use crate::{AGENT_PATH_IN_SANDBOX, AGENT_SOCKET, Running, SandboxSpec, disk};

pub use crate::state::ExitWatch;

/// Errors of the sandbox lifecycle.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Invalid sandbox spec: {0}")]
    Spec(String),
    #[error("The sandbox is already running as pid {0}")]
    AlreadyRunning(u32),
    #[error("Cannot prepare {}", path.display())]
    Prepare {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    UserNamespace(#[from] idmap::Error),
    #[error("Cannot build the seccomp filter")]
    Seccomp(#[from] crate::seccomp::Error),
    #[error("Cannot show the image to the sandbox through an idmapped mount")]
    Idmap(#[source] io::Error),
    #[error(transparent)]
    Start(#[from] child::Error),
    #[error(transparent)]
    State(#[from] state::Error),
    #[error(transparent)]
    Cgroup(#[from] cgroup::Error),
    #[error("Cannot signal the sandbox")]
    Signal(#[source] io::Error),
    #[error("The sandbox did not exit after SIGKILL")]
    Unkillable,
    #[error("The sandbox is not running")]
    NotRunning,
    #[error("Cannot remove {}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("The agent socket {} did not accept connections within {waited:?}", path.display())]
    NotReady { path: PathBuf, waited: Duration },
    #[error(transparent)]
    Disk(#[from] disk::Error),
}

/// First host uid of the id blocks handed to sandboxes when running as root.
const ID_BASE: u32 = 1_000_000_000;
/// Number of id blocks; `ID_BASE + SLOTS * 65536` stays below 2^32 - 2^16.
const SLOTS: u32 = 45_000;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Starts a sandbox and returns once its PID 1 has exec'd the agent.
pub fn launch(spec: &SandboxSpec) -> Result<Running, Error> {
    validate(spec)?;
    let dir = &spec.state_dir;
    mkdir(dir, 0o700)?;
    let previous = State::load(dir)?;
    if let Some(prev) = &previous {
        if prev.is_alive() {
            return Err(Error::AlreadyRunning(prev.pid));
        }
        // A stale state from a sandbox that died: its groups may still be there.
        let _ = prev.groups.remove(Duration::from_millis(500));
    }
    let rootless = !Uid::effective().is_root();
    let map = if rootless {
        IdMap::rootless()
    } else {
        let base = match &previous {
            Some(p) if !p.rootless => p.root_uid,
            _ => id_block(dir, &spec.id)?,
        };
        IdMap::shifted(base)
    };
    let (root_uid, root_gid) = (map.root_uid(), map.root_gid());
    let fs_dir = dir.join("fs");
    let disk_status = match spec.limits.disk_bytes {
        Some(bytes) => disk::mount(dir, &fs_dir, bytes)?,
        None => crate::LimitStatus::NotRequested,
    };
    let ids = (root_uid, root_gid);
    prepare_and_start(spec, &fs_dir, &map, rootless, ids, disk_status).inspect_err(|_| {
        disk::unmount(&fs_dir);
    })
}

/// Everything of [`launch`] after the disk is mounted.
fn prepare_and_start(
    spec: &SandboxSpec,
    fs_dir: &Path,
    map: &IdMap,
    rootless: bool,
    (root_uid, root_gid): (u32, u32),
    disk_status: crate::LimitStatus,
) -> Result<Running, Error> {
    let dir = &spec.state_dir;
    for sub in ["", "upper", "work", "merged", "lower", "run"] {
        let path = fs_dir.join(sub);
        // The overlay's root takes the upper directory's mode: `/` must be 0755.
        mkdir(
            &path,
            if matches!(sub, "run" | "upper") {
                0o755
            } else {
                0o700
            },
        )?;
        if !rootless {
            std::os::unix::fs::lchown(&path, Some(root_uid), Some(root_gid)).map_err(|source| {
                Error::Prepare {
                    path: path.clone(),
                    source,
                }
            })?;
        }
    }
    // Earlier versions kept the socket under fs/run behind this link.
    let _ = fs::remove_file(dir.join("run"));
    let socket = dir.join(AGENT_SOCKET);
    let listener = bind_agent_socket(&socket)?;

    let hierarchies = Hierarchies::discover();
    if let Some(dir) = Groups::in_use(&spec.id, &hierarchies) {
        return Err(Error::Spec(format!(
            "id {} is in use: {} has processes",
            spec.id,
            dir.display()
        )));
    }
    let (groups, mut limits) = Groups::create(&spec.id, &spec.limits, &hierarchies);
    limits.disk = disk_status;
    let result = start(spec, map, rootless, &groups, listener).and_then(|pid| {
        let start_time = start_time(pid).ok_or(Error::Start(child::Error::NoPid))?;
        let st = State {
            id: spec.id.clone(),
            pid,
            start_time,
            socket: socket.clone(),
            groups: groups.clone(),
            limits: limits.clone(),
            root_uid,
            rootless,
        };
        st.save(dir)?;
        Ok(pid)
    });
    match result {
        Ok(pid) => Ok(Running {
            pid,
            socket,
            limits,
            root_uid,
        }),
        Err(e) => {
            let _ = groups.remove(Duration::from_millis(500));
            Err(e)
        }
    }
}

/// Binds the agent's socket on the host; PID 1 inherits it. The descriptor is at least 3 and
/// close-on-exec here (the child clears that flag on it alone).
fn bind_agent_socket(path: &Path) -> Result<OwnedFd, Error> {
    let fail = |source| Error::Prepare {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Ok(_) => fs::remove_file(path).map_err(fail)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(fail)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(fail)?;
    let fd = OwnedFd::from(listener);
    // Above the standard descriptors even when the daemon runs with one of them closed.
    let high = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))
        .map_err(|e| fail(e.into()))?;
    // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

fn start(
    spec: &SandboxSpec,
    map: &IdMap,
    rootless: bool,
    groups: &Groups,
    listener: OwnedFd,
) -> Result<u32, Error> {
    let dir = &spec.state_dir;
    let userns = map.create_namespace()?;
    let lower_tree = if rootless {
        None
    } else {
        Some(idmapped_tree(&spec.rootfs, &userns)?)
    };
    let log_path = dir.join("agent.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|source| Error::Prepare {
            path: log_path,
            source,
        })?;
    let null = fs::File::open("/dev/null").map_err(|source| Error::Prepare {
        path: "/dev/null".into(),
        source,
    })?;
    let lower = match &lower_tree {
        Some(_) => "lower".to_owned(),
        None => spec.rootfs.to_string_lossy().into_owned(),
    };
    let mut steps = vec![Step::MakePrivate];
    if let Some(tree) = &lower_tree {
        steps.push(Step::Attach {
            fd: tree.as_raw_fd(),
            target: c("lower"),
        });
    }
    steps.extend(mount_plan(
        &lower,
        map.maps_gid(5),
        spec.limits.memory_bytes,
    ));
    steps.push(Step::HostsEntry {
        hostname: spec.hostname.clone(),
    });
    let mut envp = vec![
        format!("PATH={PATH}"),
        "HOME=/root".to_owned(),
        "container=belljar".to_owned(),
        "BELLJAR_MODE=namespace".to_owned(),
        format!("BELLJAR_HOSTNAME={}", spec.hostname),
    ];
    envp.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    let plan = Plan {
        cgroup_procs: groups.procs_files().iter().map(|p| c_path(p)).collect(),
        workdir: c_path(&dir.join("fs")),
        agent: c_path(&spec.agent),
        userns,
        setgroups_denied: map.deny_setgroups,
        steps,
        hostname: c(&spec.hostname),
        drop_caps: crate::caps::dropped(),
        filter: crate::seccomp::program()?,
        exec: c(AGENT_PATH_IN_SANDBOX),
        argv: [
            AGENT_PATH_IN_SANDBOX,
            "--mode",
            "namespace",
            "--listen",
            &format!("fd:{}", listener.as_raw_fd()),
        ]
        .iter()
        .map(|s| c(s))
        .collect(),
        envp: envp.iter().map(|s| c(s)).collect(),
        stdin: OwnedFd::from(null),
        stdout: OwnedFd::from(log),
        listener,
        _lower_tree: lower_tree,
    };
    let started = child::start(&plan)?;
    Ok(started.pid)
}

/// The `size=` of the sandbox's RAM-backed filesystems: tmpfs pages are charged to the
/// sandbox's memory and cannot be reclaimed, so an unbounded `/tmp` lets one `dd` use the
/// whole limit and leave the OOM killer nothing to free. Half the limit for `/tmp` and a
/// quarter for `/dev/shm` make the writer get ENOSPC first, as in a microVM, whose tmpfs
/// defaults to half its RAM. Without a memory limit the kernel's default applies.
fn tmpfs_options(base: &str, memory_bytes: Option<u64>, share: u64) -> String {
    match memory_bytes {
        Some(bytes) => format!("{base},size={}k", (bytes / share / 1024).max(1024)),
        None => base.to_owned(),
    }
}

/// PID 1's mounts, relative to `state_dir/fs` until the pivot.
pub(crate) fn mount_plan(lower: &str, have_tty_gid: bool, memory_bytes: Option<u64>) -> Vec<Step> {
    use libc::{MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REC};
    let m =
        |source: Option<&str>, target: &str, fstype: Option<&str>, flags, data: Option<&str>| {
            Step::Mount {
                source: source.map(c),
                target: c(target),
                fstype: fstype.map(c),
                flags,
                data: data.map(c),
            }
        };
    let dir = |path: &str, mode| Step::Mkdir {
        path: c(path),
        mode,
    };
    let overlay = format!("lowerdir={lower},upperdir=upper,workdir=work,userxattr");
    let devpts = if have_tty_gid {
        "newinstance,ptmxmode=0666,mode=0620,gid=5"
    } else {
        "newinstance,ptmxmode=0666,mode=0620"
    };
    let mut steps = vec![
        m(
            Some("overlay"),
            "merged",
            Some("overlay"),
            MS_NODEV,
            Some(&overlay),
        ),
        dir("merged/proc", 0o555),
        m(
            Some("proc"),
            "merged/proc",
            Some("proc"),
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            None,
        ),
        dir("merged/sys", 0o555),
        m(
            Some("sysfs"),
            "merged/sys",
            Some("sysfs"),
            MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
            None,
        ),
        dir("merged/dev", 0o755),
        m(
            Some("tmpfs"),
            "merged/dev",
            Some("tmpfs"),
            MS_NOSUID | MS_NOEXEC,
            Some("mode=755,size=65536k"),
        ),
    ];
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = format!("merged/dev/{node}");
        steps.push(Step::Touch { path: c(&target) });
        steps.push(m(
            Some(&format!("/dev/{node}")),
            &target,
            None,
            MS_BIND,
            None,
        ));
    }
    steps.extend([
        dir("merged/dev/pts", 0o755),
        m(
            Some("devpts"),
            "merged/dev/pts",
            Some("devpts"),
            MS_NOSUID | MS_NOEXEC,
            Some(devpts),
        ),
        Step::Symlink {
            target: c("pts/ptmx"),
            link: c("merged/dev/ptmx"),
        },
        dir("merged/dev/shm", 0o1777),
        m(
            Some("shm"),
            "merged/dev/shm",
            Some("tmpfs"),
            MS_NOSUID | MS_NODEV,
            Some(&tmpfs_options("mode=1777", memory_bytes, 4)),
        ),
        dir("merged/dev/mqueue", 0o755),
        m(
            Some("mqueue"),
            "merged/dev/mqueue",
            Some("mqueue"),
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            None,
        ),
        Step::Symlink {
            target: c("/proc/self/fd"),
            link: c("merged/dev/fd"),
        },
        Step::Symlink {
            target: c("/proc/self/fd/0"),
            link: c("merged/dev/stdin"),
        },
        Step::Symlink {
            target: c("/proc/self/fd/1"),
            link: c("merged/dev/stdout"),
        },
        Step::Symlink {
            target: c("/proc/self/fd/2"),
            link: c("merged/dev/stderr"),
        },
        dir("merged/tmp", 0o1777),
        m(
            Some("tmpfs"),
            "merged/tmp",
            Some("tmpfs"),
            MS_NOSUID | MS_NODEV,
            Some(&tmpfs_options("mode=1777", memory_bytes, 2)),
        ),
        dir("merged/run", 0o755),
        m(
            Some("tmpfs"),
            "merged/run",
            Some("tmpfs"),
            MS_NOSUID | MS_NODEV,
            Some("mode=755"),
        ),
        dir("merged/run/belljar", 0o755),
        m(
            Some("run"),
            "merged/run/belljar",
            None,
            MS_BIND | MS_REC,
            None,
        ),
        dir("merged/sbin", 0o755),
        Step::Touch {
            path: c(&format!("merged{AGENT_PATH_IN_SANDBOX}")),
        },
        Step::BindAgent {
            target: c(&format!("merged{AGENT_PATH_IN_SANDBOX}")),
        },
        Step::ReadOnly {
            target: c(&format!("merged{AGENT_PATH_IN_SANDBOX}")),
        },
        Step::Pivot {
            new_root: c("merged"),
        },
    ]);
    steps
}

/// An `open_tree` clone of the image, idmapped through the sandbox's user namespace, so
/// files owned by host uid N appear owned by sandbox uid N.
fn idmapped_tree(rootfs: &Path, userns: &OwnedFd) -> Result<OwnedFd, Error> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let path = c_path(rootfs);
    // SAFETY: open_tree with a valid C path; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        )
    };
    if fd < 0 {
        return Err(Error::Idmap(io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this fd; nobody else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr on our detached tree with a valid, initialised mount_attr.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | AT_RECURSIVE as libc::c_int,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret < 0 {
        return Err(Error::Idmap(io::Error::last_os_error()));
    }
    Ok(tree)
}

/// The file in a state directory that holds its id block, written before first use.
const ID_BLOCK_FILE: &str = "idblock";

/// The sandbox's id block: the one it already has, or a newly reserved one. Reservation holds
/// a lock in the parent directory, so concurrent launches never pick the same block.
fn id_block(state_dir: &Path, id: &str) -> Result<u32, Error> {
    let mine = state_dir.join(ID_BLOCK_FILE);
    if let Some(base) = read_block(&mine) {
        return Ok(base);
    }
    let parent = state_dir.parent().unwrap_or(Path::new("/"));
    let lock_path = parent.join(".belljar-idblock.lock");
    let lock = fs::File::create(&lock_path).map_err(|source| Error::Prepare {
        path: lock_path.clone(),
        source,
    })?;
    // SAFETY: flock on an fd we own; the lock is released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } < 0 {
        let source = io::Error::last_os_error();
        return Err(Error::Prepare {
            path: lock_path,
            source,
        });
    }
    let base = allocate_base(state_dir, id);
    fs::write(&mine, format!("{base}\n")).map_err(|source| Error::Prepare {
        path: mine.clone(),
        source,
    })?;
    Ok(base)
}

fn read_block(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Picks a free id block: a hash of the id, then the next block not used by a sibling
/// state directory (sandboxes' state directories normally share a parent).
fn allocate_base(state_dir: &Path, id: &str) -> u32 {
    let mut used = std::collections::BTreeSet::new();
    if let Some(parent) = state_dir.parent() {
        for entry in fs::read_dir(parent).into_iter().flatten().flatten() {
            if entry.path() == state_dir {
                continue;
            }
            if let Some(base) = read_block(&entry.path().join(ID_BLOCK_FILE)) {
                used.insert(base);
            } else if let Ok(Some(st)) = State::load(&entry.path()) {
                used.insert(st.root_uid);
            }
        }
    }
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let first = (hash % u64::from(SLOTS)) as u32;
    (0..SLOTS)
        .map(|i| ID_BASE + ((first + i) % SLOTS) * idmap::RANGE)
        .find(|base| !used.contains(base))
        .unwrap_or(ID_BASE)
}

fn validate(spec: &SandboxSpec) -> Result<(), Error> {
    let bad = |m: String| Err(Error::Spec(m));
    let id_ok = !spec.id.is_empty()
        && spec.id.len() <= 63
        && spec
            .id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !id_ok {
        return bad(format!(
            "id {:?} must be 1-63 characters of [a-z0-9-]",
            spec.id
        ));
    }
    let host_ok = !spec.hostname.is_empty()
        && spec.hostname.len() <= 64
        && spec
            .hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !host_ok {
        return bad(format!(
            "hostname {:?} is not a valid host name",
            spec.hostname
        ));
    }
    for (what, p) in [
        ("state_dir", &spec.state_dir),
        ("rootfs", &spec.rootfs),
        ("agent", &spec.agent),
    ] {
        let bytes = p.as_os_str().as_bytes();
        if !p.is_absolute() || bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\' | 0)) {
            return bad(format!(
                "{what} {} must be absolute, without , : \\",
                p.display()
            ));
        }
    }
    if spec.state_dir.join(AGENT_SOCKET).as_os_str().len() >= 108 {
        return bad(format!(
            "state_dir {} is too long for a Unix socket path",
            spec.state_dir.display()
        ));
    }
    if !spec.rootfs.is_dir() {
        return bad(format!(
            "rootfs {} is not a directory",
            spec.rootfs.display()
        ));
    }
    if !spec.agent.is_file() {
        return bad(format!("agent {} is not a file", spec.agent.display()));
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return bad(format!("bad environment variable {k:?}"));
        }
    }
    Ok(())
}

/// Makes `path` (and its parents) with exactly `mode`, whatever the daemon's umask.
fn mkdir(path: &Path, mode: u32) -> Result<(), Error> {
    let made = match fs::DirBuilder::new().recursive(true).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    };
    made.and_then(|()| fs::set_permissions(path, fs::Permissions::from_mode(mode)))
        .map_err(|source| Error::Prepare {
            path: path.to_owned(),
            source,
        })
}

fn c(s: &str) -> CString {
    CString::new(s).expect("validated: no NUL")
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("validated: no NUL")
}

/// Finds the live sandbox of a state directory after a daemon restart.
pub fn adopt(state_dir: &Path) -> Result<Option<Running>, Error> {
    let Some(st) = State::load(state_dir)? else {
        return Ok(None);
    };
    if !st.is_alive() {
        return Ok(None);
    }
    Ok(Some(Running {
        pid: st.pid,
        socket: st.socket,
        limits: st.limits,
        root_uid: st.root_uid,
    }))
}

impl ExitWatch {
    /// Watches the sandbox of `state_dir`; `None` when it is not running.
    pub fn for_sandbox(state_dir: &Path) -> Result<Option<Self>, Error> {
        let Some(st) = State::load(state_dir)? else {
            return Ok(None);
        };
        Ok(ExitWatch::open(st.pid, st.start_time)?)
    }

    /// Watches any process by pid and start time (field 22 of `/proc/<pid>/stat`), such as a
    /// `belljar-vmm`; `None` when that process is gone.
    pub fn for_process(pid: u32, start_time: u64) -> Result<Option<Self>, Error> {
        Ok(ExitWatch::open(pid, start_time)?)
    }
}

/// SIGTERM to PID 1, SIGKILL after `grace`; then the cgroups are removed. Stopping a sandbox
/// that is not running only cleans up.
pub fn stop(state_dir: &Path, grace: Duration) -> Result<(), Error> {
    let result = stop_processes(state_dir, grace);
    // The host's mount of the disk; the sandbox's own copy went with its mount namespace.
    if result.is_ok() {
        disk::unmount(&state_dir.join("fs"));
    }
    result
}

fn stop_processes(state_dir: &Path, grace: Duration) -> Result<(), Error> {
    let Some(st) = State::load(state_dir)? else {
        return Ok(());
    };
    if let Some(watch) = ExitWatch::open(st.pid, st.start_time)? {
        // The kernel drops signals from outside to a PID namespace's init unless it handles
        // them, so waiting for a SIGTERM it does not catch would only waste the grace period.
        let grace = if catches_sigterm(st.pid) {
            grace
        } else {
            Duration::ZERO
        };
        // A frozen sandbox could not react to SIGTERM.
        let _ = st.groups.set_frozen(false);
        watch.signal(libc::SIGTERM).map_err(Error::Signal)?;
        if !watch.wait(Some(grace)) {
            // Killing a PID namespace's init kills every process in it.
            watch.signal(libc::SIGKILL).map_err(Error::Signal)?;
            if !watch.wait(Some(Duration::from_secs(10))) {
                return Err(Error::Unkillable);
            }
        }
    }
    // The rest of the namespace dies with PID 1, asynchronously; frozen tasks must thaw to die.
    let _ = st.groups.set_frozen(false);
    st.groups.remove(Duration::from_secs(10))?;
    Ok(())
}

/// Whether `pid` has a handler for SIGTERM (`SigCgt` in `/proc/<pid>/status`).
fn catches_sigterm(pid: u32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

/// Stops the sandbox if needed, then deletes its writable layer and all its state.
pub fn destroy(state_dir: &Path) -> Result<(), Error> {
    if !state_dir.exists() {
        return Ok(());
    }
    stop(state_dir, Duration::from_millis(200))?;
    let mut result = fs::remove_dir_all(state_dir);
    if matches!(&result, Err(e) if e.kind() == io::ErrorKind::PermissionDenied) {
        // The overlay leaves `work/work` with mode 000; without CAP_DAC_OVERRIDE (rootless)
        // the owner must open such directories up before deleting them.
        open_up(state_dir);
        result = fs::remove_dir_all(state_dir);
    }
    let rootless = !Uid::effective().is_root();
    if rootless && matches!(&result, Err(e) if e.kind() == io::ErrorKind::PermissionDenied) {
        // Rootless with subordinate ids: files made by other users inside belong to
        // subordinate host ids; only root of a namespace with the same mapping may delete them.
        remove_in_namespace(state_dir)?;
        result = fs::remove_dir_all(state_dir);
    }
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Remove {
            path: state_dir.to_owned(),
            source,
        }),
    }
}

/// Deletes `dir` from a child that is root of a user namespace with the rootless mapping.
fn remove_in_namespace(dir: &Path) -> Result<(), Error> {
    let map = IdMap::rootless();
    let userns = map.create_namespace()?;
    let remove_err = |source| Error::Remove {
        path: dir.to_owned(),
        source,
    };
    // SAFETY: the child joins the namespace, deletes the tree and exits without returning;
    // glibc's malloc is usable after fork.
    match unsafe { nix::unistd::fork() }.map_err(|e| remove_err(e.into()))? {
        nix::unistd::ForkResult::Child => {
            // SAFETY: plain system calls; `_exit` never returns.
            unsafe {
                let ok = libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) == 0
                    && libc::setresgid(0, 0, 0) == 0
                    && libc::setresuid(0, 0, 0) == 0
                    && fs::remove_dir_all(dir).is_ok();
                libc::_exit(if ok { 0 } else { 1 })
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).map_err(|e| remove_err(e.into()))?;
            match status {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                _ => Err(remove_err(io::Error::from_raw_os_error(libc::EPERM))),
            }
        }
    }
}

/// Adds `u+rwx` to every directory under `dir` (not following symlinks), best effort.
fn open_up(dir: &Path) {
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode() | 0o700;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode));
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        open_up(&entry.path());
    }
}

fn groups_of_running(state_dir: &Path) -> Result<Groups, Error> {
    let st = State::load(state_dir)?.ok_or(Error::NotRunning)?;
    if !st.is_alive() {
        return Err(Error::NotRunning);
    }
    Ok(st.groups)
}

/// Pauses every process of the sandbox (freezer cgroup).
pub fn freeze(state_dir: &Path) -> Result<(), Error> {
    Ok(groups_of_running(state_dir)?.set_frozen(true)?)
}

/// Resumes a frozen sandbox.
pub fn thaw(state_dir: &Path) -> Result<(), Error> {
    Ok(groups_of_running(state_dir)?.set_frozen(false)?)
}

/// Memory, CPU and PIDs the sandbox uses now, from its cgroups.
pub fn usage(state_dir: &Path) -> Result<Usage, Error> {
    Ok(groups_of_running(state_dir)?.usage())
}

/// Waits until the agent's socket accepts a connection.
pub fn wait_ready(socket: &Path, timeout: Duration) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        if UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::NotReady {
                path: socket.to_owned(),
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_pivots_last_and_mounts_overlay_first() {
        let plan = mount_plan("lower", true, None);
        assert!(matches!(plan.last(), Some(Step::Pivot { .. })));
        let Step::Mount { fstype, data, .. } = &plan[0] else {
            panic!("{:?}", plan[0])
        };
        assert_eq!(fstype.as_deref(), Some(c"overlay"));
        assert!(
            data.as_ref()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("lowerdir=lower,")
        );
        assert!(plan.iter().any(|s| matches!(s, Step::BindAgent { .. })));
    }

    #[test]
    fn ram_backed_mounts_follow_the_memory_limit() {
        let data_of = |plan: &[Step], target: &std::ffi::CStr| {
            plan.iter()
                .find_map(|s| match s {
                    Step::Mount {
                        target: t, data, ..
                    } if t.as_c_str() == target => data.clone(),
                    _ => None,
                })
                .unwrap()
        };
        let plan = mount_plan("lower", true, Some(256 << 20));
        assert_eq!(
            data_of(&plan, c"merged/tmp"),
            c"mode=1777,size=131072k".to_owned()
        );
        assert_eq!(
            data_of(&plan, c"merged/dev/shm"),
            c"mode=1777,size=65536k".to_owned()
        );
        let plan = mount_plan("lower", true, None);
        assert_eq!(data_of(&plan, c"merged/tmp"), c"mode=1777".to_owned());
    }

    #[test]
    fn sigterm_handlers_are_seen() {
        // The test harness does not catch SIGTERM; `sleep` neither.
        assert!(!catches_sigterm(std::process::id()));
        let mut child = std::process::Command::new("sh")
            .args(["-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(catches_sigterm(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn bases_are_distinct_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
        fs::create_dir_all(&one).unwrap();
        fs::create_dir_all(&two).unwrap();
        let a = id_block(&one, "same").unwrap();
        assert!(a >= ID_BASE);
        assert_eq!((a - ID_BASE) % idmap::RANGE, 0);
        assert!(a.checked_add(idmap::RANGE).is_some());
        // Kept across calls, and a sibling with the same hash gets the next block.
        assert_eq!(id_block(&one, "same").unwrap(), a);
        let b = id_block(&two, "same").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.abs_diff(b) % idmap::RANGE, 0);
    }

    #[test]
    fn validation() {
        let spec = SandboxSpec {
            id: "Bad_Id".into(),
            rootfs: "/".into(),
            state_dir: "/tmp/x".into(),
            agent: "/bin/sh".into(),
            hostname: "h".into(),
            limits: Default::default(),
            env: vec![],
        };
        assert!(matches!(validate(&spec), Err(Error::Spec(_))));
        let ok = SandboxSpec {
            id: "ok-1".into(),
            ..spec.clone()
        };
        validate(&ok).unwrap();
        let comma = SandboxSpec {
            state_dir: "/tmp/a,b".into(),
            ..ok
        };
        assert!(matches!(validate(&comma), Err(Error::Spec(_))));
    }
}
