//! The sandbox's disk limit: everything a sandbox can write to the host's disk (the overlay's
//! upper and work directories, `/run/belljar`) lives on its own ext4 filesystem, a sparse file
//! of the requested size in the state directory, loop-mounted at `state_dir/fs` in the host's
//! mount namespace. A sandbox that fills it gets `ENOSPC`, and `df /` inside shows its size
//! (overlayfs reports its upper filesystem).
//!
//! Mounting needs root on the host; rootless sandboxes write to the host directory and the
//! limit is reported as not enforced, with the reason ([`ROOTLESS_REASON`]). No unprivileged
//! way is sound: ext4 (or any disk filesystem) may not be mounted inside a user namespace, and
//! project quotas are set from the host's root. tmpfs may be mounted there with a `size=`, but
//! it would hold the sandbox's files in memory (charged to its memory limit, so a 4 GiB disk
//! could need 4 GiB of RAM) and lose them when the sandbox stops, and the daemon's snapshots
//! read the upper directory from the host. A FUSE ext4 (`fuse2fs`) would put every write
//! through a userspace filesystem parser of an image the sandbox fills.
//!
//! Formatting is the slow part of a launch (`mkfs.ext4` is a process that writes and fsyncs
//! ~2 MiB, 30-210 ms on a loaded machine), and every fresh disk of one size is the same
//! filesystem. So the first disk of each size is formatted and its data extents (found with
//! `SEEK_DATA`/`SEEK_HOLE`, ~2 MiB for 4 GiB) are kept in memory as a [`Template`]; later
//! disks of that size are a sparse file with those extents written back, which costs a few
//! milliseconds. The template lives only in this process, so nothing on disk can be swapped
//! for it between two launches.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cgroup::LimitStatus;

/// The filesystem image in the state directory.
pub(crate) const DISK_FILE: &str = "disk.ext4";

/// Why a rootless sandbox's disk limit is not enforced (its `limits.disk`, and `belljar
/// doctor`'s disk finding).
pub const ROOTLESS_REASON: &str = "rootless: the sandbox's writes go to your own disk without a size limit; \
     limiting them needs a filesystem of that size mounted for the sandbox (ext4 on a loop device), \
     which only root may mount (tmpfs, which you may mount, would keep the files in memory and lose them at stop)";

/// The smallest disk a sandbox can have: ext4 needs room for its own metadata.
pub const MIN_DISK_BYTES: u64 = 16 << 20;

/// The disk's mount options. `noinit_itable`: no kernel thread zeroes the inode tables that
/// `mkfs` left uninitialised (`lazy_itable_init`), since in the sparse image they are holes,
/// which read as zeros already; it saves that thread's creation at every mount and its writes.
pub(crate) const MOUNT_OPTIONS: &str = "errors=remount-ro,noinit_itable";

/// Errors making or mounting a sandbox's disk.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image file could not be created or sized.
    #[error("Cannot create the disk image {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `mkfs.ext4` failed or is missing.
    #[error("Cannot format the disk image: {0}")]
    Format(String),
    /// No loop device could be attached.
    #[error("Cannot attach a loop device")]
    Loop(#[source] io::Error),
    /// The mount system call failed.
    #[error("Cannot mount the disk at {}", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The requested size is below [`MIN_DISK_BYTES`].
    #[error("A disk of {0} bytes is too small")]
    TooSmall(u64),
    /// An earlier mount of the image outlived its unmount here for longer than
    /// [`RELEASE_TIMEOUT`] (see [`wait_released`]).
    #[error(
        "The disk image {} is still mounted elsewhere: a process that copied the host's mount namespace while the disk was mounted holds it",
        path.display()
    )]
    Busy { path: PathBuf },
}

/// How long mounting an image again waits for its previous mount to end.
pub(crate) const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes (once) and mounts the disk of `bytes` at `fs_dir`; returns how the limit holds.
/// Re-launching a stopped sandbox mounts its existing disk again.
pub(crate) fn mount(state_dir: &Path, fs_dir: &Path, bytes: u64) -> Result<LimitStatus, Error> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(LimitStatus::NotEnforced {
            reason: ROOTLESS_REASON.into(),
        });
    }
    if bytes < MIN_DISK_BYTES {
        return Err(Error::TooSmall(bytes));
    }
    let how = LimitStatus::Enforced {
        how: format!(
            "ext4 filesystem of {} MiB for the writable layer",
            bytes >> 20
        ),
    };
    if is_mount_point(fs_dir) {
        return Ok(how);
    }
    let image = state_dir.join(DISK_FILE);
    if !image.exists() {
        // A blank disk made ahead of time, when the daemon keeps them for this size.
        if crate::disk_pool::hand_over(bytes, &image, fs_dir) {
            return Ok(how);
        }
        create(&image, bytes)?;
    } else {
        wait_released(&image, RELEASE_TIMEOUT)?;
    }
    fs::create_dir_all(fs_dir).map_err(|source| Error::Mount {
        path: fs_dir.to_owned(),
        source,
    })?;
    let device = attach_loop(&image)?;
    let result = nix::mount::mount(
        Some(device.path.as_path()),
        fs_dir,
        Some("ext4"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(MOUNT_OPTIONS),
    );
    // With autoclear set, the device detaches once the mount is gone and no one holds it open.
    drop(device);
    result.map_err(|e| Error::Mount {
        path: fs_dir.to_owned(),
        source: e.into(),
    })?;
    Ok(how)
}

/// Unmounts the disk if it is mounted; the image file stays for a later launch.
pub(crate) fn unmount(fs_dir: &Path) {
    if is_mount_point(fs_dir) {
        let _ = nix::mount::umount2(fs_dir, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The files that loop devices read (`/sys/block/loop*/loop/backing_file`), as the kernel
/// names them (a deleted one ends in ` (deleted)`).
pub(crate) fn loop_backing_files() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| fs::read(e.path().join("loop/backing_file")).ok())
        .map(|mut f| {
            if f.last() == Some(&b'\n') {
                f.pop();
            }
            PathBuf::from(std::ffi::OsString::from_vec(f))
        })
        .collect()
}

/// Waits until no loop device reads `image`: until the filesystem last mounted from it has
/// ended. Unmounting the disk here does not end it when another mount namespace holds a copy
/// of the mount: a process that copied the host's namespace while the disk was mounted (a
/// sandbox starting, until it pivots into its root; `ip netns exec`; any `unshare -m`). Its
/// last writes may then still be in its journal in memory, so a second filesystem mounted
/// from the image through another loop device would not see them (a snapshot missing files,
/// or the whole writable layer), and the first one's writes at its end would land over the
/// second's. The loop devices are attached with autoclear, so each goes with its filesystem.
pub(crate) fn wait_released(image: &Path, timeout: Duration) -> Result<(), Error> {
    let busy = || Error::Busy {
        path: image.to_owned(),
    };
    let Ok(image_path) = fs::canonicalize(image) else {
        return Ok(());
    };
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    while loop_backing_files().contains(&image_path) {
        let now = Instant::now();
        if now >= deadline {
            return Err(busy());
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    Ok(())
}

/// The size of the sandbox's disk in `state_dir` (its image file's length, the size it was
/// made with), or `None` when it has none (a rootless sandbox's writes have no disk).
pub(crate) fn size(state_dir: &Path) -> Option<u64> {
    fs::symlink_metadata(state_dir.join(DISK_FILE))
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
}

/// Whether `dir` is a mount point in this mount namespace (a different device than its
/// parent, or the same directory seen through a bind — neither applies to a plain directory).
pub(crate) fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(Ok(parent))) = (
        fs::symlink_metadata(dir),
        dir.parent().map(fs::symlink_metadata),
    ) else {
        return false;
    };
    me.is_dir() && me.dev() != parent.dev()
}

/// A freshly formatted disk image of one size: its length and the bytes of its data extents.
pub(crate) struct Template {
    len: u64,
    extents: Vec<(u64, Vec<u8>)>,
}

/// At most this many bytes of data are kept per template (a 4 GiB disk has ~2 MiB); a larger
/// filesystem is formatted each time instead.
const MAX_TEMPLATE_BYTES: u64 = 64 << 20;

/// The templates of this process, by disk size.
static TEMPLATES: Mutex<Vec<(u64, Arc<Template>)>> = Mutex::new(Vec::new());

impl Template {
    /// Reads the data extents of the image `file` of `len` bytes.
    fn read(file: &fs::File, len: u64) -> io::Result<Option<Template>> {
        let fd = file.as_raw_fd();
        let mut extents = Vec::new();
        let mut total = 0u64;
        let mut at = 0i64;
        loop {
            // SAFETY: lseek on a file descriptor this function borrows; no memory is passed.
            let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
            if data < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENXIO) {
                    break; // no data after `at`
                }
                return Err(e);
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            if hole < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = (hole - data) as u64;
            total += n;
            if total > MAX_TEMPLATE_BYTES {
                return Ok(None);
            }
            let Ok(len) = usize::try_from(n) else {
                return Ok(None);
            };
            let mut bytes = vec![0u8; len];
            file.read_exact_at(&mut bytes, data as u64)?;
            extents.push((data as u64, bytes));
            at = hole;
        }
        Ok(Some(Template { len, extents }))
    }

    /// Writes the template into the new, empty file `file`.
    fn write(&self, file: &fs::File) -> io::Result<()> {
        file.set_len(self.len)?;
        for (at, bytes) in &self.extents {
            file.write_all_at(bytes, *at)?;
        }
        Ok(())
    }

    /// The bytes of data the template holds.
    #[cfg(test)]
    pub(crate) fn data_bytes(&self) -> u64 {
        self.extents.iter().map(|(_, b)| b.len() as u64).sum()
    }
}

/// The template of `bytes`, if one was made in this process.
pub(crate) fn template(bytes: u64) -> Option<Arc<Template>> {
    let templates = TEMPLATES.lock().unwrap_or_else(|e| e.into_inner());
    templates
        .iter()
        .find(|(size, _)| *size == bytes)
        .map(|(_, t)| t.clone())
}

/// Makes the image of a fresh filesystem of `bytes` at `image`: from this size's template,
/// or with `mkfs.ext4` the first time (which then becomes the template).
pub(crate) fn create(image: &Path, bytes: u64) -> Result<(), Error> {
    let fail = |source| Error::Create {
        path: image.to_owned(),
        source,
    };
    let tmp = image.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(fail)?;
    if let Some(t) = template(bytes) {
        t.write(&file).map_err(fail)?;
        drop(file);
        return fs::rename(&tmp, image).map_err(fail);
    }
    file.set_len(bytes).map_err(fail)?;
    format(&tmp)?;
    // mkfs wrote through its own descriptor; ours sees the same file.
    // Too much data, or extents unreadable: this size is formatted each time.
    if let Ok(Some(t)) = Template::read(&file, bytes) {
        let mut templates = TEMPLATES.lock().unwrap_or_else(|e| e.into_inner());
        if !templates.iter().any(|(size, _)| *size == bytes) {
            templates.push((bytes, Arc::new(t)));
        }
    }
    drop(file);
    fs::rename(&tmp, image).map_err(fail)
}

/// Formats the sized file `image` as ext4; on failure the file is removed.
fn format(image: &Path) -> Result<(), Error> {
    let mkfs = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .unwrap_or(Path::new("mkfs.ext4"));
    // No reserved blocks (the sandbox's root is the only user) and lazy initialisation, so
    // formatting costs milliseconds whatever the size.
    let out = Command::new(mkfs)
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
        ])
        .arg(image)
        .output()
        .map_err(|e| Error::Format(format!("cannot run {}: {e}", mkfs.display())))?;
    if !out.status.success() {
        let _ = fs::remove_file(image);
        return Err(Error::Format(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(())
}

/// An attached loop device, open until dropped.
pub(crate) struct LoopDevice {
    pub(crate) path: PathBuf,
    _file: fs::File,
}

/// `struct loop_config` of `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// Attaches `image` to a free loop device with autoclear; retries when another process takes
/// the free device first.
pub(crate) fn attach_loop(image: &Path) -> Result<LoopDevice, Error> {
    let backing = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(image)
        .map_err(Error::Loop)?;
    let control = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(Error::Loop)?;
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(Error::Loop(io::Error::last_os_error()));
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let file = match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::Loop(e)),
        };
        let config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                device: 0,
                inode: 0,
                rdevice: 0,
                offset: 0,
                sizelimit: 0,
                number: 0,
                encrypt_type: 0,
                encrypt_key_size: 0,
                flags: LO_FLAGS_AUTOCLEAR,
                file_name: [0; 64],
                crypt_name: [0; 64],
                encrypt_key: [0; 32],
                init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads one initialised `loop_config` that outlives the call.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), LOOP_CONFIGURE, &config) };
        if ret == 0 {
            return Ok(LoopDevice { path, _file: file });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(Error::Loop(e));
        }
    }
    Err(Error::Loop(io::Error::from_raw_os_error(libc::EBUSY)))
}

#[cfg(test)]
#[path = "disk_tests.rs"]
pub(crate) mod tests;
