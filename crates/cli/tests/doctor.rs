//! The real `belljar doctor --json` on this host: its KVM and cgroup findings must agree with
//! what the kernel shows, and it must answer with no daemon running.

use std::path::Path;
use std::process::Command;

fn doctor() -> (serde_json::Value, i32) {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_belljar"))
        .args(["doctor", "--json"])
        .env("BELLJAR_HOME", home.path())
        .env("BELLJARD", "/nonexistent/belljard")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}); stderr: {stderr}"));
    (report, out.status.code().unwrap())
}

fn finding<'a>(report: &'a serde_json::Value, check: &str) -> &'a serde_json::Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding in {report:#}"))
}

/// Whether `/sys/fs/cgroup` (or the unified mount) is the only hierarchy: v2.
fn host_is_cgroup_v2() -> bool {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    !mountinfo.lines().any(|l| l.contains(" - cgroup cgroup "))
        && mountinfo.lines().any(|l| l.contains(" - cgroup2 "))
}

#[test]
fn doctor_reports_this_host_truthfully() {
    let (report, status) = doctor();
    let checks: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        [
            "kvm",
            "cgroup",
            "subids",
            "overlayfs",
            "network",
            "disk",
            "daemon"
        ]
    );
    assert_eq!(status == 0, report["ok"] == true, "{report:#}");

    let kvm = finding(&report, "kvm");
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    assert_eq!(kvm["facts"]["pvm"], pvm);
    if pvm {
        // This development host and CI runners on PVM: software KVM, never hardware.
        assert_eq!(kvm["facts"]["hardware"], false, "{kvm:#}");
        assert_eq!(kvm["status"], "warning");
    }

    let cgroup = finding(&report, "cgroup");
    let version = if host_is_cgroup_v2() { "v2" } else { "v1" };
    assert_eq!(cgroup["facts"]["version"], version, "{cgroup:#}");
    if version == "v1" && nix::unistd::Uid::effective().is_root() {
        let ctrls = cgroup["facts"]["controllers"].as_array().unwrap();
        assert!(ctrls.iter().any(|c| c == "memory"), "{cgroup:#}");
    }

    // Namespace sandboxes run here, so overlayfs in a user namespace must work.
    assert_eq!(finding(&report, "overlayfs")["status"], "ok");
    // BELLJAR_HOME is a fresh directory: no daemon answers there.
    let daemon = finding(&report, "daemon");
    assert_eq!(daemon["facts"]["running"], false);
    assert_eq!(daemon["fix"], "belljar daemon start");
}
