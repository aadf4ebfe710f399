//! Id blocks: which 65536 host uids and gids a sandbox's user namespace maps to when the
//! daemon runs as root. A block is reserved under a lock and kept in the state directory, so
//! concurrent launches never share one and a restarted sandbox keeps its own.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::idmap;
use crate::lifecycle::Error;
use crate::state::State;

/// First host uid of the id blocks handed to sandboxes when running as root.
const ID_BASE: u32 = 1_000_000_000;
/// Number of id blocks; `ID_BASE + SLOTS * 65536` stays below 2^32 - 2^16.
const SLOTS: u32 = 45_000;

/// The file in a state directory that holds its id block, written before first use.
const ID_BLOCK_FILE: &str = "idblock";

/// The sandbox's id block: the one it already has, or a newly reserved one. Reservation holds
/// a lock in the parent directory, so concurrent launches never pick the same block.
pub(crate) fn id_block(state_dir: &Path, id: &str) -> Result<u32, Error> {
    let mine = state_dir.join(ID_BLOCK_FILE);
    if let Some(base) = read_block(&mine) {
        return Ok(base);
    }
    let parent = state_dir.parent().unwrap_or(Path::new("/"));
    let lock_path = parent.join(".belljar-idblock.lock");
    let lock = fs::File::create(&lock_path).map_err(|source| Error::Prepare {
        path: lock_path.clone(),
        source,
    })?;
    // SAFETY: flock on an fd we own; the lock is released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } < 0 {
        let source = io::Error::last_os_error();
        return Err(Error::Prepare {
            path: lock_path,
            source,
        });
    }
    let base = allocate_base(state_dir, id);
    fs::write(&mine, format!("{base}\n")).map_err(|source| Error::Prepare {
        path: mine.clone(),
        source,
    })?;
    Ok(base)
}

fn read_block(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Picks a free id block: a hash of the id, then the next block not used by a sibling
/// state directory (sandboxes' state directories normally share a parent).
fn allocate_base(state_dir: &Path, id: &str) -> u32 {
    let mut used = std::collections::BTreeSet::new();
    if let Some(parent) = state_dir.parent() {
        for entry in fs::read_dir(parent).into_iter().flatten().flatten() {
            if entry.path() == state_dir {
                continue;
            }
            if let Some(base) = read_block(&entry.path().join(ID_BLOCK_FILE)) {
                used.insert(base);
            } else if let Ok(Some(st)) = State::load(&entry.path()) {
                used.insert(st.root_uid);
            }
        }
    }
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let first =
        u32::try_from(hash % u64::from(SLOTS)).expect("a remainder below SLOTS fits its u32");
    (0..SLOTS)
        .map(|i| ID_BASE + ((first + i) % SLOTS) * idmap::RANGE)
        .find(|base| !used.contains(base))
        .unwrap_or(ID_BASE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_distinct_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
        fs::create_dir_all(&one).unwrap();
        fs::create_dir_all(&two).unwrap();
        let a = id_block(&one, "same").unwrap();
        assert!(a >= ID_BASE);
        assert_eq!((a - ID_BASE) % idmap::RANGE, 0);
        assert!(a.checked_add(idmap::RANGE).is_some());
        // Kept across calls, and a sibling with the same hash gets the next block.
        assert_eq!(id_block(&one, "same").unwrap(), a);
        let b = id_block(&two, "same").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.abs_diff(b) % idmap::RANGE, 0);
    }
}
