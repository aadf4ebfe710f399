//! Rootless: an ordinary user (here an unused uid, switched to with `setpriv`) launches,
//! uses, stops and destroys a sandbox through the `belljar-ns` tool. Without subordinate ids
//! only root exists inside (the user's own uid); cgroup v1 is not writable, so limits are
//! reported as not enforced, with the reason.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use belljar_namespace::{LimitStatus, Running, testing};

const UID: u32 = 4242;

fn as_user(args: &[&str], tool: &Path) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
        ])
        .arg(tool)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("setpriv (util-linux)")
}

fn ok(out: Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn an_ordinary_user_runs_a_sandbox() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "this test switches to uid {UID}"
    );
    let (rootfs, agent) = testing::fixtures().unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("bjrl")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A rootless image tree belongs to the user (as a rootless image build makes it).
    let image = tmp.path().join("image");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&rootfs)
        .arg(&image)
        .status()
        .unwrap();
    assert!(cp.success());
    let chown = Command::new("chown")
        .args(["-R", &format!("{UID}:{UID}")])
        .arg(&image)
        .status();
    assert!(chown.unwrap().success());
    let tool = tmp.path().join("belljar-ns");
    std::fs::copy(env!("CARGO_BIN_EXE_belljar-ns"), &tool).unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(UID), Some(UID)).unwrap();
    let state = home.join("sb");
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    let probe: belljar_namespace::Probe =
        serde_json::from_str(&ok(as_user(&["probe"], &tool))).unwrap();
    assert!(probe.available && probe.rootless, "{probe:?}");
    let launch = [
        "launch",
        "rootless",
        &s(&image),
        &s(&state),
        &s(&agent),
        "--memory",
        "100000000",
    ];
    let running: Running = serde_json::from_str(&ok(as_user(&launch, &tool))).unwrap();
    assert_eq!(running.root_uid, UID);
    let LimitStatus::NotEnforced { reason } = &running.limits.memory else {
        panic!("{:?}", running.limits)
    };
    assert!(reason.contains("Permission denied"), "{reason}");
    belljar_namespace::wait_ready(&running.socket, std::time::Duration::from_secs(20)).unwrap();
    let out = ok(as_user(
        &[
            "sh",
            &s(&state),
            "id -u; cat /proc/self/uid_map; echo hi > /workspace/new; cat /workspace/new; ls /sys/class/net",
        ],
        &tool,
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0");
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["0", &UID.to_string(), "1"]
    );
    assert_eq!(&lines[2..], ["hi", "lo"]);
    let upper = std::fs::metadata(state.join("fs/upper/workspace/new")).unwrap();
    assert_eq!(upper.uid(), UID);
    ok(as_user(&["stop", &s(&state)], &tool));
    assert!(belljar_namespace::adopt(&state).unwrap().is_none());
    ok(as_user(&["destroy", &s(&state)], &tool));
    assert!(!state.exists());
}
