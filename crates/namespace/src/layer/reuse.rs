//! Captures of one writable layer after another (the live snapshots and forks of a running
//! sandbox, then its stopping snapshot) copy only what changed since the capture before. The
//! writable layer holds everything the sandbox changed since it started, so without this each
//! capture copied and hashed all of it again: a fork of a sandbox that once wrote 500 MiB read
//! and wrote 500 MiB while the sandbox stood frozen, however little changed since.
//!
//! After a capture, each regular file it took is remembered with its inode, size, modification
//! and change times, and the hash of its content. The next capture of the same writable layer
//! hard-links a file whose four are unchanged from the earlier layer (layers are immutable)
//! and lists the remembered hash, so the new layer and its digest are the same as a full copy
//! would give. The change time is the kernel's: a write, a `chmod`, a `chown`, an attribute
//! change or a rename moves it, and a namespace sandbox cannot set it or the clock. Anything
//! that does not hold (the earlier layer deleted or squashed away, a link limit) falls back to
//! the copy.
//!
//! Kept in this process's memory, per writable layer: a restarted daemon copies everything
//! once, then links again. A sandbox's entries go when it is destroyed ([`forget`]).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::sparse::Copied;

/// What tells an unchanged file from a changed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        Self {
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// One regular file as a capture took it.
#[derive(Debug, Clone, Copy)]
struct Taken {
    stamp: Stamp,
    copied: Copied,
}

/// The regular files of one capture, by their path in the layer.
#[derive(Debug, Default)]
pub(crate) struct Files(HashMap<PathBuf, Taken>);

impl Files {
    /// Notes that the file at `rel`, as `meta` describes it, was `copied` in this capture.
    pub(crate) fn note(&mut self, rel: &Path, meta: &fs::Metadata, copied: Copied) {
        self.0.insert(
            rel.to_owned(),
            Taken {
                stamp: Stamp::of(meta),
                copied,
            },
        );
    }
}

/// The last capture of one writable layer.
#[derive(Debug)]
pub(crate) struct Previous {
    /// The layer it made (or found already stored).
    layer: PathBuf,
    files: Files,
}

impl Previous {
    /// Hard-links the earlier capture's copy of `rel` to `dst` when the file did not change
    /// since; returns its content hash and stored bytes. `None` when it must be copied.
    pub(crate) fn link(&self, rel: &Path, meta: &fs::Metadata, dst: &Path) -> Option<Copied> {
        let taken = self.files.0.get(rel)?;
        if taken.stamp != Stamp::of(meta) {
            return None;
        }
        fs::hard_link(self.layer.join(rel), dst).ok()?;
        Some(taken.copied)
    }
}

/// The last capture of each writable layer this process made, by the layer's path.
static PREVIOUS: Mutex<Option<HashMap<PathBuf, Arc<Previous>>>> = Mutex::new(None);

fn with_map<T>(f: impl FnOnce(&mut HashMap<PathBuf, Arc<Previous>>) -> T) -> T {
    let mut guard = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// The last capture of the writable layer at `upper`, if this process made one.
pub(crate) fn previous(upper: &Path) -> Option<Arc<Previous>> {
    with_map(|m| m.get(upper).cloned())
}

/// Remembers that the capture of `upper` made `layer` with `files`.
pub(crate) fn remember(upper: &Path, layer: PathBuf, files: Files) {
    with_map(|m| m.insert(upper.to_owned(), Arc::new(Previous { layer, files })));
}

/// Forgets the captures of every writable layer under `state_dir` (a destroyed sandbox).
pub fn forget(state_dir: &Path) {
    with_map(|m| m.retain(|upper, _| !upper.starts_with(state_dir)));
}
