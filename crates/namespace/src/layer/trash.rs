//! Deleting trees off the caller's clock. A live snapshot whose content was captured before
//! (the same digest) leaves a complete copy that nothing needs; deleting it where it was made
//! would keep the sandbox frozen for as long as the deletion takes (each `rmdir` waits for the
//! filesystem: several milliseconds apiece on a host mounted with `discard`). Such a tree is
//! handed to one low-priority thread instead.
//!
//! Only trees that nothing else can name go here: a copy is first renamed to a unique
//! `.trash-` name (one system call), which no capture looks for and which counts as partial
//! (see [`super::is_partial`]), so a daemon that ends before the thread gets to it leaves a
//! directory that its next start deletes. A layer that the store names is never deleted this
//! way: a capture of the same content could find it still there and share it just before it
//! went.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Condvar, Mutex};

/// The thread's queue, and how many trees it has not deleted yet.
struct Trash {
    queue: Mutex<Option<Sender<PathBuf>>>,
    pending: Mutex<usize>,
    emptied: Condvar,
}

static TRASH: Trash = Trash {
    queue: Mutex::new(None),
    pending: Mutex::new(0),
    emptied: Condvar::new(),
};

/// The prefix of a tree waiting for the trash thread.
pub(crate) const PREFIX: &[u8] = b".trash-";

/// Renames the unreferenced copy at `path` (a `.tmp-` directory) to its `.trash-` name and
/// deletes it on the trash thread (at once, here, when it cannot be renamed or that thread
/// cannot be started).
pub(crate) fn remove_later(path: &Path) {
    let renamed = path.file_name().and_then(|name| {
        let rest = name.as_bytes().strip_prefix(b".tmp-")?;
        let trash = path.with_file_name(OsStr::from_bytes(&[PREFIX, rest].concat()));
        std::fs::rename(path, &trash).ok().map(|()| trash)
    });
    let Some(path) = renamed else {
        super::remove_tree(path);
        return;
    };
    let mut queue = TRASH.queue.lock().unwrap_or_else(|e| e.into_inner());
    if queue.is_none() {
        *queue = start();
    }
    let Some(sender) = queue.as_ref() else {
        drop(queue);
        super::remove_tree(&path);
        return;
    };
    *TRASH.pending.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    if let Err(returned) = sender.send(path) {
        // The thread is gone (it panicked): delete here, and start another next time.
        *queue = None;
        drop(queue);
        done();
        super::remove_tree(&returned.0);
    }
}

/// Waits until every tree handed over so far is deleted, or `timeout` passes; returns
/// whether the trash is empty.
pub fn wait_empty(timeout: std::time::Duration) -> bool {
    let pending = TRASH.pending.lock().unwrap_or_else(|e| e.into_inner());
    let (pending, _) = TRASH
        .emptied
        .wait_timeout_while(pending, timeout, |n| *n > 0)
        .unwrap_or_else(|e| e.into_inner());
    *pending == 0
}

fn done() {
    let mut pending = TRASH.pending.lock().unwrap_or_else(|e| e.into_inner());
    *pending = pending.saturating_sub(1);
    if *pending == 0 {
        TRASH.emptied.notify_all();
    }
}

fn start() -> Option<Sender<PathBuf>> {
    let (sender, receiver) = channel::<PathBuf>();
    std::thread::Builder::new()
        .name("layer-trash".into())
        .spawn(move || {
            // Below everything a sandbox start or a command does.
            // SAFETY: a plain system call without pointers, on this thread alone.
            unsafe {
                if let Ok(tid) = libc::id_t::try_from(libc::syscall(libc::SYS_gettid)) {
                    libc::setpriority(libc::PRIO_PROCESS, tid, 19);
                }
            }
            for path in receiver {
                super::remove_tree(&path);
                done();
            }
        })
        .ok()
        .map(|_| sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy handed over leaves the directory at once under its trash name, and is gone
    /// once the trash is empty; a tree not named as a copy is deleted at once.
    #[test]
    fn a_copy_goes_to_the_trash_and_is_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join(".tmp-1-2");
        std::fs::create_dir_all(copy.join("a/b")).unwrap();
        std::fs::write(copy.join("a/b/f"), b"x").unwrap();
        remove_later(&copy);
        assert!(!copy.exists());
        assert!(wait_empty(std::time::Duration::from_secs(10)));
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

        let other = tmp.path().join("plain");
        std::fs::create_dir_all(other.join("d")).unwrap();
        remove_later(&other);
        assert!(!other.exists());
    }
}
