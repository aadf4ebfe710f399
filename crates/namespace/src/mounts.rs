//! PID 1's mount plan and the idmapped view of the image: what a namespace sandbox sees as
//! its filesystem, separate from starting and stopping it (`lifecycle`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::AGENT_PATH_IN_SANDBOX;
use crate::child::{MountAttr, Step};
use crate::lifecycle::Error;

/// The `size=` of the sandbox's RAM-backed filesystems: tmpfs pages are charged to the
/// sandbox's memory and cannot be reclaimed, so an unbounded `/tmp` lets one `dd` use the
/// whole limit and leave the OOM killer nothing to free. Half the limit for `/tmp` and a
/// quarter for `/dev/shm` make the writer get ENOSPC first, as in a microVM, whose tmpfs
/// defaults to half its RAM. Without a memory limit the kernel's default applies.
pub(crate) fn tmpfs_options(base: &str, memory_bytes: Option<u64>, share: u64) -> String {
    match memory_bytes {
        Some(bytes) => format!("{base},size={}k", (bytes / share / 1024).max(1024)),
        None => base.to_owned(),
    }
}

/// An overlay's mount data. A writable layer that need not be durable is `volatile`: the
/// overlay then skips every sync, the fsync of each copied-up file included (~10 ms each on
/// a sandbox's loop disk: the first write to `/etc/hosts` at start was one). What a host
/// crash would cost is only the writes since the last sync, of a sandbox that dies with the
/// host anyway; a durable layer (a persistent sandbox's, captured at its next stop) keeps
/// them.
pub(crate) fn overlay_data(lower: &str, upper: &str, work: &str, durable: bool) -> String {
    let volatile = if durable { "" } else { ",volatile" };
    format!("lowerdir={lower},upperdir={upper},workdir={work},userxattr{volatile}")
}

/// PID 1's mounts, relative to `state_dir/fs` until the pivot.
pub(crate) fn mount_plan(
    lower: &str,
    have_tty_gid: bool,
    memory_bytes: Option<u64>,
    durable: bool,
) -> Vec<Step> {
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
    let overlay = overlay_data(lower, "upper", "work", durable);
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
pub(crate) fn idmapped_tree(rootfs: &Path, userns: &OwnedFd) -> Result<OwnedFd, Error> {
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
    let fd = crate::conv::fd(fd).map_err(Error::Idmap)?;
    // SAFETY: the kernel just returned this fd; nobody else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(fd) };
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

pub(crate) fn c(s: &str) -> CString {
    CString::new(s).expect("validated: no NUL")
}

pub(crate) fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("validated: no NUL")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_pivots_last_and_mounts_overlay_first() {
        let plan = mount_plan("lower", true, None, true);
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
        let plan = mount_plan("lower", true, Some(256 << 20), true);
        assert_eq!(
            data_of(&plan, c"merged/tmp"),
            c"mode=1777,size=131072k".to_owned()
        );
        assert_eq!(
            data_of(&plan, c"merged/dev/shm"),
            c"mode=1777,size=65536k".to_owned()
        );
        let plan = mount_plan("lower", true, None, true);
        assert_eq!(data_of(&plan, c"merged/tmp"), c"mode=1777".to_owned());
    }
}
