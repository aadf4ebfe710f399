//! Each check's classification, from fixture files under a temporary directory.

use std::fs;
use std::path::Path;

use super::*;
use crate::ProbeError;

fn v2_fixture(root: &Path, controllers: &str) -> Hierarchies {
    let mnt = root.join("sys/fs/cgroup");
    let group = mnt.join("user.slice/user-1000.slice");
    fs::create_dir_all(&group).unwrap();
    fs::write(group.join("cgroup.controllers"), controllers).unwrap();
    let mountinfo = format!(
        "36 25 0:30 / {} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n",
        mnt.display()
    );
    Hierarchies::parse(&mountinfo, "0::/user.slice/user-1000.slice\n", |p| {
        fs::read_to_string(p).ok()
    })
}

fn v1_fixture(root: &Path, controllers: &[&str]) -> Hierarchies {
    let mut mountinfo = String::new();
    let mut own = String::new();
    for (i, c) in controllers.iter().enumerate() {
        let mnt = root.join(c);
        fs::create_dir_all(&mnt).unwrap();
        mountinfo += &format!(
            "{} 25 0:{} / {} rw,nosuid shared:{i} - cgroup cgroup rw,{c}\n",
            40 + i,
            40 + i,
            mnt.display()
        );
        own += &format!("{}:{c}:/\n", i + 1);
    }
    Hierarchies::parse(&mountinfo, &own, |p| fs::read_to_string(p).ok())
}

#[test]
fn kvm_on_pvm_is_a_warning_without_hardware() {
    let pvm = HostFacts {
        kvm: Some(Ok(())),
        cpu_flags: "flags : fpu vmx sse".into(),
        pvm: true,
    };
    let f = kvm(&pvm);
    assert_eq!(f.status, Status::Warning);
    assert_eq!(f.facts["hardware"], false);
    assert_eq!(f.facts["pvm"], true);
    assert!(f.found.contains("PVM"), "{}", f.found);
    assert_eq!(f.fix, None);

    let hw = HostFacts { pvm: false, ..pvm };
    let f = kvm(&hw);
    assert_eq!(f.status, Status::Ok);
    assert_eq!(f.facts["hardware"], true);
    assert_eq!(f.facts["cpu_flag"], "vmx");

    let denied = HostFacts {
        kvm: Some(Err(std::io::ErrorKind::PermissionDenied)),
        ..hw.clone()
    };
    let f = kvm(&denied);
    assert_eq!(f.status, Status::Warning);
    assert!(f.fix.unwrap().contains("usermod -aG kvm"));

    let missing = HostFacts {
        kvm: None,
        cpu_flags: "flags : svm".into(),
        pvm: false,
    };
    assert_eq!(kvm(&missing).fix.as_deref(), Some("sudo modprobe kvm_amd"));
}

#[test]
fn cgroup_v2_delegation_is_classified() {
    let dir = tempfile::tempdir().unwrap();
    let full = v2_fixture(dir.path(), "cpuset cpu io memory pids\n");
    let f = cgroup(&full, true, true);
    assert_eq!(f.status, Status::Ok, "{}", f.found);
    assert_eq!(f.facts["version"], "v2");
    assert_eq!(f.facts["missing"], serde_json::json!([]));

    let f = cgroup(&full, false, true);
    assert_eq!(f.status, Status::Warning);
    assert!(f.found.contains("not delegated"), "{}", f.found);
    assert!(f.fix.unwrap().contains("Delegate="));

    let dir = tempfile::tempdir().unwrap();
    let partial = v2_fixture(dir.path(), "memory\n");
    let f = cgroup(&partial, true, true);
    assert_eq!(f.status, Status::Warning);
    assert_eq!(f.facts["missing"], serde_json::json!(["cpu", "pids"]));

    // A user's own group with nothing delegated to it is still reported as v2.
    let dir = tempfile::tempdir().unwrap();
    let empty = v2_fixture(dir.path(), "");
    let f = cgroup(&empty, false, true);
    assert_eq!(f.facts["version"], "v2");
    assert_eq!(f.status, Status::Warning);
}

#[test]
fn cgroup_v1_lists_mounted_controllers() {
    let dir = tempfile::tempdir().unwrap();
    let all = v1_fixture(dir.path(), &["cpu", "freezer", "memory", "pids"]);
    let f = cgroup(&all, false, false);
    assert_eq!(f.status, Status::Ok, "{}", f.found);
    assert_eq!(f.facts["version"], "v1");
    assert_eq!(
        f.facts["controllers"],
        serde_json::json!(["cpu", "freezer", "memory", "pids"])
    );
    // Rootless on v1: the daemon cannot write limits. The fix is Debian's (GRUB's
    // /etc/default/grub and update-grub; `grubby` is not packaged there).
    let rootless = cgroup(&all, false, true);
    assert_eq!(rootless.status, Status::Warning);
    let fix = rootless.fix.unwrap();
    assert!(
        fix.starts_with("sudo sed -i '/^GRUB_CMDLINE_LINUX_DEFAULT=/")
            && fix.contains(" /etc/default/grub && sudo update-grub, then reboot"),
        "{fix}"
    );

    let dir = tempfile::tempdir().unwrap();
    let some = v1_fixture(dir.path(), &["memory"]);
    let f = cgroup(&some, false, false);
    assert_eq!(f.status, Status::Warning);
    assert_eq!(
        f.facts["missing"],
        serde_json::json!(["cpu", "freezer", "pids"])
    );

    // Hybrid: an empty v2 mount beside the v1 controllers; limits go through v1.
    let hybrid = Hierarchies {
        v2: Some((dir.path().join("unified"), vec!["hugetlb".into()])),
        ..all
    };
    assert_eq!(cgroup(&hybrid, true, false).facts["version"], "v1");

    let none = cgroup(&Hierarchies::default(), false, false);
    assert_eq!(none.status, Status::Warning);
    assert_eq!(none.facts["version"], serde_json::Value::Null);
}

#[test]
fn subordinate_ids_are_read_from_the_files() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("etc")).unwrap();
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::current())
        .unwrap()
        .unwrap()
        .name;
    fs::write(
        dir.path().join("etc/subuid"),
        format!("{name}:100000:65536\n"),
    )
    .unwrap();
    let facts = SubidFacts::gather(dir.path(), true);
    assert_eq!(facts.subuid, Some((100000, 65536)));
    assert_eq!(facts.subgid, None);
    let f = subids(&facts);
    // Rootless sandboxes refuse to start without a range (idmap::Error::NoSubids).
    assert_eq!(f.status, Status::Problem);
    assert!(f.found.contains("subids_missing"), "{}", f.found);
    // The new range goes after every range already given (the user's own subuid here).
    assert_eq!(
        f.fix.as_deref(),
        Some(
            format!("sudo usermod --add-subuids 165536-231071 --add-subgids 165536-231071 {name}")
                .as_str()
        )
    );

    fs::write(
        dir.path().join("etc/subgid"),
        format!("{name}:100000:65536\n"),
    )
    .unwrap();
    let facts = SubidFacts {
        helpers: true,
        ..SubidFacts::gather(dir.path(), true)
    };
    assert_eq!(subids(&facts).status, Status::Ok);
    let no_tools = SubidFacts {
        helpers: false,
        ..facts.clone()
    };
    assert_eq!(
        subids(&no_tools).fix.as_deref(),
        Some("sudo apt-get install uidmap")
    );
    assert_eq!(subids(&no_tools).status, Status::Problem);
    let small = SubidFacts {
        subuid: Some((100000, 1000)),
        next_free: 300000,
        ..facts.clone()
    };
    assert_eq!(subids(&small).status, Status::Warning);
    assert_eq!(
        subids(&small).fix.as_deref(),
        Some(format!("sudo usermod --del-subuids 100000-100999 --del-subgids 100000-165535 --add-subuids 300000-365535 --add-subgids 300000-365535 {name}").as_str())
    );
    let root = SubidFacts {
        rootless: false,
        subuid: None,
        subgid: None,
        ..facts
    };
    assert_eq!(subids(&root).status, Status::Ok);
}

#[test]
fn overlay_failure_names_the_sysctl_that_forbids_it() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("proc/sys");
    fs::create_dir_all(sys.join("kernel")).unwrap();
    fs::create_dir_all(sys.join("user")).unwrap();
    fs::write(
        sys.join("kernel/apparmor_restrict_unprivileged_userns"),
        "1\n",
    )
    .unwrap();
    fs::write(sys.join("user/max_user_namespaces"), "63000\n").unwrap();
    let sysctls = Sysctls::gather(dir.path());
    assert_eq!(sysctls.apparmor_restrict, Some(1));
    assert_eq!(sysctls.unprivileged_userns_clone, None);

    let failed = Err(ProbeError::Refused(
        "Cannot create a user namespace: EPERM".to_owned(),
    ));
    let f = overlayfs(&failed, &sysctls);
    assert_eq!(f.status, Status::Problem);
    assert_eq!(
        f.fix.as_deref(),
        Some("sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    );
    fs::write(sys.join("user/max_user_namespaces"), "0\n").unwrap();
    let f = overlayfs(&failed, &Sysctls::gather(dir.path()));
    assert_eq!(
        f.fix.as_deref(),
        Some("sudo sysctl -w user.max_user_namespaces=15000")
    );
    assert_eq!(overlayfs(&Ok(()), &sysctls).status, Status::Ok);
}

#[test]
fn disk_space_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    // A directory that does not exist yet is judged by its nearest existing ancestor.
    let real = DiskFacts::gather("image cache", &dir.path().join("not/yet"));
    assert!(real.free.is_some());
    let at = |free| DiskFacts {
        free: Some(free),
        ..real.clone()
    };
    assert_eq!(disk(&[at(DISK_WARN)], false).status, Status::Ok);
    assert_eq!(
        disk(&[at(DISK_WARN), at(DISK_WARN - 1)], false).status,
        Status::Warning
    );
    let f = disk(&[at(DISK_WARN), at(DISK_PROBLEM - 1)], false);
    assert_eq!(f.status, Status::Problem);
    // The API's schema gives every finding's facts as an object (schemathesis checks it).
    assert_eq!(
        f.facts["dirs"].as_array().map(Vec::len),
        Some(2),
        "{}",
        f.facts
    );
    assert!(f.fix.unwrap().contains("BELLJAR_CACHE"));
    assert_eq!(f.facts["sandbox_disk_limit"]["enforced"], true);
    // Low on the data directory: BELLJAR_CACHE would not move it (it said so to a user whose
    // home was short of space); BELLJAR_HOME does.
    let data = DiskFacts {
        what: "data",
        ..at(DISK_WARN - 1)
    };
    let f = disk(&[at(DISK_WARN), data], true);
    assert_eq!(f.status, Status::Warning);
    assert!(f.fix.unwrap().starts_with("export BELLJAR_HOME="));
}

/// Rootless, the disk finding says the sandboxes' disk limit is not enforced and why (the
/// same words as a sandbox's `limits.disk`), without making plenty of space a warning.
#[test]
fn rootless_disk_limit_is_reported_not_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let facts = DiskFacts {
        free: Some(DISK_WARN),
        ..DiskFacts::gather("data", dir.path())
    };
    let f = disk(std::slice::from_ref(&facts), true);
    assert_eq!(f.status, Status::Ok);
    assert!(
        f.found.contains("disk limits are not enforced"),
        "{}",
        f.found
    );
    let limit = &f.facts["sandbox_disk_limit"];
    assert_eq!(limit["enforced"], false);
    assert_eq!(limit["reason"], belljar_namespace::disk::ROOTLESS_REASON);
    assert!(!disk(&[facts], false).found.contains("not enforced"));
}

#[test]
fn daemon_not_running_is_a_warning_and_problems_fail_the_report() {
    let sock = Path::new("/nonexistent/belljard.sock");
    let direct = belljar_client::scope::Launch::Direct {
        reason: "no systemd user manager runs for this user".into(),
    };
    let f = daemon(false, sock, &direct);
    assert_eq!(f.status, Status::Warning);
    assert!(
        f.found
            .contains("started directly (no systemd user manager"),
        "{}",
        f.found
    );
    assert_eq!(f.facts["systemd_scope"], false);
    let scope = belljar_client::scope::Launch::Scope {
        systemd_run: "/usr/bin/systemd-run".into(),
    };
    let running = daemon(true, sock, &scope);
    assert!(
        running.found.contains("delegated systemd scope"),
        "{}",
        running.found
    );
    assert_eq!(running.facts["systemd_scope"], true);
    assert_eq!(f.fix.as_deref(), Some("belljar daemon start"));
    assert!(super::super::Report::new(vec![f.clone()]).ok);
    let problem = overlayfs(&Err(ProbeError::Refused("x".into())), &Sysctls::default());
    let report = super::super::Report::new(vec![f, problem]);
    assert!(!report.ok);
    assert!(crate::render(&report).contains("PROBLEM"));
}

#[test]
fn network_needs_tun_and_a_tap_in_a_netns() {
    use crate::net::NetFacts;
    let missing = NetFacts {
        tun_present: false,
        tun_openable: false,
        tap_in_netns: Err(ProbeError::Missing("/dev/net/tun")),
    };
    let f = network(&missing);
    assert_eq!(f.status, Status::Warning);
    assert_eq!(f.fix.as_deref(), Some("sudo modprobe tun"));
    let refused = NetFacts {
        tun_present: true,
        tun_openable: true,
        tap_in_netns: Err(ProbeError::Refused(
            "Cannot create a tap device in a network namespace: EPERM".into(),
        )),
    };
    let f = network(&refused);
    assert_eq!(f.status, Status::Warning);
    assert!(f.found.contains("EPERM"), "{}", f.found);
    assert_eq!(f.facts["tap_in_netns"], false);
    let fine = NetFacts {
        tun_present: true,
        tun_openable: true,
        tap_in_netns: Ok(()),
    };
    assert_eq!(network(&fine).status, Status::Ok);
    // A bare devtmpfs (no udev) leaves /dev/net/tun to root.
    let root_only = NetFacts {
        tun_present: true,
        tun_openable: false,
        tap_in_netns: Err(ProbeError::Refused(
            "Cannot open /dev/net/tun: Permission denied".into(),
        )),
    };
    assert_eq!(
        network(&root_only).fix.as_deref(),
        Some("sudo chmod 0666 /dev/net/tun")
    );
}
