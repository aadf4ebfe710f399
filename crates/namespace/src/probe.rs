//! Can this host run namespace sandboxes? Answered quickly and without side effects that
//! outlive the call, for `belljar info` and for choosing the backend.

use std::fs;

use nix::unistd::Uid;
use serde::{Deserialize, Serialize};

/// Errors of the probe (it reports them in [`Probe::reason`] rather than returning them).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("The kernel has no overlay filesystem")]
    NoOverlay,
    #[error("Linux {0} is too old: namespace sandboxes need {1} ({2})")]
    OldKernel(String, &'static str, &'static str),
}

/// Which cgroup version enforces sandbox limits here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupMode {
    V1,
    V2,
    /// No usable controllers: limits cannot be enforced.
    None,
}

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub available: bool,
    /// Why not, or a short description of how sandboxes will run.
    pub reason: String,
    /// Running without root: user namespaces only, limits only with a delegated v2 group.
    pub rootless: bool,
    pub cgroup: CgroupMode,
}

/// Checks user namespaces (by making one), overlayfs and cgroups.
pub fn probe() -> Probe {
    let rootless = !Uid::effective().is_root();
    let cgroup = crate::cgroup::Hierarchies::discover().mode();
    let unavailable = |reason: String| Probe {
        available: false,
        reason,
        rootless,
        cgroup,
    };
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim().to_owned();
    let (need, why) = if rootless {
        ((5, 11), "overlayfs inside a user namespace")
    } else {
        ((5, 19), "overlayfs over idmapped layers")
    };
    if kernel_version(&release).is_some_and(|v| v < need) {
        let need = if rootless { "5.11" } else { "5.19" };
        return unavailable(Error::OldKernel(release, need, why).to_string());
    }
    let filesystems = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"))
    {
        return unavailable(Error::NoOverlay.to_string());
    }
    let map = if rootless {
        match crate::idmap::IdMap::rootless() {
            Ok(map) => map,
            Err(e) => return unavailable(e.to_string()),
        }
    } else {
        crate::idmap::IdMap::shifted(u32::MAX - 2 * crate::idmap::RANGE)
    };
    if let Err(e) = map.create_namespace() {
        let detail = std::error::Error::source(&e)
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        return unavailable(format!("{e}{detail}"));
    }
    let limits = match cgroup {
        CgroupMode::V2 => "limits through cgroup v2",
        CgroupMode::V1 => "limits through cgroup v1",
        CgroupMode::None => "no cgroup controllers: memory, CPU and PID limits are not enforced",
    };
    let who = if rootless {
        "rootless with subordinate ids"
    } else {
        "as root, one id block per sandbox"
    };
    Probe {
        available: true,
        reason: format!("Linux namespaces ({who}; {limits}); weaker isolation than a microVM"),
        rootless,
        cgroup,
    }
}

/// `TUNSETIFF` with `IFF_TAP | IFF_NO_PI`: attaches the open `/dev/net/tun` to a new tap
/// device `name` in the caller's network namespace (it goes when the fd closes). For
/// `belljar doctor`'s network check, which makes one in a throwaway namespace.
pub fn make_tap(tun: &fs::File, name: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    // SAFETY: an all-zero `ifreq` is valid (an empty name and zero flags).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the IFF_ flags are small c_int constants of a c_short field"
    )]
    const FLAGS: libc::c_short = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    req.ifr_ifru.ifru_flags = FLAGS;
    // SAFETY: TUNSETIFF reads and writes one `ifreq`, which lives for the call; the fd is ours.
    let ret = unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `(major, minor)` of a kernel release string such as `6.18.44-fc-v657`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0-150-generic"), Some((5, 4)));
        assert!(kernel_version("5.4.0").unwrap() < (5, 19));
        assert_eq!(kernel_version("junk"), None);
    }

    #[test]
    fn probe_finds_this_host_usable() {
        let p = probe();
        assert!(p.available, "{}", p.reason);
        assert!(!p.reason.is_empty());
    }
}
