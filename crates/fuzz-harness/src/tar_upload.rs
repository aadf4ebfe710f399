//! The agent's tar upload (`PUT /v1/files/tar`) into a scratch directory. The input is
//! either a raw tar stream or, more usefully, a list of entries (any name bytes, type, mode,
//! link name, data) built into an archive with valid checksums and then maybe truncated.
//! Whatever the archive holds, extraction must not panic and must not touch anything outside
//! the target directory: a sibling directory and a file in it (owned by a uid the agent
//! would never hand out) must come out exactly as they went in.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

use crate::agent_answer::runtime;
use crate::input::Input;

/// Fixed, so that an archive can name the sibling by its absolute path.
pub const BASE: &str = "/tmp/belljar-fuzz-tar";
const SENTINEL: &[u8] = b"outside the upload target";
const SENTINEL_UID: u32 = 54321;

/// What the files outside the target look like; compared before and after.
#[derive(Debug, PartialEq, Eq)]
struct Outside {
    dir_mode: u32,
    dir_entries: Vec<String>,
    sentinel: Vec<u8>,
    sentinel_meta: (u32, u32, u32, u64),
    base_entries: Vec<String>,
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|d| d.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn snapshot(base: &Path) -> Outside {
    let outside = base.join("outside");
    let sentinel = outside.join("sentinel");
    let meta = std::fs::symlink_metadata(&sentinel).expect("sentinel is there");
    Outside {
        dir_mode: std::fs::symlink_metadata(&outside)
            .map(|m| m.mode())
            .unwrap_or(0),
        dir_entries: names(&outside),
        sentinel: std::fs::read(&sentinel).unwrap_or_default(),
        sentinel_meta: (meta.uid(), meta.gid(), meta.mode(), meta.nlink()),
        base_entries: names(base),
    }
}

fn prepare(base: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(base);
    let outside = base.join("outside");
    std::fs::create_dir_all(&outside).expect("outside dir");
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).expect("mode");
    let sentinel = outside.join("sentinel");
    std::fs::write(&sentinel, SENTINEL).expect("sentinel");
    std::fs::set_permissions(&sentinel, std::fs::Permissions::from_mode(0o600)).expect("mode");
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::lchown(&sentinel, Some(SENTINEL_UID), Some(SENTINEL_UID))
            .expect("chown sentinel");
    }
    // The target already holds links out, as a guest could have left them.
    let root = base.join("root");
    std::fs::create_dir(&root).expect("target dir");
    let _ = std::os::unix::fs::symlink("../outside", root.join("up"));
    let _ = std::os::unix::fs::symlink(&outside, root.join("abs"));
    let _ = std::os::unix::fs::symlink(outside.join("sentinel"), root.join("file"));
    root
}

/// Holds the scratch directory against other processes until dropped.
fn lock_base() -> nix::fcntl::Flock<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("{BASE}.lock"))
        .expect("lock file");
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("cannot lock {BASE}.lock: {e}"))
}

/// Builds an archive from entry descriptions; checksums are right so that the interesting
/// code (paths, types, links, modes) is reached, and the end may be cut off.
fn archive(input: &mut Input) -> Vec<u8> {
    let mut out = Vec::new();
    let n = input.u8() % 8;
    for _ in 0..n {
        let mut header = tar::Header::new_gnu();
        let name = input.string(99);
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        let kind = match input.u8() % 8 {
            0 => b'5',
            1 => b'2',
            2 => b'1',
            3 => input.u8(),
            _ => b'0',
        };
        header.set_entry_type(tar::EntryType::new(kind));
        let mode = if input.one_in(4) {
            input.u32() & 0o7777
        } else {
            0o644
        };
        header.set_mode(mode);
        let link = input.string(99);
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        let data = input.string(2048);
        header.set_size(data.len() as u64);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    if input.one_in(4) {
        let cut = usize::from(input.u16()) % out.len();
        out.truncate(cut);
    }
    out
}

pub fn run(data: &[u8]) {
    // One fixed scratch directory for every process: a fuzzer and a `cargo test` replaying
    // the corpus take turns through a lock file (and threads of one process through a mutex),
    // or one would wipe the other's directory mid-check.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let _flock = lock_base();
    let mut input = Input::new(data);
    let raw = input.one_in(4);
    let tar = if raw {
        input.rest().to_vec()
    } else {
        archive(&mut input)
    };
    let chunk = usize::from(input.u8()).max(1) * 64;
    let base = Path::new(BASE);
    let root = prepare(base);
    let before = snapshot(base);
    let chunks: Vec<Result<Bytes, std::io::Error>> = tar
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let target = root.to_str().expect("utf-8 path").to_owned();
    let _ = runtime().block_on(belljar_agent::files::tar_upload(
        &target,
        None,
        futures::stream::iter(chunks),
    ));
    let after = snapshot(base);
    assert_eq!(
        before, after,
        "the upload changed something outside its target"
    );
}

/// Removes the shared scratch directory, under the same lock as a run.
pub fn remove_scratch() {
    let _flock = lock_base();
    let _ = std::fs::remove_dir_all(BASE);
}
