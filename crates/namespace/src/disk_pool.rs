//! Blank disks made ahead of time. A start that finds no disk in its state directory (a new
//! sandbox, a fork, one created from a snapshot) would otherwise make one on its own clock:
//! write the image from the template, attach a loop device and mount ext4, whose mount waits
//! for kernel threads to be created and writes the superblock (~30 ms together under load).
//! A [`DiskPool`] keeps `depth` disks of one size (the daemon's default) formatted, attached
//! and mounted, made by a low-priority thread, so such a start renames an image file into
//! its state directory and attaches a mount that is ready.
//!
//! A pooled disk is a *detached* mount (`fsopen`/`fsmount`): attached in no mount namespace,
//! so nothing can write to it before a sandbox has it, and alive only as long as the
//! descriptor this process holds. Its image (`<dir>/<pid>-<n>.ext4`) must be on the state
//! directories' filesystem: handing it over is the rename of that file to
//! `state_dir/disk.ext4` and a `move_mount` of the descriptor onto `state_dir/fs` (no mount
//! point is renamed, and no mount is moved out of a shared parent).
//!
//! The pool's thread makes the disk that replaces a handed-out one only once the sandbox that
//! took it has run its first command ([`go_ahead`]), or [`REFILL_WAIT`] later: a disk's mount
//! is kernel work (a loop device, an ext4 superblock, the journal's thread) that the nice value
//! of the pool's thread does not keep off the two cores the new sandbox and its first command
//! run on.
//!
//! When this process ends, however it ends, its descriptors close and the kernel releases each
//! detached mount, its filesystem and (autoclear) its loop device; only the image files are
//! left, and the next [`DiskPool::start`] on the directory deletes them before it makes new
//! ones. A disk leaves the pool under its lock, so it is handed out once; it is made for the
//! pool from the fresh template and never returns to it. Only root mounts disks (see
//! [`crate::disk`]): a rootless daemon has no pool.

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::disk;
use crate::live_mounts::{
    FSCONFIG_CMD_CREATE, FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSMOUNT_CLOEXEC, FSOPEN_CLOEXEC,
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOVE_MOUNT_F_EMPTY_PATH,
};

/// After failing to make a disk, the pool tries again this much later.
const RETRY: Duration = Duration::from_secs(10);
/// The longest the refill waits for the first command of the sandbox that took a disk.
pub const REFILL_WAIT: Duration = Duration::from_millis(250);

/// Errors starting a pool or making one of its disks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Only root mounts disks: a rootless daemon keeps no pool of them")]
    Rootless,
    #[error("Cannot prepare the disk pool's directory {}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Disk(#[from] disk::Error),
    #[error("Cannot mount a disk for the pool ({what})")]
    Mount {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("Cannot start the disk pool's thread")]
    Thread(#[source] io::Error),
}

/// One blank disk: its image file and its detached mount. Dropped, it deletes the image file
/// it names (the pool's, or the state directory's when the handover failed halfway).
struct Blank {
    image: Option<PathBuf>,
    mount: OwnedFd,
}

impl Drop for Blank {
    fn drop(&mut self) {
        if let Some(image) = self.image.take() {
            let _ = fs::remove_file(image);
        }
    }
}

impl Blank {
    /// Moves the image to `image` (which must not exist) and attaches the mount at `fs_dir`.
    fn attach(mut self, image: &Path, fs_dir: &Path) -> io::Result<()> {
        fs::create_dir_all(fs_dir)?;
        let from = self.image.as_deref().ok_or(io::ErrorKind::NotFound)?;
        let (from, to) = (path_cstr(from)?, path_cstr(image)?);
        // SAFETY: renameat2 on two NUL-terminated paths that outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        self.image = Some(image.to_owned());
        let target = path_cstr(fs_dir)?;
        // SAFETY: move_mount of a descriptor this value owns onto a NUL-terminated path.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                self.mount.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        self.image = None;
        Ok(())
    }
}

fn path_cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[derive(Default)]
struct State {
    ready: VecDeque<Blank>,
    closed: bool,
    made: u64,
    handed_out: u64,
    last_error: Option<String>,
    /// The state directory that took the last disk, and until when the refill waits for it.
    held: Option<(PathBuf, Instant)>,
}

struct Shared {
    dir: PathBuf,
    bytes: u64,
    depth: usize,
    /// How long a refill waits for the taker's first command at most.
    hold: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the oldest ready disk for the sandbox in `state_dir`; its replacement waits for
    /// that sandbox's first command.
    fn take(&self, state_dir: &Path) -> Option<Blank> {
        let mut st = self.lock();
        let blank = st.ready.pop_front()?;
        st.handed_out += 1;
        st.held = Some((state_dir.to_owned(), Instant::now() + self.hold));
        self.changed.notify_all();
        Some(blank)
    }

    /// Waits until a disk is to be made (true) or the pool is closed (false).
    fn wait_for_work(&self) -> bool {
        let mut st = self.lock();
        loop {
            if st.closed {
                return false;
            }
            let hold = st
                .held
                .as_ref()
                .and_then(|(_, until)| until.checked_duration_since(Instant::now()));
            st = match hold {
                Some(left) => {
                    self.changed
                        .wait_timeout(st, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None if st.ready.len() >= self.depth => {
                    st.held = None;
                    self.changed.wait(st).unwrap_or_else(|e| e.into_inner())
                }
                None => return true,
            };
        }
    }

    /// The pool's thread: makes disks while fewer than `depth` are ready, until closed.
    fn refill(&self) {
        // Below the sandboxes' starts, whose CPU time this must not take.
        // SAFETY: plain system calls without pointers, on this thread alone.
        unsafe {
            if let Ok(tid) = libc::id_t::try_from(libc::syscall(libc::SYS_gettid)) {
                libc::setpriority(libc::PRIO_PROCESS, tid, 19);
            }
        }
        for n in 0u64.. {
            if !self.wait_for_work() {
                return;
            }
            let made = make_blank(&self.dir, n, self.bytes);
            let mut st = self.lock();
            match made {
                Ok(_) if st.closed => return,
                Ok(blank) => {
                    st.ready.push_back(blank);
                    st.made += 1;
                    st.last_error = None;
                    self.changed.notify_all();
                }
                Err(e) => {
                    st.last_error = Some(crate::error_chain(&e));
                    self.changed.notify_all();
                    let _ = self.changed.wait_timeout_while(st, RETRY, |s| !s.closed);
                }
            }
        }
    }
}

/// The pool `disk::mount` takes from, set by [`DiskPool::install`].
static INSTALLED: Mutex<Option<Arc<Shared>>> = Mutex::new(None);

fn installed() -> Option<Arc<Shared>> {
    INSTALLED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Gives the state directory's new disk (`image`, mounted at `fs_dir`) from the installed
/// pool, when it keeps disks of `bytes`; false when there is none to give or the handover
/// failed (the caller then makes the disk itself; nothing of the pool's is left behind).
pub(crate) fn hand_over(bytes: u64, image: &Path, fs_dir: &Path) -> bool {
    let Some(pool) = installed().filter(|p| p.bytes == bytes) else {
        return false;
    };
    let state_dir = image.parent().unwrap_or(image);
    pool.take(state_dir)
        .is_some_and(|blank| blank.attach(image, fs_dir).is_ok())
}

/// The sandbox in `state_dir` ran a command: when it took the installed pool's last disk, the
/// replacement is made now.
pub fn go_ahead(state_dir: &Path) {
    let Some(pool) = installed() else {
        return;
    };
    let mut st = pool.lock();
    if st.held.as_ref().is_some_and(|(dir, _)| dir == state_dir) {
        st.held = None;
        pool.changed.notify_all();
    }
}

/// A pool of blank disks of one size; it stops, and deletes its ready disks, when dropped.
pub struct DiskPool {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl DiskPool {
    /// Deletes what an earlier process left in `dir` (created 0700 if missing) and starts
    /// keeping `depth` blank disks of `bytes` there. `dir` must be on the filesystem of the
    /// state directories that will take them.
    pub fn start(dir: &Path, bytes: u64, depth: usize) -> Result<DiskPool, Error> {
        Self::start_holding(dir, bytes, depth, REFILL_WAIT)
    }

    /// [`DiskPool::start`] with `hold` as the longest a refill waits for a taker's first
    /// command.
    fn start_holding(
        dir: &Path,
        bytes: u64,
        depth: usize,
        hold: Duration,
    ) -> Result<DiskPool, Error> {
        if !nix::unistd::Uid::effective().is_root() {
            return Err(Error::Rootless);
        }
        if bytes < disk::MIN_DISK_BYTES {
            return Err(disk::Error::TooSmall(bytes).into());
        }
        clear_leftovers(dir)?;
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            bytes,
            depth,
            hold,
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("disk-pool".into())
            .spawn(move || worker.refill())
            .map_err(Error::Thread)?;
        Ok(DiskPool {
            shared,
            thread: Some(thread),
        })
    }

    /// Makes this the pool that sandbox starts take their disks from (replacing another).
    pub fn install(&self) {
        *INSTALLED.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.shared.clone());
    }

    /// The size of its disks.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes
    }

    /// Disks ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    /// Disks made and disks handed out so far.
    pub fn counts(&self) -> (u64, u64) {
        let st = self.shared.lock();
        (st.made, st.handed_out)
    }

    /// Why the last disk could not be made, until one is made again.
    pub fn last_error(&self) -> Option<String> {
        self.shared.lock().last_error.clone()
    }

    /// Waits until `depth` disks are ready (true), or the last attempt failed or `timeout`
    /// passed (false).
    pub fn wait_full(&self, timeout: Duration) -> bool {
        let st = self.shared.lock();
        let (st, _) = self
            .shared
            .changed
            .wait_timeout_while(st, timeout, |s| {
                s.ready.len() < self.shared.depth && s.last_error.is_none() && !s.closed
            })
            .unwrap_or_else(|e| e.into_inner());
        st.ready.len() >= self.shared.depth
    }
}

impl Drop for DiskPool {
    fn drop(&mut self) {
        {
            let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
            if installed
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &self.shared))
            {
                *installed = None;
            }
        }
        let ready = {
            let mut st = self.shared.lock();
            st.closed = true;
            std::mem::take(&mut st.ready)
        };
        self.shared.changed.notify_all();
        drop(ready);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Creates `dir` (0700) and deletes the files in it: images of a process that ended without
/// dropping its pool. Their mounts and loop devices went with that process's descriptors.
fn clear_leftovers(dir: &Path) -> Result<(), Error> {
    let fail = |source| Error::Dir {
        path: dir.to_owned(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(fail)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(fail)?;
    for entry in fs::read_dir(dir).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        if entry.file_type().map_err(fail)?.is_file() {
            fs::remove_file(entry.path()).map_err(fail)?;
        }
    }
    Ok(())
}

/// Makes the `n`th disk: an image from the template, a loop device, a detached ext4 mount.
fn make_blank(dir: &Path, n: u64, bytes: u64) -> Result<Blank, Error> {
    let image = dir.join(format!("{}-{n}.ext4", std::process::id()));
    disk::create(&image, bytes)?;
    let mount = disk::attach_loop(&image)
        .map_err(Error::from)
        // The mount holds the device; autoclear detaches it when the mount is gone.
        .and_then(|device| detached_mount(&device.path));
    match mount {
        Ok(mount) => Ok(Blank {
            image: Some(image),
            mount,
        }),
        Err(e) => {
            let _ = fs::remove_file(&image);
            Err(e)
        }
    }
}

/// Mounts the ext4 filesystem on `device` with [`disk::MOUNT_OPTIONS`], attached nowhere.
fn detached_mount(device: &Path) -> Result<OwnedFd, Error> {
    let owned = |ret: libc::c_long, what| {
        let fd = crate::conv::fd(ret).map_err(|source| Error::Mount { what, source })?;
        // SAFETY: the system call just returned this new descriptor; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    // SAFETY: fsopen with a NUL-terminated name.
    let fsfd = owned(
        unsafe { libc::syscall(libc::SYS_fsopen, c"ext4".as_ptr(), FSOPEN_CLOEXEC) },
        "fsopen",
    )?;
    let config = |cmd: libc::c_uint, key: Option<&CStr>, value: Option<&CStr>, what| {
        // SAFETY: fsconfig on our descriptor with NUL-terminated strings (or null) that
        // outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fsfd.as_raw_fd(),
                cmd,
                key.map_or(std::ptr::null(), CStr::as_ptr),
                value.map_or(std::ptr::null(), CStr::as_ptr),
                0,
            )
        };
        if ret < 0 {
            return Err(Error::Mount {
                what,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    };
    let source = path_cstr(device).map_err(|source| Error::Mount {
        what: "device path",
        source,
    })?;
    config(
        FSCONFIG_SET_STRING,
        Some(c"source"),
        Some(&source),
        "source",
    )?;
    for option in disk::MOUNT_OPTIONS.split(',') {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        let key = CString::new(key).expect("the options have no NUL");
        let value = value.map(|v| CString::new(v).expect("the options have no NUL"));
        let cmd = if value.is_some() {
            FSCONFIG_SET_STRING
        } else {
            FSCONFIG_SET_FLAG
        };
        config(cmd, Some(&key), value.as_deref(), "option")?;
    }
    config(FSCONFIG_CMD_CREATE, None, None, "create the filesystem")?;
    // SAFETY: fsmount on our configured filesystem descriptor.
    owned(
        unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                fsfd.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            )
        },
        "fsmount",
    )
}

#[cfg(test)]
#[path = "disk_pool_tests.rs"]
mod tests;
