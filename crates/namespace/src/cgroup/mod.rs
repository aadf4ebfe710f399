//! Memory, CPU and PID limits for sandboxes through cgroups, v2 or v1.
//!
//! Users mostly have cgroup v2; our build machines have v1 (memory, pids, cpu, cpuacct,
//! freezer) with an empty v2 mount. For each controller the sandbox goes to v2 when the
//! daemon's own v2 group offers that controller (a delegated subtree), else to the v1
//! hierarchy of that controller. Groups are always `belljar/<id>` nested under the daemon's
//! own group of that hierarchy (or under the hierarchy's root when the daemon's group is not
//! writable); nothing else is ever created, changed or removed, except enabling controllers
//! in the `cgroup.subtree_control` of the daemon's own v2 group, which delegation requires.
//!
//! Nothing here fails a launch: a limit that cannot be enforced is reported with the reason.

mod discovery;
pub(crate) mod join;
mod usage;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use discovery::{Hierarchies, group_of};
pub use usage::Usage;

/// Errors from managing a sandbox's cgroups after it started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Cgroup {} still has processes", path.display())]
    Busy { path: PathBuf },
    #[error("Cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Cannot create {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Cannot remove cgroup {}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Pause, fork and live snapshots freeze the sandbox's group.
    #[error(
        "The sandbox has no freezer cgroup: without root, freezing needs cgroup v2 with a group \
         delegated to you (belljar doctor says how)"
    )]
    NoFreezer,
}

/// Whether one limit is in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum LimitStatus {
    /// The spec asked for no limit.
    #[default]
    NotRequested,
    /// Enforced; `how` names the cgroup file, e.g. `cgroup v1 memory.limit_in_bytes`.
    Enforced { how: String },
    /// Asked for but not enforced, and why.
    NotEnforced { reason: String },
}

impl LimitStatus {
    pub fn is_enforced(&self) -> bool {
        matches!(self, Self::Enforced { .. })
    }
}

/// Per limit: enforced or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsReport {
    pub memory: LimitStatus,
    pub cpu: LimitStatus,
    pub pids: LimitStatus,
    /// Not a cgroup limit: the size of the sandbox's own filesystem (see `disk`).
    #[serde(default)]
    pub disk: LimitStatus,
}

/// The groups made for one sandbox; saved in its state file so that `stop` after a daemon
/// restart removes exactly these.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Groups {
    /// The v2 group, if one was made.
    pub v2: Option<PathBuf>,
    /// v1 controller name → group directory.
    pub v1: BTreeMap<String, PathBuf>,
}

/// v1 controllers a sandbox joins: the three limits, CPU accounting and the freezer.
pub(crate) const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

const CPU_PERIOD_US: u64 = 100_000;

/// The leaf of its delegated v2 group that the daemon moves itself into, because a v2 group
/// that holds processes cannot pass controllers to its children.
pub const DAEMON_LEAF: &str = "belljar-daemon";

/// Enables a controller for the children of the daemon's own v2 group `base`. When `base`
/// holds the daemon itself (the usual `Delegate=yes` service or user scope), the daemon first
/// moves into `base/belljar-daemon`; other processes in `base` make this fail, and the reason
/// is reported.
fn enable_in_delegated(base: &Path, enable: &str) -> Result<(), Error> {
    let control = base.join("cgroup.subtree_control");
    match write(&control, enable) {
        Err(Error::Write { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
            let leaf = base.join(DAEMON_LEAF);
            fs::create_dir_all(&leaf).map_err(|source| Error::Write {
                path: leaf.clone(),
                source,
            })?;
            write(&leaf.join("cgroup.procs"), "0")?;
            write(&control, enable)
        }
        other => other,
    }
}

/// Makes `belljar/<id>` under `base` (or under `root` when `base` is not writable).
/// The error is the last place's.
fn make_group(base: &Path, root: &Path, id: &str) -> Result<PathBuf, Error> {
    let make = |parent: &Path| {
        let dir = parent.join("belljar").join(id);
        match fs::create_dir_all(&dir) {
            Ok(()) => Ok(dir),
            Err(source) => Err(Error::Create { path: dir, source }),
        }
    };
    make(base).or_else(|e| if base == root { Err(e) } else { make(root) })
}

/// Why a v1 group could not be made. Without root that is the rule, not an accident: v1
/// hierarchies are root's, and a user's limits need delegated cgroup v2.
fn v1_reason(reason: String, root: bool) -> String {
    if root {
        return reason;
    }
    format!(
        "{reason}: cgroup v1 groups are root's; without root, limits need cgroup v2 with the \
         controllers delegated to you (belljar doctor says how)"
    )
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    fs::write(path, value).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl Groups {
    /// A `belljar/<id>` group that already holds processes: another sandbox has this id.
    pub fn in_use(id: &str, h: &Hierarchies) -> Option<PathBuf> {
        let parents = h.v2.iter().map(|(base, _)| base.clone());
        let parents = parents.chain(
            h.v1.values()
                .flat_map(|(base, root)| [base.clone(), root.clone()]),
        );
        parents.map(|p| p.join("belljar").join(id)).find(|dir| {
            fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|t| !t.trim().is_empty())
        })
    }

    /// Makes the sandbox's groups and writes its limits. Failures become `NotEnforced`.
    pub fn create(id: &str, limits: &crate::Limits, h: &Hierarchies) -> (Self, LimitsReport) {
        let mut groups = Groups::default();
        let want = |c: &str| match c {
            "memory" => limits.memory_bytes.is_some(),
            "pids" => limits.pids.is_some(),
            "cpu" => limits.cpu.is_some(),
            _ => false,
        };
        let mut v2_reasons: BTreeMap<String, String> = BTreeMap::new();
        let mut v2_ctrls: Vec<&str> = Vec::new();
        if let Some((base, offered)) = &h.v2 {
            let needed: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| want(c) && offered.iter().any(|o| o == c))
                .collect();
            match make_group(base, base, id) {
                Ok(dir) => {
                    // Delegation: the daemon's group and belljar/ must pass the controllers on.
                    for c in &needed {
                        let enable = format!("+{c}");
                        let parent = dir.parent().unwrap_or(base);
                        let r = enable_in_delegated(base, &enable)
                            .and_then(|()| write(&parent.join("cgroup.subtree_control"), &enable));
                        match r {
                            Ok(()) => v2_ctrls.push(c),
                            Err(e) => {
                                v2_reasons
                                    .insert(c.to_string(), format!("{e}: {}", source_text(&e)));
                            }
                        }
                    }
                    groups.v2 = Some(dir);
                }
                Err(e) => {
                    let reason = crate::error_chain(&e);
                    for c in needed {
                        v2_reasons.insert(c.to_owned(), reason.clone());
                    }
                }
            }
        }
        for (c, (base, root)) in &h.v1 {
            if v2_ctrls.contains(&c.as_str()) {
                continue;
            }
            // Only join v1 groups that do something: a limit, accounting or freezing.
            let useful = want(c) || c == "cpuacct" || (c == "freezer" && groups.v2.is_none());
            if !useful {
                continue;
            }
            match make_group(base, root, id) {
                Ok(dir) => {
                    groups.v1.insert(c.clone(), dir);
                }
                Err(e) => {
                    let root = nix::unistd::Uid::effective().is_root();
                    v2_reasons
                        .entry(c.clone())
                        .or_insert_with(|| v1_reason(crate::error_chain(&e), root));
                }
            }
        }
        let mut report = LimitsReport {
            memory: LimitStatus::NotRequested,
            cpu: LimitStatus::NotRequested,
            pids: LimitStatus::NotRequested,
            disk: LimitStatus::NotRequested,
        };
        if let Some(bytes) = limits.memory_bytes {
            report.memory = groups.set_memory(bytes, &v2_ctrls, &v2_reasons);
        }
        if let Some(pids) = limits.pids {
            report.pids = groups.set_pids(pids, &v2_ctrls, &v2_reasons);
        }
        if let Some(cpu) = limits.cpu {
            report.cpu = groups.set_cpu(cpu, &v2_ctrls, &v2_reasons);
        }
        (groups, report)
    }

    fn unavailable(c: &str, reasons: &BTreeMap<String, String>) -> LimitStatus {
        let reason = reasons.get(c).cloned().unwrap_or_else(|| {
            format!(
                "no cgroup v2 group with the {c} controller delegated to the daemon and no \
                 cgroup v1 {c} hierarchy"
            )
        });
        LimitStatus::NotEnforced { reason }
    }

    fn set_memory(&self, bytes: u64, v2: &[&str], why: &BTreeMap<String, String>) -> LimitStatus {
        let result = if let (Some(dir), true) = (&self.v2, v2.contains(&"memory")) {
            write(&dir.join("memory.max"), &bytes.to_string()).map(|()| {
                // No swap, so the limit is the limit; absent when swap accounting is off.
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                "cgroup v2 memory.max".to_owned()
            })
        } else if let Some(dir) = self.v1.get("memory") {
            write(&dir.join("memory.limit_in_bytes"), &bytes.to_string()).map(|()| {
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    let _ = fs::write(memsw, bytes.to_string());
                }
                let _ = fs::write(dir.join("memory.swappiness"), "0");
                "cgroup v1 memory.limit_in_bytes".to_owned()
            })
        } else {
            return Self::unavailable("memory", why);
        };
        status(result)
    }

    fn set_pids(&self, pids: u64, v2: &[&str], why: &BTreeMap<String, String>) -> LimitStatus {
        let (dir, how) = if let (Some(dir), true) = (&self.v2, v2.contains(&"pids")) {
            (dir, "cgroup v2 pids.max")
        } else if let Some(dir) = self.v1.get("pids") {
            (dir, "cgroup v1 pids.max")
        } else {
            return Self::unavailable("pids", why);
        };
        status(write(&dir.join("pids.max"), &pids.to_string()).map(|()| how.to_owned()))
    }

    fn set_cpu(&self, cpus: f64, v2: &[&str], why: &BTreeMap<String, String>) -> LimitStatus {
        if !(cpus.is_finite() && cpus > 0.0) {
            return LimitStatus::NotEnforced {
                reason: format!("invalid CPU count {cpus}"),
            };
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "float to int saturates, which is what is wanted"
        )]
        let quota = ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000);
        let result = if let (Some(dir), true) = (&self.v2, v2.contains(&"cpu")) {
            write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))
                .map(|()| "cgroup v2 cpu.max".to_owned())
        } else if let Some(dir) = self.v1.get("cpu") {
            write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())
                .and_then(|()| write(&dir.join("cpu.cfs_quota_us"), &quota.to_string()))
                .map(|()| "cgroup v1 cpu.cfs_quota_us".to_owned())
        } else {
            return Self::unavailable("cpu", why);
        };
        status(result)
    }

    /// The v1 `tasks` files a single-threaded process writes `0` into to join the sandbox's
    /// v1 groups. Moving one thread that names itself is the one migration the kernel makes
    /// without write-locking the global `cgroup_threadgroup_rwsem`, whose first writer after
    /// a quiet spell waits for an RCU grace period (~15 ms per launch here, measured with
    /// `cgroup.procs`). The starter that writes them has one thread (a fork of the daemon's
    /// launching thread), so its thread is all of it, and its children are born in the
    /// groups. The v2 group is joined by `clone3(CLONE_INTO_CGROUP)` instead (see `child`).
    pub fn v1_task_files(&self) -> Vec<PathBuf> {
        self.v1.values().map(|d| d.join("tasks")).collect()
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.v2.iter().chain(self.v1.values())
    }

    /// Waits (up to `timeout`) for the groups to empty, then removes them.
    pub fn remove(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        for dir in self.dirs() {
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        if Instant::now() >= deadline {
                            return Err(Error::Busy { path: dir.clone() });
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(source) => {
                        return Err(Error::Remove {
                            path: dir.clone(),
                            source,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Freezes (`true`) or thaws every process of the sandbox.
    pub fn set_frozen(&self, frozen: bool) -> Result<(), Error> {
        if let Some(dir) = &self.v2 {
            return write(&dir.join("cgroup.freeze"), if frozen { "1" } else { "0" });
        }
        let dir = self.v1.get("freezer").ok_or(Error::NoFreezer)?;
        write(
            &dir.join("freezer.state"),
            if frozen { "FROZEN" } else { "THAWED" },
        )
    }

    /// Whether every process is frozen: a write to the freezer only starts freezing (each
    /// task stops when it next leaves the kernel), so this is what says it has finished.
    pub fn is_frozen(&self) -> Result<bool, Error> {
        if let Some(dir) = &self.v2 {
            return Ok(keyed(&dir.join("cgroup.events"), "frozen") == Some(1));
        }
        let dir = self.v1.get("freezer").ok_or(Error::NoFreezer)?;
        Ok(fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN"))
    }
}

fn status(result: Result<String, Error>) -> LimitStatus {
    match result {
        Ok(how) => LimitStatus::Enforced { how },
        Err(e) => LimitStatus::NotEnforced {
            reason: format!("{e}: {}", source_text(&e)),
        },
    }
}

fn source_text(e: &Error) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's v2 hierarchy has no controllers, so the v2 writes are checked against
    /// a plain directory: which files get which values (the kernel's side is not exercised).
    #[test]
    fn v2_limits_are_written_where_the_kernel_reads_them() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().to_path_buf();
        let ctrls = vec!["cpu".to_owned(), "memory".to_owned(), "pids".to_owned()];
        let h = Hierarchies {
            v2: Some((base.clone(), ctrls)),
            v1: BTreeMap::new(),
        };
        let limits = crate::Limits {
            memory_bytes: Some(256 << 20),
            cpu: Some(1.5),
            pids: Some(100),
            disk_bytes: None,
        };
        let (groups, report) = Groups::create("sb-1", &limits, &h);
        let dir = base.join("belljar/sb-1");
        assert_eq!(groups.v2.as_deref(), Some(dir.as_path()));
        let read = |p: PathBuf| fs::read_to_string(p).unwrap();
        assert_eq!(read(dir.join("memory.max")), "268435456");
        assert_eq!(read(dir.join("memory.swap.max")), "0");
        assert_eq!(read(dir.join("pids.max")), "100");
        assert_eq!(read(dir.join("cpu.max")), "150000 100000");
        // Each write replaces the file here; the kernel accumulates `+controller` writes.
        assert_eq!(read(base.join("cgroup.subtree_control")), "+cpu");
        assert_eq!(read(base.join("belljar/cgroup.subtree_control")), "+cpu");
        let how = |s: &LimitStatus| match s {
            LimitStatus::Enforced { how } => how.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(how(&report.memory), "cgroup v2 memory.max");
        assert_eq!(how(&report.cpu), "cgroup v2 cpu.max");
        assert_eq!(how(&report.pids), "cgroup v2 pids.max");
        assert!(groups.v1_task_files().is_empty());
        assert!(groups.v1.is_empty());
    }

    #[test]
    fn a_v1_group_refused_without_root_says_what_would_work() {
        let refused = "cannot create /sys/fs/cgroup/memory/belljar/x: Permission denied".to_owned();
        assert_eq!(v1_reason(refused.clone(), true), refused);
        let rootless = v1_reason(refused.clone(), false);
        assert!(rootless.starts_with(&refused), "{rootless}");
        assert!(
            rootless.contains("cgroup v2 with the controllers delegated"),
            "{rootless}"
        );
    }

    #[test]
    fn nothing_requested_is_reported_so() {
        let h = Hierarchies::default();
        let (groups, report) = Groups::create("x", &crate::Limits::default(), &h);
        assert_eq!(groups, Groups::default());
        assert_eq!(report.memory, LimitStatus::NotRequested);
        let limits = crate::Limits {
            memory_bytes: Some(1 << 20),
            ..Default::default()
        };
        let (_, report) = Groups::create("x", &limits, &h);
        assert!(matches!(report.memory, LimitStatus::NotEnforced { .. }));
    }
}
