//! The network-path check, done for real: a namespace sandbox's network reaches the daemon
//! through a tap device in the sandbox's network namespace, which needs the kernel's `tun`
//! driver, `/dev/net/tun`, and the right to make a tap there (root, or root of a user
//! namespace that owns the network namespace). So a throwaway child makes a network namespace
//! (inside a user namespace when not root), opens `/dev/net/tun` and creates a tap with
//! `TUNSETIFF`, the same calls a sandbox's set-up makes. The tap dies with the namespace.
//!
//! As with the overlayfs probe, `unshare(CLONE_NEWUSER)` refuses a multithreaded process, so
//! [`probe`] re-runs the current binary with `BELLJAR_DOCTOR_PROBE=net` and [`child`] does the
//! work.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use nix::sched::{CloneFlags, unshare};
use nix::unistd::{Gid, Uid};

/// The tun character device.
pub const TUN: &str = "/dev/net/tun";

/// Why the child could not make a tap.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("Cannot create a network namespace: {0}")]
    Unshare(#[source] nix::Error),
    #[error("Cannot write the id maps of the user namespace: {0}")]
    IdMap(#[source] std::io::Error),
    #[error("Cannot open /dev/net/tun: {0}")]
    Open(#[source] std::io::Error),
    #[error("Cannot create a tap device in a network namespace: {0}")]
    Tap(#[source] std::io::Error),
}

/// What the host offers for the network path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetFacts {
    /// `/dev/net/tun` exists and is a character device.
    pub tun_present: bool,
    /// This user may open it (udev makes it 0666; a bare devtmpfs leaves it 0600).
    pub tun_openable: bool,
    /// The child's answer: a tap was made in a fresh network namespace, or why not.
    pub tap_in_netns: Result<(), crate::ProbeError>,
}

impl NetFacts {
    /// Looks at `/dev/net/tun` and runs the child probe through `exe`.
    pub fn gather(exe: &Path) -> Self {
        let tun_present = fs::metadata(TUN).is_ok_and(|m| m.file_type().is_char_device());
        let tun_openable = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(TUN)
            .is_ok();
        let tap_in_netns = if tun_present {
            probe(exe)
        } else {
            Err(crate::ProbeError::Missing(TUN))
        };
        Self {
            tun_present,
            tun_openable,
            tap_in_netns,
        }
    }
}

/// Runs the probe in a child (`exe` with `BELLJAR_DOCTOR_PROBE=net`); `Err` carries the
/// child's reason.
pub fn probe(exe: &Path) -> Result<(), crate::ProbeError> {
    crate::run_probe_child(exe, crate::PROBE_NET)
}

/// The child's side: new namespaces, then a tap in the new network namespace.
pub fn child() -> Result<(), NetError> {
    let (uid, gid) = (Uid::current(), Gid::current());
    if uid.is_root() {
        unshare(CloneFlags::CLONE_NEWNET).map_err(NetError::Unshare)?;
    } else {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET).map_err(NetError::Unshare)?;
        crate::map_self_to_root(uid, gid).map_err(NetError::IdMap)?;
    }
    let tun = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN)
        .map_err(NetError::Open)?;
    belljar_namespace::probe::make_tap(&tun, "bjprobe0").map_err(NetError::Tap)
}
