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

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
    #[error("Cannot remove cgroup {}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("The sandbox has no freezer cgroup")]
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

/// Resource use of a sandbox, from its cgroups; `None` when no group measures it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    /// CPU time used, microseconds.
    pub cpu_usec: Option<u64>,
    pub pids: Option<u64>,
    /// Processes killed by the OOM killer inside the sandbox's memory cgroup.
    pub oom_kills: Option<u64>,
    /// Forks refused because the sandbox was at its PID limit (`pids.events` `max`).
    #[serde(default)]
    pub pids_denied: Option<u64>,
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
const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

const CPU_PERIOD_US: u64 = 100_000;

/// The cgroup hierarchies this process sees, and its own group in each.
#[derive(Debug, Default, Clone)]
pub struct Hierarchies {
    /// The daemon's own v2 group directory and the controllers it offers.
    pub v2: Option<(PathBuf, Vec<String>)>,
    /// v1 controller → (the daemon's own group directory, the hierarchy's root directory).
    pub v1: BTreeMap<String, (PathBuf, PathBuf)>,
}

impl Hierarchies {
    /// Reads `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub fn discover() -> Self {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Self::parse(&mountinfo, &own, |p| fs::read_to_string(p).ok())
    }

    fn parse(mountinfo: &str, own: &str, read: impl Fn(&Path) -> Option<String>) -> Self {
        let mut out = Self::default();
        // own group per hierarchy: v2 under "", v1 under each controller name.
        let mut own_paths: BTreeMap<String, String> = BTreeMap::new();
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if ctrls.is_empty() {
                own_paths.insert(String::new(), path.to_owned());
            } else {
                for c in ctrls.split(',') {
                    own_paths.insert(c.to_owned(), path.to_owned());
                }
            }
        }
        for line in mountinfo.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            if fields.len() < dash + 4 || dash < 5 {
                continue;
            }
            let (root, mountpoint) = (fields[3], unescape(fields[4]));
            let (fstype, superopts) = (fields[dash + 1], fields[dash + 3]);
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
                for opt in superopts.split(',') {
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

/// `\040` and friends in mountinfo paths.
fn unescape(s: &str) -> String {
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
fn make_group(base: &Path, root: &Path, id: &str) -> Result<PathBuf, String> {
    let mut last = String::new();
    for parent in [base, root] {
        let dir = parent.join("belljar").join(id);
        match fs::create_dir_all(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = format!("cannot create {}: {e}", dir.display()),
        }
        if base == root {
            break;
        }
    }
    Err(last)
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
                Err(reason) => {
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
                Err(reason) => {
                    v2_reasons.entry(c.clone()).or_insert(reason);
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

    /// The `cgroup.procs` files a process writes `0` into to join the sandbox's groups.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.v2
            .iter()
            .chain(self.v1.values())
            .map(|d| d.join("cgroup.procs"))
            .collect()
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

    /// What the sandbox uses now.
    pub fn usage(&self) -> Usage {
        let v2 = self.v2.as_deref();
        let v1 = |c: &str| self.v1.get(c).map(PathBuf::as_path);
        let pick = |v2file: &str, c: &str, v1file: &str| {
            v2.and_then(|d| read_u64(&d.join(v2file)))
                .or_else(|| v1(c).and_then(|d| read_u64(&d.join(v1file))))
        };
        Usage {
            memory_bytes: pick("memory.current", "memory", "memory.usage_in_bytes"),
            memory_peak_bytes: pick("memory.peak", "memory", "memory.max_usage_in_bytes"),
            cpu_usec: v2
                .and_then(|d| keyed(&d.join("cpu.stat"), "usage_usec"))
                .or_else(|| v1("cpuacct").and_then(|d| read_u64(&d.join("cpuacct.usage"))))
                .map(|v| if v2.is_some() { v } else { v / 1000 }),
            pids: pick("pids.current", "pids", "pids.current"),
            oom_kills: v2
                .and_then(|d| keyed(&d.join("memory.events"), "oom_kill"))
                .or_else(|| {
                    v1("memory").and_then(|d| keyed(&d.join("memory.oom_control"), "oom_kill"))
                }),
            pids_denied: v2
                .and_then(|d| keyed(&d.join("pids.events"), "max"))
                .or_else(|| v1("pids").and_then(|d| keyed(&d.join("pids.events"), "max"))),
        }
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
        assert_eq!(groups.procs_files(), [dir.join("cgroup.procs")]);
        assert!(groups.v1.is_empty());
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

    #[test]
    fn unescapes_mountinfo() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
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
