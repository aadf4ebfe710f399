//! The life of one namespace sandbox: launch, adopt, freeze, usage (stop and destroy are in
//! `teardown`).
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

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::Uid;

use crate::cgroup::{self, Groups, Hierarchies, Usage};
use crate::child::{self, Plan, Step};
use crate::idmap::{self, IdMap};
use crate::mounts::{c, c_path};
use crate::state::{self, State, start_time};
use crate::{AGENT_PATH_IN_SANDBOX, AGENT_SOCKET, Running, SandboxSpec, disk};
use crate::{idblock, mounts, spec};

pub use crate::state::ExitWatch;

/// Errors of the sandbox lifecycle.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Invalid sandbox spec: {0}")]
    Spec(String),
    /// A mount of the spec is refused.
    #[error("Invalid sandbox spec")]
    Mount(#[from] crate::snapshot_mounts::MountError),
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
    #[error("The sandbox's processes did not freeze within {0:?}")]
    NotFrozen(Duration),
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
    #[error(
        "The writable layer in {} was a volatile overlay (no syncs) when the host went down: \
         its files may be torn, so it is not mounted again; delete the sandbox",
        path.display()
    )]
    TornLayer { path: PathBuf },
    #[error(transparent)]
    UserTree(#[from] crate::usertree::Error),
}

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Starts a sandbox and returns once its PID 1 has exec'd the agent.
pub fn launch(spec: &SandboxSpec) -> Result<Running, Error> {
    spec::validate(spec)?;
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
    if rootless && !spec.binds.is_empty() {
        return Err(Error::Spec(
            "host folders and volumes need a daemon run as root (id-mapped mounts)".into(),
        ));
    }
    let map = if rootless {
        IdMap::rootless()?
    } else {
        let base = match &previous {
            Some(p) if !p.rootless => p.root_uid,
            _ => idblock::id_block(dir, &spec.id)?,
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
    settle_volatile(&fs_dir, previous.as_ref())
        .and_then(|()| prepare_and_start(spec, &fs_dir, &map, rootless, ids, disk_status))
        .inspect_err(|_| disk::unmount(&fs_dir))
}

/// A `volatile` overlay (see [`mounts::overlay_data`]) leaves a marker in its work directory
/// that makes the kernel refuse to mount that layer again. A relaunch on the same layer in the
/// same boot may: nothing was lost, and the marker goes. After a host crash it may not.
fn settle_volatile(fs_dir: &Path, previous: Option<&State>) -> Result<(), Error> {
    let marker = fs_dir.join("work/work/incompat/volatile");
    if fs::symlink_metadata(&marker).is_err() {
        return Ok(());
    }
    let now = state::boot_id();
    let same_boot = now.is_some() && previous.and_then(|p| p.boot_id.clone()) == now;
    if !same_boot {
        return Err(Error::TornLayer {
            path: fs_dir.join("upper"),
        });
    }
    fs::remove_dir_all(&marker).map_err(|source| Error::Remove {
        path: marker,
        source,
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
    let layer_dirs = (0..spec.layers.len()).map(|i| (format!("layer{i}"), 0o700));
    // The overlay's root takes the upper directory's mode: `/` must be 0755.
    let subs = ["", "upper", "work", "merged", "lower", "run"].map(|s| {
        (
            s.to_owned(),
            if matches!(s, "run" | "upper") {
                0o755
            } else {
                0o700
            },
        )
    });
    let mount_dirs = crate::snapshot_mounts::directories(&spec.mounts);
    for (sub, mode) in subs.into_iter().chain(layer_dirs).chain(mount_dirs) {
        let path = fs_dir.join(&sub);
        mkdir(&path, mode)?;
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
            boot_id: state::boot_id(),
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
        Some(mounts::idmapped_tree(&spec.rootfs, &userns)?)
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
    // Snapshot layers, like the image, are seen through the sandbox's idmapped mount (their
    // owners are stored as sandbox ids); they sit above the image, topmost first.
    let layer_trees = if rootless {
        Vec::new()
    } else {
        spec.layers
            .iter()
            .map(|l| mounts::idmapped_tree(l, &userns))
            .collect::<Result<Vec<_>, _>>()?
    };
    let mut lowers: Vec<String> = if rootless {
        spec.layers
            .iter()
            .map(|l| l.to_string_lossy().into_owned())
            .collect()
    } else {
        (0..spec.layers.len())
            .map(|i| format!("layer{i}"))
            .collect()
    };
    lowers.push(match &lower_tree {
        Some(_) => "lower".to_owned(),
        None => spec.rootfs.to_string_lossy().into_owned(),
    });
    let lower = lowers.join(":");
    let mut steps = vec![Step::MakePrivate];
    if let Some(tree) = &lower_tree {
        steps.push(Step::Attach {
            fd: tree.as_raw_fd(),
            target: c("lower"),
        });
    }
    for (i, tree) in layer_trees.iter().enumerate() {
        steps.push(Step::Attach {
            fd: tree.as_raw_fd(),
            target: c(&format!("layer{i}")),
        });
    }
    let mut plan = mounts::mount_plan(
        &lower,
        map.maps_gid(5),
        spec.limits.memory_bytes,
        spec.durable,
    );
    // Snapshot mounts go over the root overlay (the plan's first step), before the pivot.
    let mount_trees = if rootless {
        Vec::new()
    } else {
        crate::snapshot_mounts::trees(&spec.mounts, &userns)?
    };
    plan.splice(
        1..1,
        crate::snapshot_mounts::steps(&spec.mounts, &mount_trees, spec.durable),
    );
    steps.extend(plan);
    // Host folders and volumes go on after the pivot: their paths resolve inside the sandbox.
    let bind_trees =
        crate::host_mounts::trees(&spec.binds, &userns, (map.root_uid(), map.root_gid()))?;
    steps.extend(crate::host_mounts::steps(&spec.binds, &bind_trees));
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
    // Without the socket pair the daemon attaches to the tap the other way.
    let (tap_ours, tap_handoff) = match crate::tap_handoff::channel() {
        Ok((ours, theirs)) => (Some(ours), Some(theirs)),
        Err(_) => (None, None),
    };
    let plan = Plan {
        cgroup_tasks: groups.v1_task_files().iter().map(|p| c_path(p)).collect(),
        cgroup_v2: groups.v2.as_deref().map(open_v2_group).transpose()?,
        workdir: c_path(&dir.join("fs")),
        agent: c_path(&spec.agent),
        userns,
        setgroups_denied: map.deny_setgroups,
        steps,
        hostname: c(&spec.hostname),
        drop_caps: crate::caps::dropped(),
        filter: crate::seccomp::shared_program()?,
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
        tap_handoff,
        _lower_tree: lower_tree,
    };
    let started = child::start(&plan)?;
    // PID 1 has exec'd the agent: the tap it handed over, if any, is waiting.
    if let Some(ours) = &tap_ours {
        crate::tap_handoff::receive(ours, dir);
    }
    // The layers' trees stay open until the child has attached them.
    drop(layer_trees);
    drop(mount_trees);
    drop(bind_trees);
    Ok(started.pid)
}

/// The sandbox's v2 group, opened for `clone3(CLONE_INTO_CGROUP)`.
fn open_v2_group(dir: &Path) -> Result<cgroup::join::CgroupV2, Error> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|source| Error::Prepare {
            path: dir.to_owned(),
            source,
        })?;
    Ok(cgroup::join::CgroupV2 {
        dir: OwnedFd::from(file),
        procs: c_path(&dir.join("cgroup.procs")),
    })
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

fn groups_of_running(state_dir: &Path) -> Result<Groups, Error> {
    let st = State::load(state_dir)?.ok_or(Error::NotRunning)?;
    if !st.is_alive() {
        return Err(Error::NotRunning);
    }
    Ok(st.groups)
}

/// How long freezing may take before it is given up (a task stuck in an uninterruptible
/// sleep, e.g. on a hung file system, keeps its cgroup `FREEZING`).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// Pauses every process of the sandbox (freezer cgroup) and returns once all are frozen, so
/// that a snapshot taken next sees no write still under way. The freezer has no event on
/// cgroup v1, so the state is read until it says so, within [`FREEZE_TIMEOUT`]; on timeout
/// the sandbox is thawed again.
pub fn freeze(state_dir: &Path) -> Result<(), Error> {
    let groups = groups_of_running(state_dir)?;
    groups.set_frozen(true)?;
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    while !groups.is_frozen()? {
        if Instant::now() >= deadline {
            let _ = groups.set_frozen(false);
            return Err(Error::NotFrozen(FREEZE_TIMEOUT));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// Whether every process of the sandbox is frozen.
pub fn is_frozen(state_dir: &Path) -> Result<bool, Error> {
    Ok(groups_of_running(state_dir)?.is_frozen()?)
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
