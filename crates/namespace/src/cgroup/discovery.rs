//! Discovery: which cgroup hierarchies this process sees (`/proc/self/mountinfo`, read with
//! `procfs-core`) and its own group in each (`/proc/self/cgroup`), so that sandboxes' groups
//! nest under the daemon's own. Creating groups and writing limits is `super`'s job.
//!
//! Without root, only a delegated cgroup v2 subtree is writable. Delegation is ownership: the
//! delegating party (systemd for `user@UID.service` and for a `Delegate=yes` scope, or an
//! administrator) chowns the group's directory, `cgroup.procs` and `cgroup.subtree_control` to
//! the user. A rootless daemon therefore uses, as the base of its sandboxes' groups, its own
//! group when that is delegated and holds no other process (`systemd-run --user --scope -p
//! Delegate=yes belljard`), else the topmost delegated ancestor of its own group (the
//! subtree an administrator or the user's systemd manager delegated, whose processes sit in
//! child groups such as `init.scope` or a session's scope, never in it directly).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use procfs_core::FromBufRead;
use procfs_core::ProcessCGroups;
use procfs_core::process::MountInfo;

use super::{DAEMON_LEAF, V1_CONTROLLERS};

/// The cgroup hierarchies this process sees, and its own group in each.
#[derive(Debug, Default, Clone)]
pub struct Hierarchies {
    /// The daemon's own v2 group directory and the controllers it offers.
    pub v2: Option<(PathBuf, Vec<String>)>,
    /// v1 controller → (the daemon's own group directory, the hierarchy's root directory).
    pub v1: BTreeMap<String, (PathBuf, PathBuf)>,
}

impl Hierarchies {
    /// Reads `/proc/self/mountinfo` and `/proc/self/cgroup`; without root, the v2 base is
    /// the delegated group (see the module's comment), when there is one.
    pub fn discover() -> Self {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut h = Self::parse(&mountinfo, &own, |p| fs::read_to_string(p).ok());
        let uid = nix::unistd::Uid::effective().as_raw();
        if uid != 0
            && let Some((dir, ctrls)) = &mut h.v2
            && let Some(base) = delegated_base(dir, uid, std::process::id())
            && base != *dir
        {
            let offered = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
            *ctrls = offered.split_whitespace().map(str::to_owned).collect();
            *dir = base;
        }
        h
    }

    /// [`Self::discover`] from given file contents: `read` stands for reading a cgroup file,
    /// so that tests and `belljar doctor`'s fixtures need no real hierarchy.
    pub fn parse(mountinfo: &str, own: &str, read: impl Fn(&Path) -> Option<String>) -> Self {
        let mut out = Self::default();
        // own group per hierarchy: v2 under "", v1 under each controller name.
        let mut own_paths: BTreeMap<String, String> = BTreeMap::new();
        let own = ProcessCGroups::from_buf_read(own.as_bytes()).unwrap_or(ProcessCGroups(vec![]));
        for group in own {
            if group.controllers.is_empty() {
                own_paths.insert(String::new(), group.pathname);
            } else {
                for c in group.controllers {
                    own_paths.insert(c, group.pathname.clone());
                }
            }
        }
        // A line the parser cannot read (a kernel newer than it) is skipped, not fatal.
        for mount in mountinfo
            .lines()
            .filter_map(|l| MountInfo::from_line(l).ok())
        {
            let (root, mountpoint) = (mount.root.as_str(), unescape(&mount.mount_point));
            let fstype = mount.fs_type.as_str();
            let within = |own: &str| -> Option<PathBuf> {
                let rel = own.strip_prefix(root)?;
                let rel = rel.trim_start_matches('/');
                Some(if rel.is_empty() {
                    PathBuf::from(&mountpoint)
                } else {
                    Path::new(&mountpoint).join(rel)
                })
            };
            if fstype == "cgroup2" && out.v2.is_none() {
                let Some(mut dir) = own_paths.get("").and_then(|p| within(p)) else {
                    continue;
                };
                // The daemon moved itself into a leaf of its delegated group earlier.
                if dir.file_name().is_some_and(|n| n == DAEMON_LEAF) {
                    dir.pop();
                }
                let ctrls = read(&dir.join("cgroup.controllers")).unwrap_or_default();
                let ctrls = ctrls.split_whitespace().map(str::to_owned).collect();
                out.v2 = Some((dir, ctrls));
            } else if fstype == "cgroup" {
                for opt in mount.super_options.keys().map(String::as_str) {
                    if !V1_CONTROLLERS.contains(&opt) || out.v1.contains_key(opt) {
                        continue;
                    }
                    if let Some(dir) = own_paths.get(opt).and_then(|p| within(p)) {
                        out.v1
                            .insert(opt.to_owned(), (dir, PathBuf::from(&mountpoint)));
                    }
                }
            }
        }
        out
    }

    /// Which cgroup version enforces limits here, for [`crate::probe()`].
    pub fn mode(&self) -> crate::CgroupMode {
        match &self.v2 {
            Some((_, c)) if c.iter().any(|c| c == "memory" || c == "pids") => crate::CgroupMode::V2,
            _ if self.v1.contains_key("memory") || self.v1.contains_key("pids") => {
                crate::CgroupMode::V1
            }
            _ => crate::CgroupMode::None,
        }
    }
}

/// The directory of `pid`'s group in the hierarchy that enforces `controller`: its v1
/// hierarchy when one is mounted, else the unified (v2) one. For watching a sandbox's group
/// from outside (e.g. its `pids.events`), with the same parsing the daemon uses for its own.
pub fn group_of(pid: u32, controller: &str) -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let groups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let h = Hierarchies::parse(&mountinfo, &groups, |_| None);
    h.v1.get(controller)
        .map(|(dir, _)| dir.clone())
        .or_else(|| h.v2.map(|(dir, _)| dir))
}

/// Whether `uid` owns the files that make `dir` a delegated group.
fn delegated_to(dir: &Path, uid: u32) -> bool {
    ["cgroup.procs", "cgroup.subtree_control"]
        .iter()
        .all(|f| fs::metadata(dir.join(f)).is_ok_and(|m| m.uid() == uid))
}

/// The group a rootless daemon in `own` makes its sandboxes' groups under: `own` when it is
/// delegated to `uid` and holds no process but `pid`, else the topmost delegated ancestor of
/// `own` (searched up to the hierarchy's root, the last directory with a `cgroup.procs`).
pub fn delegated_base(own: &Path, uid: u32, pid: u32) -> Option<PathBuf> {
    let procs = fs::read_to_string(own.join("cgroup.procs")).unwrap_or_default();
    let alone = procs.split_whitespace().all(|p| p == pid.to_string());
    if delegated_to(own, uid) && alone {
        return Some(own.to_owned());
    }
    let mut topmost = None;
    let mut dir = Some(own);
    while let Some(d) = dir.filter(|d| d.join("cgroup.procs").exists()) {
        if delegated_to(d, uid) {
            topmost = Some(d.to_owned());
        }
        dir = d.parent();
    }
    topmost
}

/// `\040` and friends in mountinfo paths (the parser leaves them escaped).
fn unescape(path: &Path) -> String {
    let s = path.to_string_lossy();
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = (bytes[i] == b'\\' && i + 4 <= bytes.len())
            .then(|| u8::from_str_radix(s.get(i + 1..i + 4).unwrap_or(""), 8).ok())
            .flatten();
        if let Some(v) = octal {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO_V1: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:34 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const OWN_V1: &str = "8:pids:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";

    #[test]
    fn finds_v1_groups_nested_under_own() {
        let h = Hierarchies::parse(MOUNTINFO_V1, OWN_V1, |_| Some(String::new()));
        assert_eq!(
            h.v1["memory"].0,
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(h.v1["pids"].0, PathBuf::from("/sys/fs/cgroup/pids"));
        assert_eq!(
            h.v2,
            Some((PathBuf::from("/sys/fs/cgroup/unified"), vec![]))
        );
        assert_eq!(h.mode(), crate::CgroupMode::V1);
    }

    #[test]
    fn finds_v2_with_delegated_controllers() {
        let mi = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = "0::/user.slice/user-1000.slice/user@1000.service/app.slice\n";
        let h = Hierarchies::parse(mi, own, |p| {
            assert!(p.ends_with("app.slice/cgroup.controllers"));
            Some("cpu memory pids\n".into())
        });
        let (dir, ctrls) = h.v2.clone().unwrap();
        assert_eq!(
            dir,
            PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice")
        );
        assert_eq!(ctrls, ["cpu", "memory", "pids"]);
        assert_eq!(h.mode(), crate::CgroupMode::V2);
    }

    #[test]
    fn daemon_leaf_is_not_the_base() {
        let mi = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let own = "0::/system.slice/belljard.service/belljar-daemon\n";
        let h = Hierarchies::parse(mi, own, |_| Some("memory pids".into()));
        let base = PathBuf::from("/sys/fs/cgroup/system.slice/belljard.service");
        assert_eq!(h.v2.unwrap().0, base);
    }

    #[test]
    fn mount_root_is_stripped() {
        // Inside a container the hierarchy's root is the container's own group.
        let mi = "34 30 0:30 /docker/x /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let h = Hierarchies::parse(mi, "4:memory:/docker/x/sub\n", |_| None);
        assert_eq!(h.v1["memory"].0, PathBuf::from("/sys/fs/cgroup/memory/sub"));
    }

    /// A tree shaped like systemd's: `user@UID.service` delegated to the user, a session's
    /// scope in it (the user's, holding the shell), and the daemon's own `Delegate=yes` scope.
    #[test]
    fn rootless_base_is_the_delegated_group() {
        let tmp = tempfile::tempdir().unwrap();
        let me = nix::unistd::Uid::effective().as_raw();
        let root = tmp.path().join("cgroup");
        let service = root.join("user.slice/user@4242.service");
        let session = service.join("session.scope");
        let scope = service.join("app.slice/belljard.scope");
        for d in [&root, &root.join("user.slice"), &service, &session, &scope] {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("cgroup.procs"), "").unwrap();
            fs::write(d.join("cgroup.subtree_control"), "").unwrap();
        }
        fs::write(session.join("cgroup.procs"), "100\n4242\n").unwrap();
        fs::write(scope.join("cgroup.procs"), "4242\n").unwrap();
        if me == 0 {
            // Files here are root's: make everything above the service someone else's.
            for d in [&root, &root.join("user.slice")] {
                for f in ["cgroup.procs", "cgroup.subtree_control"] {
                    std::os::unix::fs::chown(d.join(f), Some(1), Some(1)).unwrap();
                }
            }
        }
        // Its own scope, alone in it: that scope.
        assert_eq!(delegated_base(&scope, me, 4242), Some(scope.clone()));
        // A scope shared with the shell: the topmost delegated group, the user's service.
        let got = delegated_base(&session, me, 4242);
        if me == 0 {
            assert_eq!(got, Some(service.clone()));
        } else {
            // Everything in a temporary directory is ours: the topmost is the tree's root.
            assert_eq!(got, Some(root.clone()));
        }
        // Nothing delegated to this uid.
        assert_eq!(delegated_base(&session, 77_777, 4242), None);
    }

    #[test]
    fn unescapes_mountinfo() {
        assert_eq!(unescape(Path::new("/a\\040b")), "/a b");
        assert_eq!(unescape(Path::new("/plain")), "/plain");
    }
}
