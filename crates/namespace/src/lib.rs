//! The namespace backend: a Belljar sandbox as Linux namespaces instead of a microVM.
//!
//! Hosts without usable hardware virtualization (cloud VMs without nested virtualization, CI
//! runners, PVM machines) run each sandbox as the same image and the same `belljar-agent` as
//! PID 1 of a user/mount/PID/network/UTS/IPC/cgroup namespace sandbox. Isolation is weaker than
//! a microVM's (one shared kernel) and must be labelled as such by the daemon.
//!
//! # API (what the daemon's `Backend` wraps)
//!
//! - [`probe()`] → [`Probe`]: can this host run namespace sandboxes, rootless or not, which cgroup
//!   version enforces limits.
//! - [`launch`]`(&`[`SandboxSpec`]`)` → [`Running`]: returns once the agent has been exec'd as
//!   PID 1 (not once it listens: poll [`Running::socket`], e.g. with [`wait_ready`]).
//! - [`adopt`]`(state_dir)` → `Option<Running>`: after a daemon restart, find the live sandbox
//!   again (pid + start time in `state_dir/sandbox.json` are checked against `/proc`).
//! - [`stop`]`(state_dir, grace)`: SIGTERM to PID 1, SIGKILL after `grace` (at once when PID 1
//!   has no SIGTERM handler: the kernel drops uncaught signals to a PID namespace's init);
//!   waits for the exit and removes the sandbox's cgroups. Mounts live only in the sandbox's
//!   mount namespace and vanish with it. The writable layer stays, so a stopped sandbox can be
//!   launched again from the same `state_dir` (same id block, same files).
//! - [`destroy`]`(state_dir)`: stop if needed, then delete the writable layer and all state.
//! - [`ExitWatch`]: a pidfd (works for non-children, i.e. after [`adopt`]) to learn that the
//!   sandbox ended: blocking [`ExitWatch::wait`] or poll its fd (`AsFd`) from an event loop.
//! - [`freeze`] / [`thaw`] (freezer cgroup, v1 or v2) and [`usage`] (memory, CPU, PIDs).
//!
//! # What runs inside
//!
//! PID 1 is `/sbin/belljar-agent --mode namespace --listen fd:N`, with `BELLJAR_MODE`,
//! `BELLJAR_HOSTNAME`, `PATH`, `HOME` and the spec's `env` in its environment. Descriptor `N`
//! is the agent's listening socket, bound by [`launch`] at `state_dir/agent.sock` on the host:
//! the sandbox cannot reach that directory, so it cannot swap the socket the daemon connects
//! to for a link to another sandbox's or a host socket. The agent binary is bind-mounted read-only from [`SandboxSpec::agent`]. Its
//! stdout and stderr go to `state_dir/agent.log`.
//!
//! Before the exec this crate has already: mounted the sandbox's disk (as root: an ext4 file
//! of [`Limits::disk_bytes`] at `state_dir/fs`, see [`disk`]), the overlay root (lower: the
//! image tree, upper/work: `state_dir/fs/upper`, `state_dir/fs/work`) and pivoted into it with the old root
//! detached; mounted `/proc` (this PID namespace's), `/sys` (read-only), a `/dev` tmpfs with
//! `null zero full random urandom tty`, `/dev/pts` (newinstance, ptmxmode=0666) with the
//! `/dev/ptmx` symlink, `/dev/shm`, `/dev/mqueue`, `/tmp` and `/run` (tmpfs); bind-mounted
//! `state_dir/fs/run` at `/run/belljar` (the agent's own state: command output); set the
//! hostname (and added `127.0.1.1 <hostname>` to `/etc/hosts` when missing); brought `lo` up.
//! The agent does not need to mount anything in namespace mode, and cannot: the sandbox has
//! neither `CAP_SYS_ADMIN` nor `CAP_NET_ADMIN` (its namespace-mode set-up is best effort and
//! finds everything in place).
//!
//! # Identity mapping
//!
//! As root, each sandbox gets its own range of 65536 host uids/gids (see [`SandboxSpec`]):
//! sandbox uid 0 is host uid `base`, so sandbox root owns nothing on the host. The read-only
//! image tree (owned by host root and 1000) is seen through an idmapped mount, so inside it
//! is owned by root and 1000 as built. Rootless, the invoking user becomes root inside and
//! sandbox uids 1..65536 map onto the user's `/etc/subuid` + `/etc/subgid` range through
//! `newuidmap`/`newgidmap` (so `belljar`, uid 1000, exists); without a range or the tools a
//! launch fails with an error that names the command adding them ([`idmap::Error::code`]).
//!
//! # Confinement
//!
//! Capabilities (inside the user namespace) are cut to Docker's default set plus
//! [`caps::AGENT_NEEDS`] (see [`caps`]), a seccomp filter ([`seccomp`]) refuses what a sandbox
//! has no business doing, cgroups ([`cgroup`]) enforce memory, CPU and PID limits, and the
//! network namespace has only `lo`. Inside, `/proc/self/cgroup` shows `/` (cgroup namespace)
//! and `/proc/meminfo` is the host's: take the sandbox's resource use from [`usage`].
//!
//! # Rootless
//!
//! Without root: launch, commands, stop, destroy and adopt work; the image tree must belong
//! to the invoking user: [`usertree::user_tree`] makes such a copy of a root-built image once
//! per user (files owned by other host users would show as `nobody` inside and could not be
//! changed); limits are enforced only through a delegated cgroup v2 group (cgroup v1 is not
//! writable), and [`Running::limits`] says so per limit.
//!
//! # Testing
//!
//! [`testing`] builds a busybox image and a static stand-in agent so this crate's tests and
//! the end-to-end escape tests run without the real agent; `belljar-ns` (this crate's binary)
//! drives sandboxes by hand and measures launch latency (`belljar-ns bench`).

pub mod caps;
pub mod cgroup;
mod child;
mod conv;
pub mod disk;
pub mod disk_pool;
pub mod host_mounts;
mod idblock;
pub mod idmap;
pub mod layer;
mod lifecycle;
pub mod live_mounts;
mod mounts;
pub mod probe;
pub mod seccomp;
pub mod snapshot_mounts;
mod spec;
mod state;
pub mod tap_handoff;
mod teardown;
pub mod testing;
pub mod usertree;
mod vfork;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use cgroup::{LimitStatus, LimitsReport, Usage};
pub use lifecycle::{Error, ExitWatch, adopt, freeze, is_frozen, launch, thaw, usage, wait_ready};
pub use probe::{CgroupMode, Probe, probe};
pub use snapshot_mounts::LayerMount;
pub use teardown::{destroy, stop};

/// An error and its sources, `: `-separated, in one line: `belljar_api::error_chain` for the
/// crates below the API's, which this one does not depend on.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The agent's socket in the state directory, out of the sandbox's reach.
pub const AGENT_SOCKET: &str = "agent.sock";

/// Where the agent binary is bind-mounted inside the sandbox.
pub const AGENT_PATH_IN_SANDBOX: &str = "/sbin/belljar-agent";

/// Everything needed to start one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    /// `[a-z0-9-]`, at most 63 characters; names the cgroups (`belljar/<id>`).
    pub id: String,
    /// The image's directory tree: the read-only lower layer, shared by many sandboxes.
    pub rootfs: PathBuf,
    /// Snapshot layers (see [`layer`]) stacked between the image and the writable layer,
    /// topmost first; empty for a sandbox made from the image alone.
    pub layers: Vec<PathBuf>,
    /// A directory owned by this sandbox: `agent.sock`, `disk.ext4` (mounted at `fs`),
    /// `fs/{upper,work,merged,lower,run}`, `sandbox.json` + `sandbox.pid`, `idblock`,
    /// `agent.log`. Its path must be short enough for a Unix socket path
    /// (`state_dir/agent.sock` under 108 bytes) and must not contain `,` `:`.
    pub state_dir: PathBuf,
    /// Host path of the `belljar-agent` binary (statically linked).
    pub agent: PathBuf,
    pub hostname: String,
    pub limits: Limits,
    /// Extra environment for the agent (`BELLJAR_*` configuration).
    pub env: Vec<(String, String)>,
    /// Directory snapshots mounted at paths of the sandbox (see [`snapshot_mounts`]).
    pub mounts: Vec<LayerMount>,
    /// Host folders and named volumes bind-mounted at paths of the sandbox (see
    /// [`host_mounts`]; root only).
    pub binds: Vec<host_mounts::BindMount>,
    /// Whether the writable layers keep the sandbox's syncs (a persistent sandbox's, whose
    /// files outlive it); otherwise they are `volatile` overlays that skip every sync.
    pub durable: bool,
}

/// Resource limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    /// vCPUs, as a CPU time quota (1.5 = 150 ms of CPU per 100 ms).
    pub cpu: Option<f64>,
    pub pids: Option<u64>,
    /// Bytes the sandbox may write to disk (its writable layer and `/run/belljar`).
    pub disk_bytes: Option<u64>,
}

/// A live sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    /// Host pid of the sandbox's PID 1 (the agent).
    pub pid: u32,
    /// Host path of the agent's Unix socket.
    pub socket: PathBuf,
    /// Per limit: enforced, and how, or why not.
    pub limits: LimitsReport,
    /// Host uid/gid that is root inside the sandbox.
    pub root_uid: u32,
}
