//! Starting the sandbox's processes: everything between the daemon's launch and the agent's
//! `execve`.
//!
//! The processes involved share the daemon's memory (`clone(CLONE_VM | CLONE_VFORK)`, see
//! `vfork`), so the work they do is prepared beforehand as a [`Plan`] of C strings, fds and a
//! BPF program, and they only walk it with plain system calls. Two processes are involved:
//!
//! 1. the *starter*: born in the sandbox's v2 group, starts a new session (so the sandbox
//!    never gets the daemon's terminal signals), joins the sandbox's v1 groups through
//!    `tasks` (see `cgroup::join`), joins the prepared user namespace, unshares
//!    mount/UTS/IPC/network/PID/cgroup namespaces (the cgroup namespace's root is thus the
//!    sandbox's own group), starts the sandbox's PID 1, reports its host pid and exits — so
//!    PID 1 is reparented to the host's init and outlives the daemon;
//! 2. *PID 1*: starts its own session, changes into `state_dir/fs` and opens the agent binary
//!    while it still has the host's root identity (so it can pass directories only root may
//!    search), becomes root of the user namespace, mounts the root (overlay on the idmapped
//!    image) and the pseudo filesystems, pivots into it, sets the hostname, brings `lo` up,
//!    drops capabilities, installs the seccomp filter and execs the agent.
//!
//! Failures are written as text to an error pipe that closes on a successful `execve`.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use libc::{c_char, c_ulong, c_void};

use crate::cgroup::join::{CgroupV2, join_group};
use crate::conv;
use crate::vfork::{self, Stacks};

/// Errors starting the sandbox's processes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The starter (a `clone(CLONE_VM | CLONE_VFORK)` child, see [`crate::vfork`]) could not
    /// be made.
    #[error("Cannot start the sandbox starter")]
    Spawn(#[source] std::io::Error),
    #[error("Cannot map the stacks of the sandbox's first processes")]
    Stacks(#[source] std::io::Error),
    #[error("Cannot create a pipe")]
    Pipe(#[source] nix::Error),
    #[error("The sandbox failed to start: {0}")]
    Setup(String),
    #[error("The sandbox starter exited without starting the sandbox")]
    NoPid,
}

/// One step of PID 1's mount plan.
#[derive(Debug)]
pub(crate) enum Step {
    /// Stop mount events from propagating back to the host.
    MakePrivate,
    /// Attach the idmapped image tree (an `open_tree` fd) at a path.
    Attach {
        fd: RawFd,
        target: CString,
    },
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: c_ulong,
        data: Option<CString>,
    },
    /// Make a mount read-only without touching its other (possibly locked) flags.
    ReadOnly {
        target: CString,
    },
    Mkdir {
        path: CString,
        mode: u32,
    },
    /// Create an empty file to bind-mount onto, unless something is there.
    Touch {
        path: CString,
    },
    Symlink {
        target: CString,
        link: CString,
    },
    /// Bind-mount the agent (opened by PID 1 before it dropped the host identity) here.
    BindAgent {
        target: CString,
    },
    /// After the pivot: make the hostname resolve (`127.0.1.1 <name>` in `/etc/hosts`, as
    /// Debian does), so `sudo` and friends do not stall on DNS. Best effort.
    HostsEntry {
        hostname: String,
    },
    /// `pivot_root` into this directory and detach the old root.
    Pivot {
        new_root: CString,
    },
}

/// Everything the starter and PID 1 need, prepared before they are spawned.
pub(crate) struct Plan {
    /// The `tasks` file of each of the sandbox's v1 groups (see `Groups::v1_task_files`).
    pub cgroup_tasks: Vec<CString>,
    /// The sandbox's v2 group, if it has one.
    pub cgroup_v2: Option<CgroupV2>,
    /// PID 1 changes into this directory while it still has the starter's host identity
    /// (so it can pass directories only root may search) and resolves the mount plan's
    /// relative paths from it after becoming the namespace's root.
    pub workdir: CString,
    /// Host path of the agent binary, opened by PID 1 while it may still search any
    /// directory root owns.
    pub agent: CString,
    pub userns: OwnedFd,
    /// `setgroups` is denied in this user namespace (rootless without subordinate ids).
    pub setgroups_denied: bool,
    pub steps: Vec<Step>,
    pub hostname: CString,
    pub drop_caps: Vec<u32>,
    pub filter: Vec<libc::sock_filter>,
    pub exec: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    /// The agent's listening socket, inherited by PID 1 at the same descriptor number (>= 3).
    pub listener: OwnedFd,
    /// PID 1's end of the socket it hands the sandbox's tap to the daemon on
    /// (`tap_handoff`).
    pub tap_handoff: Option<OwnedFd>,
    /// Keeps the `open_tree` fd of the idmapped image alive until the spawn.
    pub _lower_tree: Option<OwnedFd>,
}

/// The sandbox's PID 1, as the daemon learns it.
pub(crate) struct Started {
    pub pid: u32,
}

const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
pub(crate) struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

/// What the starter and PID 1 are handed: they run in the daemon's memory (see `vfork`), so
/// this lives on the launching thread's stack, which waits for both.
struct Context<'a> {
    plan: &'a Plan,
    stacks: &'a Stacks,
    pid_fd: RawFd,
    err_fd: RawFd,
    /// Whether the starter was born in the sandbox's v2 group (else it joins it itself).
    in_v2_group: std::cell::Cell<bool>,
}

/// Starts the starter and waits until PID 1 has exec'd the agent (or failed).
pub(crate) fn start(plan: &Plan) -> Result<Started, Error> {
    use nix::fcntl::OFlag;
    use std::io::Read;
    let (pid_r, pid_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    let stacks = Stacks::new(2).map_err(Error::Stacks)?;
    let ctx = Context {
        plan,
        stacks: &stacks,
        pid_fd: pid_w.as_raw_fd(),
        err_fd: err_w.as_raw_fd(),
        in_v2_group: std::cell::Cell::new(true),
    };
    let arg = std::ptr::from_ref(&ctx).cast_mut().cast();
    // SAFETY: (this call and the one below) `starter_entry` walks the plan with system calls and ends in
    // `_exit`; `ctx`, the plan and the stacks outlive the call, which returns once the
    // starter has exited (and PID 1 exec'd or died).
    let born = plan.cgroup_v2.as_ref().and_then(|g| unsafe {
        vfork::spawn_into(&stacks, 0, starter_entry, arg, g.dir.as_raw_fd())
    });
    let spawned = match born {
        Some(result) => result,
        None => {
            ctx.in_v2_group.set(false);
            // SAFETY: as for `spawn_into` above.
            unsafe { vfork::spawn(&stacks, 0, starter_entry, arg) }
        }
    };
    let child = spawned.map_err(Error::Spawn)?;
    drop(pid_w);
    drop(err_w);
    let mut pid_text = String::new();
    let _ = std::fs::File::from(pid_r).read_to_string(&mut pid_text);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None);
    let mut err_text = String::new();
    let _ = std::fs::File::from(err_r).read_to_string(&mut err_text);
    if !err_text.is_empty() {
        return Err(Error::Setup(err_text));
    }
    let pid = pid_text.trim().parse().map_err(|_| Error::NoPid)?;
    Ok(Started { pid })
}

extern "C" fn starter_entry(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `start` passed its `Context`, which outlives this child (it waits for it).
    let ctx = unsafe { &*arg.cast::<Context<'_>>() };
    starter(ctx)
}

extern "C" fn pid1_entry(arg: *mut c_void) -> libc::c_int {
    // SAFETY: as in `starter_entry`: the starter waits for PID 1, `start` for the starter.
    let ctx = unsafe { &*arg.cast::<Context<'_>>() };
    pid1(ctx.plan, ctx.err_fd)
}

/// Writes `what: <errno text>` to the error pipe and exits.
pub(crate) fn fail(err_fd: RawFd, what: &str) -> ! {
    let errno = std::io::Error::last_os_error();
    let msg = format!("{what}: {errno}");
    // SAFETY: writing a valid buffer to an fd we own; `_exit` never returns.
    unsafe {
        libc::write(err_fd, msg.as_ptr().cast::<c_void>(), msg.len());
        libc::_exit(127)
    }
}

pub(crate) fn check(ret: libc::c_int, err_fd: RawFd, what: &str) {
    if ret < 0 {
        fail(err_fd, what);
    }
}

fn starter(ctx: &Context<'_>) -> ! {
    let (plan, pid_fd, err_fd) = (ctx.plan, ctx.pid_fd, ctx.err_fd);
    // SAFETY: (for every block in this function) plain system calls on fds and C strings
    // owned by `plan`, which outlives the calls; pointers passed are valid for the call.
    unsafe {
        check(libc::setsid(), err_fd, "setsid");
        // The agent must outlive anything the sandbox runs: the OOM killer should pick a
        // command, never PID 1, whose death fails the sandbox. Only here, before joining the
        // user namespace, does the starter hold the host's CAP_SYS_RESOURCE that lowering the
        // score needs; PID 1 inherits it, and the agent resets it to 0 for every command.
        // A rootless daemon cannot lower it, and the sandbox then runs unprotected.
        let fd = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            libc::write(fd, b"-1000".as_ptr().cast::<c_void>(), 5);
            libc::close(fd);
        }
        // This process is a thread group of its own (see `Groups::v1_task_files` for why
        // that matters).
        for file in &plan.cgroup_tasks {
            join_group(file, err_fd);
        }
        // Born in the v2 group by `clone3(CLONE_INTO_CGROUP)` where the kernel could; else
        // joined here, the slow way (see `cgroup::join`).
        if let Some(v2) = &plan.cgroup_v2
            && !ctx.in_v2_group.get()
        {
            join_group(&v2.procs, err_fd);
        }
        check(
            libc::setns(plan.userns.as_raw_fd(), libc::CLONE_NEWUSER),
            err_fd,
            "setns user",
        );
        let flags = libc::CLONE_NEWNS
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWCGROUP;
        check(libc::unshare(flags), err_fd, "unshare");
        // Returns once PID 1 has exec'd the agent or died (its error is in the pipe).
        let arg = std::ptr::from_ref(ctx).cast_mut().cast();
        let pid = match vfork::spawn(ctx.stacks, 1, pid1_entry, arg) {
            Ok(pid) => pid,
            Err(_) => fail(err_fd, "start PID 1"),
        };
        let text = format!("{pid}\n");
        libc::write(pid_fd, text.as_ptr().cast::<c_void>(), text.len());
        libc::_exit(0)
    }
}

fn pid1(plan: &Plan, err_fd: RawFd) -> ! {
    // SAFETY: (for every block in this function) plain system calls on fds, C strings and a
    // BPF program owned by `plan`, which outlives the calls; all pointers are valid for the
    // duration of each call and the structs passed are fully initialised.
    unsafe {
        // Its own session, so nothing ties it to the starter that is about to exit.
        check(libc::setsid(), err_fd, "setsid");
        check(
            libc::chdir(plan.workdir.as_ptr()),
            err_fd,
            "chdir to the state directory",
        );
        let agent_fd = libc::open(plan.agent.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        check(agent_fd, err_fd, "open the agent binary");
        // The host's /dev, before the pivot hides it; a tun descriptor belongs to the network
        // namespace it was opened in, which is already the sandbox's.
        let tun_fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        // Raw system calls: glibc's wrappers would also change the credentials of the
        // daemon's threads, whose memory this process shares (see `vfork`).
        if !plan.setgroups_denied {
            let ret = libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
            check(conv::c_int(ret), err_fd, "setgroups");
        }
        let ret = libc::syscall(libc::SYS_setresgid, 0, 0, 0);
        check(conv::c_int(ret), err_fd, "setresgid");
        let ret = libc::syscall(libc::SYS_setresuid, 0, 0, 0);
        check(conv::c_int(ret), err_fd, "setresuid");
        for step in &plan.steps {
            run_step(step, agent_fd, err_fd);
        }
        let name = plan.hostname.as_bytes();
        check(
            libc::sethostname(name.as_ptr().cast::<c_char>(), name.len()),
            err_fd,
            "sethostname",
        );
        loopback_up(err_fd);
        if tun_fd >= 0 {
            let handoff = plan.tap_handoff.as_ref().map_or(-1, |fd| fd.as_raw_fd());
            tap_create(tun_fd, handoff);
        }
        for cap in &plan.drop_caps {
            let ret = libc::prctl(libc::PR_CAPBSET_DROP, *cap as c_ulong, 0, 0, 0);
            check(ret, err_fd, "drop capability");
        }
        // The filter is installed while CAP_SYS_ADMIN is still effective in the namespace,
        // so no_new_privs is not needed and setuid programs (sudo) keep working inside.
        let Ok(len) = u16::try_from(plan.filter.len()) else {
            // What the kernel answers a program over BPF_MAXINSNS (4096) instructions.
            nix::errno::Errno::EINVAL.set();
            fail(err_fd, "seccomp");
        };
        let prog = libc::sock_fprog {
            len,
            filter: plan.filter.as_ptr().cast_mut(),
        };
        let ret = libc::syscall(
            libc::SYS_seccomp,
            1 as c_ulong, // SECCOMP_SET_MODE_FILTER
            0 as c_ulong,
            &prog as *const libc::sock_fprog,
        );
        check(conv::c_int(ret), err_fd, "seccomp");
        check(libc::dup2(plan.stdin.as_raw_fd(), 0), err_fd, "dup2 stdin");
        check(
            libc::dup2(plan.stdout.as_raw_fd(), 1),
            err_fd,
            "dup2 stdout",
        );
        check(
            libc::dup2(plan.stdout.as_raw_fd(), 2),
            err_fd,
            "dup2 stderr",
        );
        // Whatever the daemon had open must not leak into the sandbox.
        libc::syscall(
            libc::SYS_close_range,
            3 as c_ulong,
            !0 as c_ulong,
            CLOSE_RANGE_CLOEXEC,
        );
        // The one descriptor PID 1 inherits beyond stdio: its listening socket.
        check(
            libc::fcntl(plan.listener.as_raw_fd(), libc::F_SETFD, 0),
            err_fd,
            "keep the agent socket",
        );
        // Dispositions and the mask survive execve; the daemon may ignore SIGPIPE (or SIGHUP
        // under `nohup`, or a real-time signal) or block signals for its runtime. Every
        // signal up to the kernel's 64, through the raw syscall because glibc's `signal`
        // refuses its own 32 and 33; a zeroed kernel `struct sigaction` is SIG_DFL.
        let default = [0usize; 4];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    default.as_ptr(),
                    std::ptr::null_mut::<c_void>(),
                    8usize,
                );
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let mut argv: Vec<*const c_char> = plan.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const c_char> = plan.envp.iter().map(|a| a.as_ptr()).collect();
        envp.push(std::ptr::null());
        libc::execve(plan.exec.as_ptr(), argv.as_ptr(), envp.as_ptr());
        fail(err_fd, "exec the agent")
    }
}

/// # Safety
/// The C strings in `step` must be valid (they are, being `CString`s).
unsafe fn run_step(step: &Step, agent_fd: RawFd, err_fd: RawFd) {
    let opt = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: see the function's contract; all pointers are valid C strings or null.
    unsafe {
        match step {
            Step::MakePrivate => {
                let ret = libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                );
                check(ret, err_fd, "make / private");
            }
            Step::Attach { fd, target } => {
                let ret = libc::syscall(
                    libc::SYS_move_mount,
                    *fd,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                );
                if ret < 0 {
                    fail(err_fd, &format!("attach the image at {target:?}"));
                }
            }
            Step::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => {
                let ret = libc::mount(
                    opt(source),
                    target.as_ptr(),
                    opt(fstype),
                    *flags,
                    opt(data).cast::<c_void>(),
                );
                if ret < 0 {
                    fail(
                        err_fd,
                        &format!("mount {fstype:?} {source:?} on {target:?}"),
                    );
                }
            }
            Step::ReadOnly { target } => {
                let attr = MountAttr {
                    attr_set: MOUNT_ATTR_RDONLY,
                    attr_clr: 0,
                    propagation: 0,
                    userns_fd: 0,
                };
                let ret = libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    0,
                    &attr as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                );
                if ret < 0 {
                    fail(err_fd, &format!("make {target:?} read-only"));
                }
            }
            Step::Mkdir { path, mode } => {
                if libc::mkdir(path.as_ptr(), *mode) < 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    fail(err_fd, &format!("mkdir {path:?}"));
                }
            }
            Step::Touch { path } => {
                // O_EXCL: opening an existing file of the image for writing would copy all
                // of it up into the writable layer (the image's own agent binary: megabytes).
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    0o644,
                );
                if fd >= 0 {
                    libc::close(fd);
                } else if std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                    fail(err_fd, &format!("create {path:?}"));
                }
            }
            Step::Symlink { target, link } => {
                if libc::symlink(target.as_ptr(), link.as_ptr()) < 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    fail(err_fd, &format!("symlink {link:?}"));
                }
            }
            Step::BindAgent { target } => {
                let source = CString::new(format!("/proc/self/fd/{agent_fd}")).unwrap_or_default();
                let ret = libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                );
                if ret < 0 {
                    fail(err_fd, &format!("bind the agent on {target:?}"));
                }
            }
            Step::HostsEntry { hostname } => {
                let text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
                if !text.split_whitespace().any(|w| w == hostname) {
                    let sep = if text.is_empty() || text.ends_with('\n') {
                        ""
                    } else {
                        "\n"
                    };
                    let line = format!("{sep}127.0.1.1\t{hostname}\n");
                    let file = std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .open("/etc/hosts");
                    if let Ok(mut file) = file {
                        let _ = std::io::Write::write_all(&mut file, line.as_bytes());
                    }
                }
            }
            Step::Pivot { new_root } => {
                check(
                    libc::chdir(new_root.as_ptr()),
                    err_fd,
                    "chdir to the new root",
                );
                let ret = libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr());
                check(conv::c_int(ret), err_fd, "pivot_root");
                check(
                    libc::umount2(c".".as_ptr(), libc::MNT_DETACH),
                    err_fd,
                    "detach old root",
                );
                check(libc::chdir(c"/".as_ptr()), err_fd, "chdir /");
            }
        }
    }
}

/// The sandbox's network device: a tap whose frames the daemon's userspace stack reads.
pub const TAP_NAME: &str = "eth0";

/// Creates the persistent tap [`TAP_NAME`] in the sandbox's network namespace and closes
/// `tun_fd`, after handing it to the daemon on `handoff` (when that is open) with the flags
/// the daemon attaches with. Persistent, the device (and the addresses the agent gives it)
/// outlives every descriptor, so the daemon attaches to it again after a restart, even a
/// `kill -9`. Best effort: a host without `/dev/net/tun` gets a sandbox without network,
/// which the daemon reports when it cannot attach.
fn tap_create(tun_fd: RawFd, handoff: RawFd) {
    /// `_IOW('T', 202, int)` and `_IOW('T', 203, int)` from `<linux/if_tun.h>`.
    const TUNSETIFF: c_ulong = 0x4004_54ca;
    const TUNSETPERSIST: c_ulong = 0x4004_54cb;
    // SAFETY: ioctls on a descriptor we own with a zeroed, then filled, `ifreq`; TUNSETPERSIST
    // takes its argument by value.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(TAP_NAME.bytes()) {
            *dst = src as c_char;
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the IFF_ flags are small c_int constants of a c_short field"
        )]
        const FLAGS: libc::c_short =
            (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
        req.ifr_ifru.ifru_flags = FLAGS;
        if libc::ioctl(tun_fd, TUNSETIFF, &mut req as *mut libc::ifreq) == 0
            && libc::ioctl(tun_fd, TUNSETPERSIST, 1 as c_ulong) == 0
            && handoff >= 0
        {
            crate::tap_handoff::send(handoff, tun_fd);
        }
        libc::close(tun_fd);
    }
}

/// Brings `lo` up in the sandbox's network namespace.
fn loopback_up(err_fd: RawFd) {
    // SAFETY: an ioctl on a socket we own with a zeroed, then filled, `ifreq`.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(sock, err_fd, "socket for lo");
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as c_char;
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the IFF_ flags are small c_int constants of a c_short field"
        )]
        const FLAGS: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        req.ifr_ifru.ifru_flags = FLAGS;
        check(
            libc::ioctl(sock, libc::SIOCSIFFLAGS, &req),
            err_fd,
            "bring lo up",
        );
        libc::close(sock);
    }
}
