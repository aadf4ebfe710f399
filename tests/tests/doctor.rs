//! `belljar doctor --json` on the two kinds of host Belljar is tested on, whose findings must
//! differ: this build machine (root, cgroup v1 with an empty v2 mount; its `/dev/kvm` is PVM's
//! here, and whatever KVM a root host has is probed by the test, not assumed), and the rootless
//! host of the microVM harness's L1 guest (an ordinary user with subordinate ids on cgroup v2
//! with a subtree delegated to it, `/dev/kvm` present but only for the `kvm` group). Each test
//! needs its host, so both are ignored by default: `scripts/test.sh` runs the first here and
//! `tests/microvm/rootless.sh` the second in L1 (`BELLJAR_DOCTOR_HOST` names the host so that a
//! run on the wrong one fails instead of passing vacuously).

use std::process::Command;

use belljar_e2e::binary;
use serde_json::Value;

/// The report, and the finding of each check by name.
fn doctor() -> (Value, impl Fn(&str) -> Value) {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(binary("belljar"))
        .args(["doctor", "--json"])
        // No daemon answers in an empty home: that finding is a warning, not a problem.
        .env("BELLJAR_HOME", home.path())
        .output()
        .expect("belljar doctor");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
    let findings = report["findings"].as_array().unwrap().clone();
    let by_name = move |check: &str| {
        findings
            .iter()
            .find(|f| f["check"] == check)
            .unwrap_or_else(|| panic!("no {check} finding"))
            .clone()
    };
    (report, by_name)
}

/// The same checks through the daemon, `GET /v1/doctor` (what the app's settings show): the
/// daemon runs the overlayfs and network probes in children of `belljard`. Its findings must
/// match the CLI's, check by check, except that the daemon answers.
fn doctor_via_daemon_matches(cli: &Value) {
    let daemon = belljar_e2e::Daemon::start();
    let report = belljar_e2e::block_on(daemon.unix().doctor()).expect("GET /v1/doctor");
    let report = serde_json::to_value(report).unwrap();
    let status = |r: &Value| -> Vec<(String, String)> {
        r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["check"] != "daemon" && f["check"] != "disk")
            .map(|f| (f["check"].to_string(), f["status"].to_string()))
            .collect()
    };
    assert_eq!(status(&report), status(cli), "{report:#}");
    let daemon_finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "daemon")
        .unwrap();
    assert_eq!(daemon_finding["status"], "ok", "{daemon_finding}");
}

fn expect_host(kind: &str) {
    assert_eq!(
        std::env::var("BELLJAR_DOCTOR_HOST").as_deref(),
        Ok(kind),
        "run on the {kind} host with BELLJAR_DOCTOR_HOST={kind}"
    );
}

/// This host's KVM as the test sees it, independently of the doctor: `/dev/kvm`, the PVM
/// module and the CPU's virtualization flag (what `hardware_kvm()` of
/// `scripts/test-microvm.sh` looks at).
struct Kvm {
    present: bool,
    pvm: bool,
    cpu_flag: Option<&'static str>,
}

impl Kvm {
    fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .unwrap_or_default();
        let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
        Self {
            present: std::path::Path::new("/dev/kvm").exists(),
            pvm: std::path::Path::new("/sys/module/kvm_pvm").exists(),
            cpu_flag: ["vmx", "svm"].into_iter().find(|f| has(f)),
        }
    }
}

/// The `kvm` finding as root, who opens any `/dev/kvm` there is: ok only with hardware KVM
/// (our build machines have PVM's, a warning no command fixes); without `/dev/kvm` the fix
/// loads the module for the CPU's flag, if it has one.
fn expect_kvm_as_root(kvm: &Value) {
    let host = Kvm::probe();
    eprintln!(
        "this host's KVM: /dev/kvm {}, PVM {}, CPU flag {:?}",
        host.present, host.pvm, host.cpu_flag
    );
    let hardware = host.present && !host.pvm && host.cpu_flag.is_some();
    let facts = &kvm["facts"];
    assert_eq!(facts["present"], host.present, "{kvm}");
    assert_eq!(facts["openable"], host.present, "{kvm}");
    assert_eq!(facts["pvm"], host.pvm, "{kvm}");
    assert_eq!(facts["cpu_flag"], serde_json::json!(host.cpu_flag), "{kvm}");
    assert_eq!(facts["hardware"], hardware, "{kvm}");
    let status = if hardware { "ok" } else { "warning" };
    assert_eq!(kvm["status"], status, "{kvm}");
    let fix = match (host.present, host.cpu_flag) {
        (false, Some("vmx")) => Value::from("sudo modprobe kvm_intel"),
        (false, Some("svm")) => Value::from("sudo modprobe kvm_amd"),
        _ => Value::Null,
    };
    assert_eq!(kvm["fix"], fix, "{kvm}");
}

#[test]
#[ignore = "needs a root host on cgroup v1: scripts/test.sh runs it with BELLJAR_DOCTOR_HOST=v1-root"]
fn doctor_as_root_on_cgroup_v1() {
    expect_host("v1-root");
    let (report, f) = doctor();
    let cgroup = f("cgroup");
    assert_eq!(cgroup["status"], "ok", "{cgroup}");
    assert_eq!(cgroup["facts"]["version"], "v1");
    let subids = f("subids");
    assert_eq!(subids["status"], "ok");
    assert_eq!(subids["facts"]["rootless"], false);
    expect_kvm_as_root(&f("kvm"));
    assert_eq!(f("overlayfs")["status"], "ok");
    // Root makes a tap in a fresh network namespace.
    let network = f("network");
    assert_eq!(network["status"], "ok", "{network}");
    assert_eq!(network["facts"]["tap_in_netns"], true);
    // As root a sandbox's disk limit is a loop-mounted filesystem of its size.
    assert_eq!(f("disk")["facts"]["sandbox_disk_limit"]["enforced"], true);
    assert_eq!(report["ok"], true);
    doctor_via_daemon_matches(&report);
}

#[test]
#[ignore = "needs an ordinary user on delegated cgroup v2: tests/microvm/rootless.sh runs it in L1"]
fn doctor_as_an_ordinary_user_on_delegated_v2() {
    expect_host("v2-rootless");
    let (report, f) = doctor();
    let cgroup = f("cgroup");
    assert_eq!(cgroup["status"], "ok", "{cgroup}");
    assert_eq!(cgroup["facts"]["version"], "v2");
    assert_eq!(cgroup["facts"]["subtree_control_writable"], true);
    let group = cgroup["facts"]["group"].as_str().unwrap();
    assert!(group.ends_with(".service"), "the delegated group: {group}");
    let controllers = cgroup["facts"]["controllers"].to_string();
    for c in ["cpu", "memory", "pids"] {
        assert!(controllers.contains(c), "{controllers}");
    }
    let subids = f("subids");
    assert_eq!(subids["status"], "ok", "{subids}");
    assert_eq!(subids["facts"]["rootless"], true);
    assert_eq!(subids["facts"]["subuid"]["count"], 65536);
    // Nested KVM is there, but only the kvm group may open it: the fix is joining it.
    let kvm = f("kvm");
    assert_eq!(kvm["status"], "warning", "{kvm}");
    assert_eq!(kvm["facts"]["present"], true);
    assert_eq!(kvm["facts"]["openable"], false);
    assert!(kvm["fix"].as_str().unwrap().contains("usermod -aG kvm"));
    assert_eq!(f("overlayfs")["status"], "ok");
    // L1 loads tun but has no udev: /dev/net/tun is root's (0600), and the fix says so.
    let network = f("network");
    assert_eq!(network["status"], "warning", "{network}");
    assert_eq!(network["facts"]["tun_present"], true);
    assert_eq!(network["facts"]["tun_openable"], false);
    assert_eq!(network["fix"], "sudo chmod 0666 /dev/net/tun");
    // Rootless, the disk limit is not enforced, and the finding says so and why.
    let disk = f("disk");
    assert_eq!(
        disk["facts"]["sandbox_disk_limit"]["enforced"], false,
        "{disk}"
    );
    assert!(
        disk["found"].as_str().unwrap().contains("not enforced"),
        "{disk}"
    );
    // L1's /tmp is RAM (a few hundred MiB free): a disk problem there is the truth; nothing
    // else may be one.
    let problems: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["status"] == "problem")
        .map(|f| f["check"].as_str().unwrap())
        .collect();
    assert!(problems.iter().all(|c| *c == "disk"), "{problems:?}");
    doctor_via_daemon_matches(&report);
}
