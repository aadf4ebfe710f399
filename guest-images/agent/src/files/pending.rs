//! The temporary files and directories of uploads in progress (`.NAME.belljar-PID-N.tmp`
//! beside a file being written, `.belljar-upload-PID-N.tmp` in a directory a tar lands in),
//! which must not outlive an upload that does not finish: left behind, they showed in
//! listings and in every snapshot after.
//!
//! An upload can end three ways before its rename. Its body fails (the caller's connection
//! dropped): the upload's own error path removes the file. The request is reset (the daemon's
//! upstream caller went away, so the daemon reset the HTTP/2 stream): the server drops the
//! upload's future mid-await, and only a drop guard, [`Pending`], still runs. The agent itself
//! dies (a sandbox stopped hard, a microVM killed): nothing runs, so each pending path is also
//! written down in a journal beside the sandbox's files, as a symlink named after the upload
//! whose target is the temporary path, and [`start`] removes what the journal names before the
//! agent serves again. The journal is found at once, with no scan of the disk.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the journal lives, once [`start`] has run (never in the agent's unit tests).
static JOURNAL: OnceLock<PathBuf> = OnceLock::new();

static ENTRY_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether `name` is one of the temporary names the agent gives, so that a journal entry
/// (the sandbox's user can write there) never makes the agent remove anything else.
fn is_temporary_name(name: &str) -> bool {
    name.starts_with('.')
        && name.ends_with(".tmp")
        && (name.contains(".belljar-") || name.starts_with(".belljar-upload-"))
}

/// Removes a temporary file or directory, not following a symlink.
fn remove(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets the journal's directory and removes what it names: the temporary paths of uploads
/// that a previous agent did not finish. Returns how many were removed.
pub fn start(journal: &Path) -> usize {
    let _ = JOURNAL.set(journal.to_owned());
    let Ok(entries) = std::fs::read_dir(journal) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let entry = entry.path();
        if let Ok(tmp) = std::fs::read_link(&entry)
            && tmp.is_absolute()
            && tmp
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_temporary_name)
        {
            match remove(&tmp) {
                Ok(()) => removed += 1,
                Err(e) => tracing::warn!(path = %tmp.display(), "cannot remove: {e}"),
            }
        }
        let _ = std::fs::remove_file(&entry);
    }
    let _ = std::fs::remove_dir(journal);
    if removed > 0 {
        tracing::info!(removed, "removed the temporary files of unfinished uploads");
    }
    removed
}

/// Writes `path` down in the journal as a new entry. The journal directory exists only while
/// an upload is in progress (so that it shows in no snapshot of an idle sandbox): it is made
/// here when missing, and another upload's end may remove it in between, hence the retries.
/// A journal that cannot be written costs only the clean-up after a dead agent.
fn record(journal: &Path, path: &Path) -> Option<PathBuf> {
    let entry = journal.join(format!(
        "{}-{}",
        std::process::id(),
        ENTRY_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut last = None;
    for _ in 0..3 {
        match std::os::unix::fs::symlink(path, &entry) {
            Ok(()) => return Some(entry),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(journal)
                    && e.kind() != io::ErrorKind::AlreadyExists
                {
                    last = Some(e);
                    break;
                }
            }
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    if let Some(e) = last {
        tracing::warn!(path = %journal.display(), "cannot record an upload: {e}");
    }
    None
}

/// An upload's temporary path, removed when the guard drops unless [`Pending::finish`] said
/// it is gone (renamed into place or cleaned up already).
pub struct Pending {
    path: PathBuf,
    entry: Option<PathBuf>,
    finished: bool,
}

impl Pending {
    /// Records `path` before it is created.
    pub fn new(path: PathBuf) -> Self {
        let entry = JOURNAL.get().and_then(|journal| record(journal, &path));
        Self {
            path,
            entry,
            finished: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temporary path no longer exists: only the journal entry goes.
    pub fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.finished
            && let Err(e) = remove(&self.path)
        {
            tracing::warn!(path = %self.path.display(), "cannot remove an upload's leftovers: {e}");
        }
        if let Some(entry) = &self.entry {
            let _ = std::fs::remove_file(entry);
            // The last upload's end takes the journal away; it fails while others run.
            if let Some(journal) = entry.parent() {
                let _ = std::fs::remove_dir(journal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_temporary_names_are_removed() {
        assert!(is_temporary_name(".a.txt.belljar-1-0.tmp"));
        assert!(is_temporary_name(".belljar-upload-1-2.tmp"));
        assert!(!is_temporary_name("a.txt"));
        assert!(!is_temporary_name(".bashrc"));
        assert!(!is_temporary_name("x.belljar-1-0.tmp"));
    }

    #[test]
    fn a_dropped_guard_removes_its_path_and_a_finished_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(".f.belljar-1-0.tmp");
        std::fs::write(&tmp, "half").unwrap();
        drop(Pending::new(tmp.clone()));
        assert!(!tmp.exists());
        std::fs::write(&tmp, "renamed already").unwrap();
        Pending::new(tmp.clone()).finish();
        assert!(tmp.exists());
    }
}
