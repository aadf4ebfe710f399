//! A sandbox's memory, CPU and PID limits on the namespace backend, end to end: made through
//! the CLI and a real daemon on the `base` image, reported enforced through the API and
//! `belljar info --json` by the cgroup version of the host, and held by the files named in the
//! sandbox's own group. As root (`cargo test` in CI) that is cgroup v1 on our build machines;
//! as an ordinary user, delegated cgroup v2 in the rootless job's L1 guest
//! (`tests/microvm/rootless.sh`), where the group must sit under the subtree delegated to the
//! user. `tests/tests/e2e_ordinary_user.rs` covers an ordinary user on v1, where none can be
//! enforced. Admission reads limits as caps: a sandbox is admitted by what the others use,
//! up to an overcommit of the host's RAM.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use belljar_api::{BackendChoice, CreateSandbox};
use belljar_e2e::{Daemon, block_on, stderr, stdout};
use serde_json::Value;

/// The host the test runs on, which decides what it expects. `BELLJAR_DOCTOR_HOST` names it
/// as for `tests/doctor.rs`: `v2-rootless` is the rootless job's ordinary user on delegated
/// cgroup v2, `v1-root` this build machine; without it the test runs as root, as `cargo test`
/// does in CI, on the cgroup version `/sys/fs/cgroup` has. Any other run fails rather than
/// pass on a host whose limits it cannot know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    RootV1,
    RootV2,
    RootlessV2,
}

impl Host {
    fn expected() -> Self {
        let root = nix::unistd::Uid::effective().is_root();
        let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let named = std::env::var("BELLJAR_DOCTOR_HOST");
        let host = match named.as_deref() {
            Ok("v2-rootless") => Self::RootlessV2,
            Ok("v1-root") => Self::RootV1,
            Err(_) if unified => Self::RootV2,
            Err(_) => Self::RootV1,
            Ok(other) => panic!("unknown BELLJAR_DOCTOR_HOST={other}"),
        };
        let fits = match host {
            Self::RootV1 => root && !unified,
            Self::RootV2 => root && unified,
            Self::RootlessV2 => !root && unified,
        };
        assert!(
            fits,
            "expected {host:?} (BELLJAR_DOCTOR_HOST {named:?}), but root: {root}, cgroup2 at \
             /sys/fs/cgroup: {unified}; as an ordinary user this test runs on delegated cgroup \
             v2 with BELLJAR_DOCTOR_HOST=v2-rootless (tests/microvm/rootless.sh)"
        );
        host
    }

    /// `limits.<limit>.detail` of an enforced limit: the cgroup file that holds it.
    fn detail(self, limit: &str) -> &'static str {
        match (self, limit) {
            (Self::RootV1, "memory") => "cgroup v1 memory.limit_in_bytes",
            (Self::RootV1, "cpu") => "cgroup v1 cpu.cfs_quota_us",
            (Self::RootV1, "pids") => "cgroup v1 pids.max",
            (_, "memory") => "cgroup v2 memory.max",
            (_, "cpu") => "cgroup v2 cpu.max",
            (_, "pids") => "cgroup v2 pids.max",
            _ => unreachable!("{limit}"),
        }
    }
}

/// The v2 group delegated to this user: the topmost ancestor of this process's own group
/// whose `cgroup.procs` and `cgroup.subtree_control` the user owns (how systemd, and
/// `tests/microvm/rootless.sh`, delegate `user@UID.service`).
fn delegated_group() -> PathBuf {
    let uid = nix::unistd::Uid::effective().as_raw();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 group in /proc/self/cgroup: {own}"));
    let top = Path::new("/sys/fs/cgroup");
    let owned = |dir: &Path| {
        ["cgroup.procs", "cgroup.subtree_control"]
            .iter()
            .all(|f| std::fs::metadata(dir.join(f)).is_ok_and(|m| m.uid() == uid))
    };
    let mut dir = top.join(own.trim_start_matches('/'));
    let mut delegated = None;
    while dir.starts_with(top) && dir != top {
        if owned(&dir) {
            delegated = Some(dir.clone());
        }
        dir.pop();
    }
    delegated.unwrap_or_else(|| panic!("no group of /sys/fs/cgroup{own} is delegated to uid {uid}"))
}

fn cgroup_file(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(out), stderr(out)))
}

#[test]
fn limits_are_enforced_in_the_sandbox_group_and_reported() {
    let host = Host::expected();
    let d = Daemon::start_via_cli();
    let out = d.cli([
        "create",
        "--backend",
        "namespace",
        "--vcpus",
        "1",
        "--memory",
        "256",
    ]);
    assert!(
        out.status.success(),
        "create failed: {}\nlog:\n{}",
        stderr(&out),
        d.log()
    );
    let id = stdout(&out).trim().to_owned();

    let info = json(&d.cli(["info", &id, "--json"]));
    let api = block_on(d.unix().sandbox(&id)).expect("GET the sandbox");
    assert_eq!(
        info["limits"],
        serde_json::to_value(api.limits).unwrap(),
        "the CLI shows the API's limits"
    );
    eprintln!("{host:?}: {:#}", info["limits"]);
    for limit in ["memory", "cpu", "pids"] {
        let l = &info["limits"][limit];
        assert_eq!(l["enforced"], true, "{limit}: {l}");
        assert_eq!(l["detail"], host.detail(limit), "{limit}: {l}");
    }
    // The disk limit is a loop-mounted filesystem, which only root may mount.
    let root = host != Host::RootlessV2;
    assert_eq!(info["limits"]["disk"]["enforced"], root, "{info:#}");

    // The groups the namespace backend made, from the sandbox's state.
    let state = d.paths.data.join("sandboxes").join(&id);
    let state = std::fs::read_to_string(state.join("namespace/sandbox.json")).unwrap();
    let groups = serde_json::from_str::<Value>(&state).unwrap()["groups"].clone();
    eprintln!("groups: {groups:#}");
    let leaf = Path::new("belljar").join(id.replace('_', "-"));
    let memory = (256u64 << 20).to_string();
    let pids = belljard::sandbox::namespace::PIDS_LIMIT.to_string();
    match host {
        Host::RootV1 => {
            let v1 = |c: &str| {
                let dir = groups["v1"][c].as_str();
                PathBuf::from(dir.unwrap_or_else(|| panic!("no v1 {c} group: {groups:#}")))
            };
            for c in ["memory", "cpu", "pids"] {
                assert!(v1(c).ends_with(&leaf), "{groups:#}");
                assert_ne!(cgroup_file(&v1(c), "cgroup.procs"), "", "{c}: no processes");
            }
            assert_eq!(cgroup_file(&v1("memory"), "memory.limit_in_bytes"), memory);
            assert_eq!(cgroup_file(&v1("pids"), "pids.max"), pids);
            assert_eq!(cgroup_file(&v1("cpu"), "cpu.cfs_period_us"), "100000");
            assert_eq!(cgroup_file(&v1("cpu"), "cpu.cfs_quota_us"), "100000");
        }
        Host::RootV2 | Host::RootlessV2 => {
            let dir = PathBuf::from(groups["v2"].as_str().expect("a v2 group"));
            if host == Host::RootlessV2 {
                let delegated = delegated_group();
                let uid = nix::unistd::Uid::effective().as_raw();
                let service = format!("user@{uid}.service");
                assert!(delegated.ends_with(&service), "{}", delegated.display());
                assert_eq!(dir, delegated.join(&leaf), "{groups:#}");
                assert_eq!(groups["v1"], serde_json::json!({}), "{groups:#}");
            } else {
                assert!(dir.ends_with(&leaf), "{groups:#}");
            }
            assert_ne!(cgroup_file(&dir, "cgroup.procs"), "", "no processes");
            assert_eq!(cgroup_file(&dir, "memory.max"), memory);
            assert_eq!(cgroup_file(&dir, "pids.max"), pids);
            assert_eq!(cgroup_file(&dir, "cpu.max"), "100000 100000");
        }
    }
}

/// A field of `/proc/meminfo`, MiB.
fn meminfo_mib(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in /proc/meminfo"));
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024
}

/// Memory limits are caps, not reservations: three sandboxes whose limits (two fifths of the
/// host's RAM each) add up to more than the host has available all start, because each uses
/// a few MiB (the daemon used to reserve every limit whole and refused the third). The limits
/// still bound the worst case: with `BELLJAR_MEMORY_OVERCOMMIT=1.5` a fourth would bring them
/// to 1.6 × RAM and is refused with `insufficient_resources`, saying why.
#[test]
fn memory_limits_are_caps_admitted_by_use_up_to_the_overcommit() {
    let total = meminfo_mib("MemTotal");
    let limit = total * 2 / 5;
    assert!(
        3 * limit > meminfo_mib("MemAvailable"),
        "the limits must not fit in MemAvailable, or this proves nothing"
    );
    let d = Daemon::start_with_env(&[("BELLJAR_MEMORY_OVERCOMMIT", "1.5")]);
    let c = d.unix();
    let big = CreateSandbox {
        memory_mib: Some(limit),
        ..CreateSandbox::default()
    };
    block_on(async {
        for _ in 0..3 {
            let s = d.create(&c, big.clone()).await;
            let usage = c.sandbox_usage(&s.id).await.unwrap();
            assert_eq!(usage.memory_limit_bytes, Some(limit << 20), "{usage:?}");
            let used = usage.memory_bytes.expect("memory is measured");
            assert!(used < (limit << 20) / 10, "{s:?} uses {used} bytes");
        }
        assert!(c.info().await.unwrap().free_memory_mib > 0);
        let fourth = CreateSandbox {
            backend: Some(BackendChoice::Namespace),
            ..big.clone()
        };
        let refused = c
            .create_sandbox(&fourth)
            .await
            .expect_err("a fourth passes the overcommit bound");
        assert_eq!(refused.code(), "insufficient_resources", "{refused}");
        let message = refused.to_string();
        let expected = format!(
            "{limit} MiB requested, {} MiB already given as limits to live sandboxes",
            3 * limit
        );
        assert!(message.contains(&expected), "{message}");
        assert!(
            message.contains(&format!("1.5 × {total} MiB of host RAM")),
            "{message}"
        );
        // Within the bound a small one still starts.
        d.create(&c, CreateSandbox::default()).await;
    });
}
