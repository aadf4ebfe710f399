//! The sandbox's user namespace: which host uids and gids its ids map to.
//!
//! As root every sandbox gets its own block of 65536 host ids (sandbox root is host uid
//! `base`), so processes of one sandbox own nothing of the host or of another sandbox. The
//! image tree is then shown through an idmapped mount (see `child`). Rootless, the invoking
//! user becomes root inside and, through `newuidmap`/`newgidmap` and `/etc/subuid`,
//! `/etc/subgid`, ids 1..=65535 map onto the user's subordinate range. Without those a
//! sandbox would have no `belljar` user (uid 1000), so that is an error naming the fix
//! ([`Error::NoSubids`], [`Error::NoUidmap`]), never a silently smaller sandbox.
//!
//! The namespace is made first, by a short-lived helper process, and kept alive by an fd;
//! the sandbox then joins it with `setns` before unsharing everything else, so every other
//! namespace of the sandbox is owned by it.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;

use nix::sched::CloneFlags;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Gid, Uid, User, fork};

/// Errors making a user namespace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Cannot start the user-namespace helper")]
    Fork(#[source] nix::Error),
    #[error("Cannot create a user namespace (are unprivileged user namespaces disabled?)")]
    Unshare,
    #[error("Cannot write {what} for the sandbox's user namespace")]
    Map {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{tool} failed: {stderr}")]
    Helper { tool: &'static str, stderr: String },
    #[error("Cannot open the user namespace")]
    Open(#[source] std::io::Error),
    /// Rootless without a subordinate id range: a sandbox could not have its `belljar` user.
    #[error(
        "No subordinate ids for {user} ({missing}): rootless sandboxes need 65536 of them. \
         Add them with: {fix}"
    )]
    NoSubids {
        user: String,
        missing: String,
        fix: String,
    },
    /// Rootless without the setuid helpers that write a multi-id map.
    #[error(
        "newuidmap and newgidmap are missing: rootless sandboxes need them to map subordinate \
         ids. Install them with: sudo apt-get install uidmap"
    )]
    NoUidmap,
}

impl Error {
    /// A stable, machine-readable name of the failure (for `belljar doctor --json` and the
    /// daemon's error bodies): what is missing, not how it was noticed.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoSubids { .. } => "subids_missing",
            Self::NoUidmap => "uidmap_missing",
            Self::Unshare => "userns_unavailable",
            Self::Fork(_) | Self::Map { .. } | Self::Helper { .. } | Self::Open(_) => {
                "userns_failed"
            }
        }
    }
}

/// One line of a uid or gid map: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// How a sandbox's ids map to the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMap {
    pub uids: Vec<Extent>,
    pub gids: Vec<Extent>,
    /// Write the maps through `newuidmap`/`newgidmap` (rootless with subordinate ids).
    pub use_helpers: bool,
    /// Rootless without subordinate ids: `setgroups` must be denied to write the gid map.
    pub deny_setgroups: bool,
}

/// Ids per sandbox.
pub const RANGE: u32 = 65536;

impl IdMap {
    /// Root: sandbox ids `0..65536` are host ids `base..base+65536`.
    pub fn shifted(base: u32) -> Self {
        let e = vec![Extent {
            inside: 0,
            outside: base,
            count: RANGE,
        }];
        Self {
            uids: e.clone(),
            gids: e,
            use_helpers: false,
            deny_setgroups: false,
        }
    }

    /// Rootless: the invoking user is root inside and the user's subordinate ids are
    /// sandbox ids 1..65536 (so `belljar`, uid 1000, exists).
    pub fn rootless() -> Result<Self, Error> {
        Self::rootless_from(Path::new("/etc"), which("newuidmap") && which("newgidmap"))
    }

    /// [`Self::rootless`] with `etc` holding `subuid` and `subgid`, for tests.
    pub fn rootless_from(etc: &Path, helpers: bool) -> Result<Self, Error> {
        let (uid, gid) = (Uid::current().as_raw(), Gid::current().as_raw());
        let name = User::from_uid(Uid::current())
            .ok()
            .flatten()
            .map(|u| u.name);
        let sub_u = subid_range(&etc.join("subuid"), name.as_deref(), uid);
        let sub_g = subid_range(&etc.join("subgid"), name.as_deref(), uid);
        let (su, sg) = match (sub_u, sub_g) {
            (Some(su), Some(sg)) => (su, sg),
            (u, g) => {
                let missing = [(u.is_none(), "subuid"), (g.is_none(), "subgid")]
                    .into_iter()
                    .filter(|(m, _)| *m)
                    .map(|(_, f)| format!("{}", etc.join(f).display()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let user = name.unwrap_or_else(|| uid.to_string());
                return Err(Error::NoSubids {
                    fix: add_subids_command(etc, &user),
                    user,
                    missing: format!("no entry in {missing}"),
                });
            }
        };
        if !helpers {
            return Err(Error::NoUidmap);
        }
        let ext = |own, (start, count): (u32, u32)| {
            vec![
                Extent {
                    inside: 0,
                    outside: own,
                    count: 1,
                },
                Extent {
                    inside: 1,
                    outside: start,
                    count: count.min(RANGE - 1),
                },
            ]
        };
        Ok(Self {
            uids: ext(uid, su),
            gids: ext(gid, sg),
            use_helpers: true,
            deny_setgroups: false,
        })
    }

    /// The host uid that is root inside.
    pub fn root_uid(&self) -> u32 {
        self.uids
            .iter()
            .find(|e| e.inside == 0)
            .map_or(0, |e| e.outside)
    }

    /// The host gid that is root's group inside.
    pub fn root_gid(&self) -> u32 {
        self.gids
            .iter()
            .find(|e| e.inside == 0)
            .map_or(0, |e| e.outside)
    }

    /// Whether sandbox id `inside` exists (is mapped).
    pub fn maps_gid(&self, inside: u32) -> bool {
        self.gids
            .iter()
            .any(|e| inside >= e.inside && inside - e.inside < e.count)
    }

    /// The host uid of sandbox uid `inside`, if mapped.
    pub fn host_uid(&self, inside: u32) -> Option<u32> {
        let e = self
            .uids
            .iter()
            .find(|e| inside >= e.inside && inside - e.inside < e.count)?;
        Some(e.outside + (inside - e.inside))
    }

    /// Makes a user namespace with this mapping, held by the returned fd.
    pub fn create_namespace(&self) -> Result<OwnedFd, Error> {
        let (ready_r, ready_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Fork)?;
        let (done_r, done_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Fork)?;
        // SAFETY: the child only calls async-signal-safe functions (unshare, write, read,
        // _exit) on fds that exist before the fork, then exits without returning.
        let child = match unsafe { fork() }.map_err(Error::Fork)? {
            ForkResult::Child => {
                drop(ready_r);
                drop(done_w);
                // Other threads' launches may fork at the same time: this process must not
                // hold their pipes open while it waits, or they wait for each other.
                close_all_but([ready_w.as_raw_fd(), done_r.as_raw_fd()]);
                let ok = nix::sched::unshare(CloneFlags::CLONE_NEWUSER).is_ok();
                let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
                let mut b = [0u8; 1];
                let _ = nix::unistd::read(done_r.as_raw_fd(), &mut b);
                // SAFETY: _exit is always safe; it skips atexit handlers of the parent's copy.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => child,
        };
        drop(ready_w);
        drop(done_r);
        let mut ok = [0u8; 1];
        let unshared = fs::File::from(ready_r)
            .read(&mut ok)
            .map(|n| n == 1 && ok[0] == 1);
        let result = match unshared {
            Ok(true) => self.write_maps(child.as_raw() as u32).and_then(|()| {
                fs::File::open(format!("/proc/{}/ns/user", child.as_raw()))
                    .map(OwnedFd::from)
                    .map_err(Error::Open)
            }),
            _ => Err(Error::Unshare),
        };
        drop(done_w);
        // Not relying on EOF alone: a copy of `done_w` may live on in a process another
        // thread forked meanwhile.
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(child, None);
        result
    }

    fn write_maps(&self, pid: u32) -> Result<(), Error> {
        let lines = |ext: &[Extent]| {
            ext.iter()
                .map(|e| format!("{} {} {}\n", e.inside, e.outside, e.count))
                .collect::<String>()
        };
        if self.use_helpers {
            for (tool, ext) in [("newuidmap", &self.uids), ("newgidmap", &self.gids)] {
                let mut cmd = Command::new(tool);
                cmd.arg(pid.to_string());
                for e in ext {
                    cmd.args([e.inside, e.outside, e.count].map(|v| v.to_string()));
                }
                let out = cmd.output().map_err(|e| Error::Helper {
                    tool,
                    stderr: e.to_string(),
                })?;
                if !out.status.success() {
                    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                    return Err(Error::Helper { tool, stderr });
                }
            }
            return Ok(());
        }
        let write = |file: &str, text: &str| {
            fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/{pid}/{file}"))
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(|source| Error::Map {
                    what: file.to_owned(),
                    source,
                })
        };
        if self.deny_setgroups {
            write("setgroups", "deny")?;
        }
        write("uid_map", &lines(&self.uids))?;
        write("gid_map", &lines(&self.gids))
    }
}

/// Closes every fd from 3 up except `keep`, in a forked child (async-signal-safe).
pub(crate) fn close_all_but(mut keep: [i32; 2]) {
    keep.sort_unstable();
    let mut from: u32 = 3;
    for fd in keep {
        let fd = fd as u32;
        if fd > from {
            // SAFETY: close_range only closes descriptors of this process.
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = from.max(fd + 1);
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0) };
}

/// The `start:count` range of `/etc/subuid`-style `file` for a user, by name or uid.
pub fn subid_range(file: &Path, name: Option<&str>, uid: u32) -> Option<(u32, u32)> {
    let text = fs::read_to_string(file).ok()?;
    parse_subid(&text, name, uid)
}

/// The `start:count` entry of `/etc/subuid`-style text for a user, by name or uid.
pub fn parse_subid(text: &str, name: Option<&str>, uid: u32) -> Option<(u32, u32)> {
    text.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        let (who, start, count) = (f.next()?, f.next()?, f.next()?);
        let me = Some(who) == name || who.parse() == Ok(uid);
        let (start, count) = (start.parse().ok()?, count.parse().ok()?);
        (me && count > 0).then_some((start, count))
    })
}

/// The first id past every range of the `/etc/subuid`- and `/etc/subgid`-style files in `etc`
/// (100000 when they are empty or missing): where a new user's 65536 ids overlap no one's.
pub fn next_free_subid(etc: &Path) -> u64 {
    ["subuid", "subgid"]
        .iter()
        .filter_map(|f| fs::read_to_string(etc.join(f)).ok())
        .map(|text| {
            text.lines()
                .filter_map(|l| {
                    let mut f = l.trim().split(':').skip(1);
                    let start: u64 = f.next()?.parse().ok()?;
                    let count: u64 = f.next()?.parse().ok()?;
                    Some(start + count)
                })
                .max()
                .unwrap_or(0)
        })
        .fold(100_000, u64::max)
}

/// `usermod`'s arguments that give `user` 65536 subordinate uids and gids from `start`.
pub fn add_subids_args(start: u64, user: &str) -> String {
    let end = start + 65535;
    format!("--add-subuids {start}-{end} --add-subgids {start}-{end} {user}")
}

/// The command that gives `user` 65536 subordinate uids and gids of its own, after every
/// range already given (a fixed range such as 100000-165535 may be another user's).
pub fn add_subids_command(etc: &Path, user: &str) -> String {
    format!(
        "sudo usermod {}",
        add_subids_args(next_free_subid(etc), user)
    )
}

/// Whether `tool` is an executable file in a `PATH` directory (`newuidmap`, `newgidmap`).
pub fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_users_ids_go_after_everyone_elses() {
        let etc = tempfile::tempdir().unwrap();
        assert_eq!(next_free_subid(etc.path()), 100_000);
        fs::write(etc.path().join("subuid"), "a:100000:65536\nb:300000:1000\n").unwrap();
        fs::write(
            etc.path().join("subgid"),
            "a:100000:65536\nc:400000:65536\nbad line\n",
        )
        .unwrap();
        assert_eq!(next_free_subid(etc.path()), 465_536);
        assert_eq!(
            add_subids_command(etc.path(), "d"),
            "sudo usermod --add-subuids 465536-531071 --add-subgids 465536-531071 d"
        );
    }

    #[test]
    fn subid_by_name_or_uid() {
        let text = "alice:100000:65536\n1001:200000:1000\n";
        assert_eq!(
            parse_subid(text, Some("alice"), 1000),
            Some((100000, 65536))
        );
        assert_eq!(parse_subid(text, Some("bob"), 1001), Some((200000, 1000)));
        assert_eq!(parse_subid(text, Some("carol"), 1002), None);
    }

    #[test]
    fn rootless_without_subids_names_the_fix() {
        let etc = tempfile::tempdir().unwrap();
        let err = IdMap::rootless_from(etc.path(), true).unwrap_err();
        assert_eq!(err.code(), "subids_missing");
        let text = err.to_string();
        assert!(
            text.contains("sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535"),
            "{text}"
        );
        assert!(text.contains("subuid, "), "{text}");
        let me = Uid::current().as_raw();
        fs::write(etc.path().join("subuid"), format!("{me}:100000:65536\n")).unwrap();
        fs::write(etc.path().join("subgid"), format!("{me}:200000:65536\n")).unwrap();
        let err = IdMap::rootless_from(etc.path(), false).unwrap_err();
        assert_eq!(err.code(), "uidmap_missing");
        assert!(err.to_string().contains("apt-get install uidmap"));
        let map = IdMap::rootless_from(etc.path(), true).unwrap();
        assert_eq!(map.root_uid(), me);
        assert_eq!(map.host_uid(1000), Some(100_999));
        assert_eq!(map.gids[1].outside, 200_000);
        assert!(map.use_helpers && !map.deny_setgroups);
    }

    #[test]
    fn shifted_map_lookups() {
        let m = IdMap::shifted(1_000_000_000);
        assert_eq!(m.root_uid(), 1_000_000_000);
        assert_eq!(m.host_uid(1000), Some(1_000_001_000));
        assert_eq!(m.host_uid(65536), None);
        assert!(m.maps_gid(5));
    }

    #[test]
    fn namespace_is_created_with_the_map() {
        if !Uid::effective().is_root() {
            assert!(std::env::var("CI").is_err(), "CI runs as root");
            eprintln!("not root: skipped");
            return;
        }
        let m = IdMap::shifted(1_500_000_000);
        let fd = m.create_namespace().unwrap();
        // The fd names a user namespace different from ours.
        let ours = fs::metadata("/proc/self/ns/user").unwrap();
        let theirs = fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_ne!(ours.ino(), theirs.ino());
    }
}
