//! Attaching to a rootless sandbox's tap. The daemon reads a namespace sandbox's frames from
//! the persistent tap `eth0` in the sandbox's network namespace, opened from inside that
//! namespace. As root a thread simply joins it (`setns`). A rootless daemon may not: the
//! namespace belongs to the sandbox's user namespace, and joining it needs `CAP_SYS_ADMIN`
//! there, which the daemon gets only by joining that user namespace first — and the kernel
//! refuses `setns(CLONE_NEWUSER)` to a multithreaded process. So a short-lived child of
//! `belljard` itself (single-threaded: it runs before any runtime starts, see
//! [`run_if_asked`]) joins the user and network namespaces, opens the tap and hands the
//! descriptor back over a socket (`SCM_RIGHTS`); the descriptor stays bound to the sandbox's
//! namespace wherever it is used.

#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// The variable that makes `belljard` run as an attaching child: the sandbox's PID 1 and the
/// tap's name, `<pid>:<name>`.
pub const ENV: &str = "BELLJAR_TAP_ATTACH";

/// How long the child waits for a busy tap (see [`crate::tap::attach`]).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the child may take, attach retries included.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// Call first thing in `main`, before any runtime starts: when this process was started as an
/// attaching child, joins the sandbox's namespaces, opens the tap, sends its descriptor over
/// standard input (a Unix socket) and returns the exit status. `None` for an ordinary start.
pub fn run_if_asked() -> Option<i32> {
    let what = std::env::var(ENV).ok()?;
    Some(match child(&what) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    })
}

fn child(what: &str) -> io::Result<()> {
    let (pid, name) = what
        .split_once(':')
        .and_then(|(pid, name)| Some((pid.parse::<u32>().ok()?, name)))
        .ok_or_else(|| io::Error::other(format!("{ENV}={what:?} is not <pid>:<tap name>")))?;
    let userns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let own = std::fs::metadata("/proc/self/ns/user")?;
    // The same user namespace as ours (a sandbox without one): joining it is refused (EINVAL)
    // and not needed.
    if std::os::unix::fs::MetadataExt::ino(&userns.metadata()?)
        != std::os::unix::fs::MetadataExt::ino(&own)
    {
        setns(&userns, CloneFlags::CLONE_NEWUSER).map_err(|e| {
            io::Error::other(format!("cannot join the sandbox's user namespace: {e}"))
        })?;
    }
    setns(&netns, CloneFlags::CLONE_NEWNET).map_err(|e| {
        io::Error::other(format!("cannot join the sandbox's network namespace: {e}"))
    })?;
    let tap = crate::tap::attach(name, ATTACH_TIMEOUT)?;
    // SAFETY: fd 0 is the socket the parent gave as standard input; it is borrowed only for
    // this call and the process exits right after.
    let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let fds = [tap.as_raw_fd()];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(b"T")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| io::Error::other(format!("cannot send the tap back: {e}")))?;
    Ok(())
}

/// The parent's side: runs `exe` (a binary whose `main` calls [`run_if_asked`] first) as an
/// attaching child for the tap `name` of the sandbox whose PID 1 is `pid`, and returns the
/// descriptor it sends back.
pub fn open_via_child(exe: &Path, pid: u32, name: &str) -> io::Result<OwnedFd> {
    let (mine, theirs) = UnixStream::pair()?;
    let mut child = Command::new(exe)
        .env(ENV, format!("{pid}:{name}"))
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    mine.set_read_timeout(Some(CHILD_TIMEOUT))?;
    let received = receive_fd(mine.as_raw_fd());
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait()?;
    match received {
        Ok(fd) => Ok(fd),
        Err(e) => Err(io::Error::other(format!(
            "the attaching child ({status}) sent no tap: {}",
            if stderr.trim().is_empty() {
                e.to_string()
            } else {
                stderr.trim().to_owned()
            }
        ))),
    }
}

/// One descriptor from one message on `socket`.
fn receive_fd(socket: RawFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        socket,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg
            && let Some(&fd) = fds.first()
        {
            // SAFETY: the kernel just installed `fd` in this process for this message; nothing
            // else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the child closed the socket without a descriptor",
    ))
}
