//! A microVM's directory snapshots, mounted at boot: each one's read-only layer disks stacked
//! with overlayfs under an upper directory of its own on the writable layer disk, at its path
//! of the new root, before the agent pivots into it (the namespace backend does the same from
//! the host). The daemon checked each path against the image and the snapshot layers; the
//! walk here still never follows a link, so a layer that planted one cannot move a mount.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use belljar_agent_proto::mounts::GuestMount;
use nix::fcntl::{OFlag, openat};
use nix::mount::MsFlags;
use nix::sys::stat::{Mode, mkdirat};

use crate::system::SystemError;

/// Where a mount's layer disks are mounted: `<MOUNT_LOWER>/<slot>/<n>`, topmost first.
const MOUNT_LOWER: &str = "/run/belljar/mount-lower";

/// Mounts every snapshot of `mounts` under `new_root`; upper and work directories go under
/// `<layer>/mounts/<slot>/` (the writable layer, so the writes live as long as it does).
pub fn mount_all(mounts: &[GuestMount], new_root: &str, layer: &str) -> Result<(), SystemError> {
    for m in mounts {
        let mut lowers = Vec::new();
        for (i, device) in m.devices.iter().enumerate() {
            let target = format!("{MOUNT_LOWER}/{}/{i}", m.slot);
            crate::system::mount_fs(
                &device.to_string_lossy(),
                &target,
                "ext4",
                MsFlags::MS_RDONLY | MsFlags::MS_NOATIME,
                None,
            )?;
            lowers.push(target);
        }
        let own = Path::new(layer).join("mounts").join(m.slot.to_string());
        for dir in ["upper", "work"] {
            std::fs::create_dir_all(own.join(dir)).map_err(|e| SystemError::Io {
                what: "make a mount's upper directory",
                source: e,
            })?;
        }
        let target = open_target(new_root, &m.path)?;
        let data = format!(
            "lowerdir={},upperdir={}/upper,workdir={}/work,userxattr",
            lowers.join(":"),
            own.display(),
            own.display()
        );
        // The target by its descriptor: the walk that opened it followed no link.
        let at = format!("/proc/self/fd/{}", target.as_raw_fd());
        nix::mount::mount(
            Some("overlay"),
            at.as_str(),
            Some("overlay"),
            MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .map_err(|source| SystemError::Mount {
            fstype: "overlay".into(),
            target: m.path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Opens directory `path` below `root` a component at a time, never through a link, making
/// missing directories (`0755`, root's) on the way.
fn open_target(root: &str, path: &str) -> Result<OwnedFd, SystemError> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let open = |dir: i32, name: &CString| {
        // SAFETY: `openat` returned a new descriptor that nothing else owns.
        openat(Some(dir), name.as_c_str(), flags, Mode::empty())
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let fail = |source| SystemError::Sys {
        what: "open a mount's path without following links",
        source,
    };
    let root_c = CString::new(root).map_err(|_| fail(nix::errno::Errno::EINVAL))?;
    let mut dir = open(libc::AT_FDCWD, &root_c).map_err(fail)?;
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Err(fail(nix::errno::Errno::EINVAL));
        }
        let name = CString::new(comp).map_err(|_| fail(nix::errno::Errno::EINVAL))?;
        let next = match open(dir.as_raw_fd(), &name) {
            Err(nix::errno::Errno::ENOENT) => {
                match mkdirat(
                    Some(dir.as_raw_fd()),
                    name.as_c_str(),
                    Mode::from_bits_truncate(0o755),
                ) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(e) => return Err(fail(e)),
                }
                open(dir.as_raw_fd(), &name)
            }
            other => other,
        }
        .map_err(fail)?;
        dir = next;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_makes_directories_and_refuses_links() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path().to_str().unwrap();
        std::fs::create_dir(root.path().join("srv")).unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join("srv/evil")).unwrap();
        std::fs::write(root.path().join("file"), b"x").unwrap();

        let fd = open_target(r, "/srv/new/deep").unwrap();
        assert!(root.path().join("srv/new/deep").is_dir());
        let shown = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(shown, root.path().join("srv/new/deep"));

        for bad in [
            "/srv/evil",
            "/srv/evil/x",
            "/file",
            "/file/x",
            "/srv/../etc",
        ] {
            assert!(open_target(r, bad).is_err(), "{bad}");
        }
        assert!(!Path::new("/etc/x").exists());
    }
}
