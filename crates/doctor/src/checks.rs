//! The judgement of `belljar doctor`: each check turns facts about the host into a
//! [`Finding`]. The facts are gathered under a root directory (`/` for real), so the tests
//! classify fixture files under a temporary directory instead of this machine.

use std::path::Path;

use belljar_namespace::CgroupMode;
use belljar_namespace::cgroup::Hierarchies;
use belljar_vmm_api::host::{HostFacts, host_verdict};
use serde_json::json;

use super::{Finding, Status};

/// Controllers sandbox limits and pause need.
const WANTED_V2: [&str; 3] = ["cpu", "memory", "pids"];
const WANTED_V1: [&str; 4] = ["cpu", "freezer", "memory", "pids"];

/// The drop-in that makes systemd delegate the controllers to every user's manager.
const DELEGATE_FIX: &str = "sudo mkdir -p /etc/systemd/system/user@.service.d && printf '[Service]\\nDelegate=cpu cpuset io memory pids\\n' | sudo tee /etc/systemd/system/user@.service.d/delegate.conf && sudo systemctl daemon-reload";

/// Less than this free for images is a problem; less than [`DISK_WARN`] a warning.
pub const DISK_PROBLEM: u64 = 2 << 30;
pub const DISK_WARN: u64 = 10 << 30;

fn finding(
    check: &'static str,
    status: Status,
    found: impl Into<String>,
    fix: Option<&str>,
    facts: serde_json::Value,
) -> Finding {
    Finding {
        check: check.to_owned(),
        status,
        found: found.into(),
        fix: fix.map(str::to_owned),
        facts,
    }
}

/// KVM: microVMs need it openable and hardware-backed; without it sandboxes fall back to
/// namespaces, so anything short of that is a warning.
pub fn kvm(facts: &HostFacts) -> Finding {
    let has = |flag: &str| facts.cpu_flags.split_whitespace().any(|f| f == flag);
    let cpu_flag = ["vmx", "svm"].into_iter().find(|f| has(f));
    let data = json!({
        "present": facts.kvm.is_some(),
        "openable": matches!(facts.kvm, Some(Ok(()))),
        "cpu_flag": cpu_flag,
        "pvm": facts.pvm,
        "hardware": host_verdict(facts).is_ok(),
    });
    match host_verdict(facts) {
        Ok(flag) => finding(
            "kvm",
            Status::Ok,
            format!("KVM with hardware virtualization ({flag}): microVM sandboxes"),
            None,
            data,
        ),
        Err(why) => {
            let fix = match &facts.kvm {
                None if has("vmx") => Some("sudo modprobe kvm_intel"),
                None if has("svm") => Some("sudo modprobe kvm_amd"),
                Some(Err(_)) => Some("sudo usermod -aG kvm \"$USER\" (then log in again)"),
                // PVM or no flags: only another host (or nested virtualization) helps.
                _ => None,
            };
            finding(
                "kvm",
                Status::Warning,
                format!("{why}; sandboxes use Linux namespaces instead of microVMs"),
                fix,
                data,
            )
        }
    }
}

/// cgroups: which version, and which controllers this user may use for sandbox limits.
///
/// Which version counts is the namespace backend's choice ([`Hierarchies::mode`]): on a
/// hybrid host the v2 mount has no controllers and limits go through v1.
pub fn cgroup(h: &Hierarchies, subtree_writable: bool, rootless: bool) -> Finding {
    let v2 = match h.mode() {
        CgroupMode::V1 => None,
        CgroupMode::V2 | CgroupMode::None => h.v2.as_ref(),
    };
    if let Some((dir, ctrls)) = v2 {
        let missing: Vec<&str> = WANTED_V2
            .into_iter()
            .filter(|w| !ctrls.iter().any(|c| c == w))
            .collect();
        let data = json!({
            "version": "v2",
            "group": dir,
            "controllers": ctrls,
            "subtree_control_writable": subtree_writable,
            "missing": missing,
        });
        let group = dir.display();
        if !subtree_writable {
            let fix = if rootless {
                DELEGATE_FIX.to_owned()
            } else {
                format!(
                    "sudo chown \"$USER\" {group} {group}/cgroup.procs {group}/cgroup.subtree_control"
                )
            };
            return Finding {
                fix: Some(fix),
                ..finding(
                    "cgroup",
                    Status::Warning,
                    format!(
                        "cgroup v2, but {group} is not delegated to this user: memory, CPU and PID limits are not enforced"
                    ),
                    None,
                    data,
                )
            };
        }
        if missing.is_empty() {
            return finding(
                "cgroup",
                Status::Ok,
                format!("cgroup v2, delegated {group} with {}", ctrls.join(" ")),
                None,
                data,
            );
        }
        return finding(
            "cgroup",
            Status::Warning,
            format!(
                "cgroup v2, delegated {group} lacks {}: those limits are not enforced",
                missing.join(" ")
            ),
            Some(DELEGATE_FIX),
            data,
        );
    }
    let mounted: Vec<&str> = h.v1.keys().map(String::as_str).collect();
    if mounted.is_empty() {
        return finding(
            "cgroup",
            Status::Warning,
            "no cgroup controllers are mounted: memory, CPU and PID limits are not enforced",
            Some("sudo mount -t cgroup2 none /sys/fs/cgroup"),
            json!({ "version": null, "controllers": [] }),
        );
    }
    let missing: Vec<&str> = WANTED_V1
        .into_iter()
        .filter(|w| !mounted.contains(w))
        .collect();
    let data = json!({ "version": "v1", "controllers": mounted, "missing": missing });
    // The daemon writes v1 limits only as root; v2 delegation is the rootless way. Debian (the
    // platform Belljar is set up on) boots through GRUB's /etc/default/grub and has no
    // `grubby`; the option goes last on the command line, where it overrides an earlier `=0`.
    let unified = "sudo sed -i '/^GRUB_CMDLINE_LINUX_DEFAULT=/s/\"$/ systemd.unified_cgroup_hierarchy=1\"/' /etc/default/grub && sudo update-grub, then reboot (with grubby: sudo grubby --update-kernel=ALL --args=systemd.unified_cgroup_hierarchy=1)";
    if rootless {
        return finding(
            "cgroup",
            Status::Warning,
            format!(
                "cgroup v1 ({}): without root, limits are not enforced (they need delegated cgroup v2)",
                mounted.join(" ")
            ),
            Some(unified),
            data,
        );
    }
    if missing.is_empty() {
        finding(
            "cgroup",
            Status::Ok,
            format!("cgroup v1, mounted: {}", mounted.join(" ")),
            None,
            data,
        )
    } else {
        finding(
            "cgroup",
            Status::Warning,
            format!(
                "cgroup v1 without {}: those limits (or pause) do not work",
                missing.join(" ")
            ),
            Some(unified),
            data,
        )
    }
}

/// What rootless sandboxes need to have users besides root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubidFacts {
    pub rootless: bool,
    pub user: Option<String>,
    /// `(start, count)` from `/etc/subuid` and `/etc/subgid`.
    pub subuid: Option<(u32, u32)>,
    pub subgid: Option<(u32, u32)>,
    /// `newuidmap` and `newgidmap` are on `PATH`.
    pub helpers: bool,
    /// The first subordinate id past everyone's ranges: where a new range overlaps no one's.
    pub next_free: u64,
}

impl SubidFacts {
    /// Reads `root/etc/subuid` and `root/etc/subgid` for the current user.
    pub fn gather(root: &Path, rootless: bool) -> Self {
        let uid = nix::unistd::Uid::current();
        let user = nix::unistd::User::from_uid(uid)
            .ok()
            .flatten()
            .map(|u| u.name);
        let range = |file: &str| {
            belljar_namespace::idmap::subid_range(&root.join(file), user.as_deref(), uid.as_raw())
        };
        Self {
            rootless,
            subuid: range("etc/subuid"),
            subgid: range("etc/subgid"),
            user,
            helpers: belljar_namespace::idmap::which("newuidmap")
                && belljar_namespace::idmap::which("newgidmap"),
            next_free: belljar_namespace::idmap::next_free_subid(&root.join("etc")),
        }
    }
}

pub fn subids(f: &SubidFacts) -> Finding {
    let data = json!({
        "rootless": f.rootless,
        "user": f.user,
        "subuid": f.subuid.map(|(start, count)| json!({"start": start, "count": count})),
        "subgid": f.subgid.map(|(start, count)| json!({"start": start, "count": count})),
        "uidmap_tools": f.helpers,
    });
    if !f.rootless {
        return finding(
            "subids",
            Status::Ok,
            "running as root: each sandbox gets its own id block, /etc/subuid is not needed",
            None,
            data,
        );
    }
    let user = f.user.as_deref().unwrap_or("$USER");
    // A range of its own, past everyone's (a fixed one may be another user's).
    let add = belljar_namespace::idmap::add_subids_args(f.next_free, user);
    let (Some(u), Some(g)) = (f.subuid, f.subgid) else {
        let fix = format!("sudo usermod {add}");
        return Finding {
            fix: Some(fix),
            ..finding(
                "subids",
                Status::Problem,
                format!(
                    "no /etc/subuid and /etc/subgid range for {user}: rootless sandboxes cannot start (error subids_missing)"
                ),
                None,
                data,
            )
        };
    };
    if !f.helpers {
        return finding(
            "subids",
            Status::Problem,
            "newuidmap/newgidmap are missing: rootless sandboxes cannot start (error uidmap_missing)",
            Some("sudo apt-get install uidmap"),
            data,
        );
    }
    let count = u.1.min(g.1);
    if count < 65535 {
        // The short range is dropped: sandboxes use a user's first range only.
        let last = |(s, c): (u32, u32)| u64::from(s) + u64::from(c) - 1;
        let fix = format!(
            "sudo usermod --del-subuids {}-{} --del-subgids {}-{} {add}",
            u.0,
            last(u),
            g.0,
            last(g)
        );
        return Finding {
            fix: Some(fix),
            ..finding(
                "subids",
                Status::Warning,
                format!(
                    "only {count} subordinate ids for {user}: sandbox ids above {count} are unmapped"
                ),
                None,
                data,
            )
        };
    }
    finding(
        "subids",
        Status::Ok,
        format!(
            "{user} has subordinate ids {}+{} and {}+{}, and the uidmap tools",
            u.0, u.1, g.0, g.1
        ),
        None,
        data,
    )
}

/// Kernel switches that forbid user namespaces; each one names its own fix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sysctls {
    /// `kernel.unprivileged_userns_clone` (Debian's patch).
    pub unprivileged_userns_clone: Option<u64>,
    /// `user.max_user_namespaces`.
    pub max_user_namespaces: Option<u64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later).
    pub apparmor_restrict: Option<u64>,
}

impl Sysctls {
    pub fn gather(root: &Path) -> Self {
        let read = |p: &str| {
            std::fs::read_to_string(root.join("proc/sys").join(p))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Self {
            unprivileged_userns_clone: read("kernel/unprivileged_userns_clone"),
            max_user_namespaces: read("user/max_user_namespaces"),
            apparmor_restrict: read("kernel/apparmor_restrict_unprivileged_userns"),
        }
    }
}

/// overlayfs in a user namespace: the namespace backend's root filesystem needs it.
pub fn overlayfs(result: &Result<(), crate::ProbeError>, sysctls: &Sysctls) -> Finding {
    let error = result.as_ref().err().map(ToString::to_string);
    let data = json!({ "works": result.is_ok(), "error": error });
    let Err(why) = result else {
        return finding(
            "overlayfs",
            Status::Ok,
            "overlayfs mounts and writes inside a new user namespace",
            None,
            data,
        );
    };
    let fix = if sysctls.max_user_namespaces == Some(0) {
        Some("sudo sysctl -w user.max_user_namespaces=15000")
    } else if sysctls.unprivileged_userns_clone == Some(0) {
        Some("sudo sysctl -w kernel.unprivileged_userns_clone=1")
    } else if sysctls.apparmor_restrict == Some(1) {
        Some("sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    } else {
        // Otherwise the kernel is too old (overlayfs in user namespaces came in 5.11).
        None
    };
    finding(
        "overlayfs",
        Status::Problem,
        format!("overlayfs in a user namespace fails ({why}): namespace sandboxes cannot start"),
        fix,
        data,
    )
}

/// Free space where Belljar keeps images or sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFacts {
    pub what: &'static str,
    pub dir: std::path::PathBuf,
    /// Bytes available to this user; `None` when not even an ancestor could be examined.
    pub free: Option<u64>,
}

impl DiskFacts {
    /// Free space of `dir`, or of its nearest existing ancestor before it is created.
    pub fn gather(what: &'static str, dir: &Path) -> Self {
        let free = dir
            .ancestors()
            .find(|d| d.exists())
            .and_then(|d| nix::sys::statvfs::statvfs(d).ok())
            .map(|s| s.blocks_available().saturating_mul(s.fragment_size()));
        Self {
            what,
            dir: dir.to_path_buf(),
            free,
        }
    }
}

/// The tightest of the directories decides. Rootless, the finding also says that a
/// sandbox's disk limit is not enforced (`sandbox_disk_limit`, the same reason a sandbox's
/// `limits.disk` gives); no command fixes that short of running the daemon as root, so it
/// does not change the status.
pub fn disk(dirs: &[DiskFacts], rootless: bool) -> Finding {
    // Facts are an object for every check (the API's schema says so): the directories go
    // under `dirs`.
    let limit = if rootless {
        json!({"enforced": false, "reason": belljar_namespace::disk::ROOTLESS_REASON})
    } else {
        json!({"enforced": true, "how": "an ext4 image of the requested size, loop-mounted"})
    };
    let data = json!({
        "dirs": dirs
            .iter()
            .map(|d| json!({"what": d.what, "dir": d.dir, "free_bytes": d.free}))
            .collect::<Vec<_>>(),
        "sandbox_disk_limit": limit,
    });
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let Some(low) = dirs
        .iter()
        .filter(|d| d.free.is_some())
        .min_by_key(|d| d.free)
    else {
        return finding(
            "disk",
            Status::Warning,
            "free space could not be read",
            None,
            data,
        );
    };
    let free = low.free.unwrap_or_default();
    let mut found = format!(
        "{:.1} GiB free for the {} ({})",
        gib(free),
        low.what,
        low.dir.display()
    );
    if rootless {
        found.push_str("; sandbox disk limits are not enforced without root");
    }
    let status = if free < DISK_PROBLEM {
        Status::Problem
    } else if free < DISK_WARN {
        Status::Warning
    } else {
        Status::Ok
    };
    // Each directory has its own variable: BELLJAR_CACHE moves the images, not the data
    // (sandboxes' writes, the database), which follows BELLJAR_HOME.
    let fix = (status != Status::Ok).then_some(if low.what == "data" {
        "export BELLJAR_HOME=/a/directory/on/a/larger/disk (or free space on that file system)"
    } else {
        "export BELLJAR_CACHE=/a/directory/on/a/larger/disk (or free space on that file system)"
    });
    finding("disk", status, found, fix, data)
}

/// The daemon: not running is fine (the CLI starts it), but worth knowing; and how
/// `belljar daemon start` (or the app) starts it here (`launch`, from
/// `belljar_client::scope`).
pub fn daemon(answers: bool, socket: &Path, launch: &belljar_client::scope::Launch) -> Finding {
    let how = launch.describe();
    let scope = matches!(launch, belljar_client::scope::Launch::Scope { .. });
    let data =
        json!({ "running": answers, "socket": socket, "systemd_scope": scope, "start": how });
    if answers {
        finding(
            "daemon",
            Status::Ok,
            format!(
                "belljard answers on {}; a new one is {how}",
                socket.display()
            ),
            None,
            data,
        )
    } else {
        finding(
            "daemon",
            Status::Warning,
            format!(
                "belljard is not running (no answer on {}); it is {how}",
                socket.display()
            ),
            Some("belljar daemon start"),
            data,
        )
    }
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod tests;

/// The network path: a tap device in the sandbox's network namespace carries its traffic.
pub fn network(f: &super::net::NetFacts) -> Finding {
    let data = json!({
        "tun_present": f.tun_present,
        "tun_openable": f.tun_openable,
        "tap_in_netns": f.tap_in_netns.is_ok(),
        "reason": f.tap_in_netns.as_ref().err().map(ToString::to_string),
    });
    if !f.tun_present {
        return finding(
            "network",
            Status::Warning,
            "no /dev/net/tun: namespace sandboxes have no network",
            Some("sudo modprobe tun"),
            data,
        );
    }
    match &f.tap_in_netns {
        Ok(()) => finding(
            "network",
            Status::Ok,
            "/dev/net/tun works: a tap device can be made in a sandbox's network namespace",
            None,
            data,
        ),
        // udev's rule makes it 0666; without udev (a bare devtmpfs) only root may open it.
        Err(why) if !f.tun_openable => finding(
            "network",
            Status::Warning,
            format!("{why}: namespace sandboxes have no network"),
            Some("sudo chmod 0666 /dev/net/tun"),
            data,
        ),
        Err(why) => finding(
            "network",
            Status::Warning,
            format!("{why}: namespace sandboxes have no network"),
            None,
            data,
        ),
    }
}
