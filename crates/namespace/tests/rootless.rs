//! Rootless: an ordinary user (here an unused uid, switched to with `setpriv`) launches,
//! uses, stops and destroys a sandbox through the `belljar-ns` tool. The user's `/etc/passwd`,
//! `/etc/subuid` and `/etc/subgid` entries exist only in a private mount namespace of the test
//! (bind mounts over the host's files), so the host's files are never changed. With subordinate
//! ids the sandbox has its root (the user) and its `belljar` user (uid 1000, a subordinate id);
//! without them the launch fails and says which command adds them. cgroup v1 is not writable by
//! the user, so limits are reported as not enforced, with the reason.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use belljar_namespace::{LimitStatus, Running, testing};

const UID: u32 = 4242;
const SUBID: u32 = 3_000_000;

/// Runs `tool args` as `UID` in a private mount namespace whose `/etc/passwd` knows the user
/// (newuidmap needs a name) and, with `subids`, whose `/etc/subuid`+`/etc/subgid` give it
/// 65536 ids from `SUBID`.
fn as_user(etc: &Path, subids: bool, args: &[&str], tool: &Path) -> Output {
    let binds = if subids {
        "passwd group subuid subgid"
    } else {
        "passwd group"
    };
    let script = format!(
        "set -e; for f in {binds}; do mount --bind {etc}/$f /etc/$f; done; \
         exec setpriv --reuid={UID} --regid={UID} --clear-groups \"$@\"",
        etc = etc.display()
    );
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .arg(tool)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("unshare, setpriv (util-linux)")
}

/// `passwd`, `group`, `subuid`, `subgid` for the test user, beside copies of the host's.
fn user_etc(dir: &Path) {
    let add = |file: &str, line: String| {
        let mut text = std::fs::read_to_string(Path::new("/etc").join(file)).unwrap_or_default();
        text.push_str(&line);
        std::fs::write(dir.join(file), text).unwrap();
    };
    add(
        "passwd",
        format!("bjtest:x:{UID}:{UID}::/nonexistent:/bin/sh\n"),
    );
    add("group", format!("bjtest:x:{UID}:\n"));
    std::fs::write(dir.join("subuid"), format!("bjtest:{SUBID}:65536\n")).unwrap();
    std::fs::write(dir.join("subgid"), format!("bjtest:{SUBID}:65536\n")).unwrap();
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
    let etc = tmp.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    user_etc(&etc);
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(UID), Some(UID)).unwrap();
    let state = home.join("sb");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let launch = [
        "launch",
        "rootless",
        &s(&image),
        &s(&state),
        &s(&agent),
        "--memory",
        "100000000",
    ];

    // Without subordinate ids: refused, with the command that adds them.
    let out = as_user(&etc, false, &launch, &tool);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // The range after every one the host has given (100000-165535 on a host with none).
    let first = belljar_namespace::idmap::next_free_subid(Path::new("/etc"));
    let fix = belljar_namespace::idmap::add_subids_args(first, "bjtest");
    assert!(err.contains(&format!("sudo usermod {fix}")), "{err}");
    let probe: belljar_namespace::Probe =
        serde_json::from_str(&ok(as_user(&etc, false, &["probe"], &tool))).unwrap();
    assert!(
        !probe.available && probe.reason.contains("usermod"),
        "{probe:?}"
    );

    let probe: belljar_namespace::Probe =
        serde_json::from_str(&ok(as_user(&etc, true, &["probe"], &tool))).unwrap();
    assert!(probe.available && probe.rootless, "{probe:?}");
    let running: Running = serde_json::from_str(&ok(as_user(&etc, true, &launch, &tool))).unwrap();
    assert_eq!(running.root_uid, UID);
    let LimitStatus::NotEnforced { reason } = &running.limits.memory else {
        panic!("{:?}", running.limits)
    };
    assert!(reason.contains("Permission denied"), "{reason}");
    belljar_namespace::wait_ready(&running.socket, std::time::Duration::from_secs(20)).unwrap();
    let out = ok(as_user(
        &etc,
        true,
        &[
            "sh",
            &s(&state),
            "id -u; cat /proc/self/uid_map; echo hi > /workspace/new; cat /workspace/new; \
             mkdir /workspace/b; chown 1000:1000 /workspace/b; ls /sys/class/net",
        ],
        &tool,
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0");
    let map: Vec<Vec<&str>> = lines[1..3]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(map[0], ["0", &UID.to_string(), "1"]);
    assert_eq!(map[1], ["1", &SUBID.to_string(), "65535"]);
    assert_eq!(lines[3], "hi");
    // `lo`, and the tap the sandbox's network comes through when the host offers one.
    assert!(lines[4..].contains(&"lo"), "{lines:?}");
    let upper = std::fs::metadata(state.join("fs/upper/workspace/new")).unwrap();
    assert_eq!(upper.uid(), UID);
    // The sandbox's uid 1000 is the subordinate id SUBID + 999 on the host.
    let b = std::fs::metadata(state.join("fs/upper/workspace/b")).unwrap();
    assert_eq!((b.uid(), b.gid()), (SUBID + 999, SUBID + 999));
    ok(as_user(&etc, true, &["stop", &s(&state)], &tool));
    assert!(belljar_namespace::adopt(&state).unwrap().is_none());
    // Files of subordinate ids are deleted from inside a namespace with the same mapping.
    ok(as_user(&etc, true, &["destroy", &s(&state)], &tool));
    assert!(!state.exists());
}

/// A root-built image (root-owned tree beside its ext4 disk) becomes a copy owned by the
/// sandbox's ids: inside, `/home/belljar` belongs to uid 1000 and root may change `/etc`.
#[test]
fn a_root_built_image_is_unpacked_for_the_user() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "this test switches to uid {UID}"
    );
    let (rootfs, agent) = testing::fixtures().unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("bjrt")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = tmp.path().join("image");
    std::fs::create_dir(&image).unwrap();
    let tree = image.join("rootfs");
    assert!(
        Command::new("cp")
            .arg("-a")
            .arg(&rootfs)
            .arg(&tree)
            .status()
            .unwrap()
            .success()
    );
    std::fs::create_dir_all(tree.join("home/belljar")).unwrap();
    std::os::unix::fs::chown(tree.join("home/belljar"), Some(1000), Some(1000)).unwrap();
    std::fs::write(tree.join("etc/motd"), "root's\n").unwrap();
    std::fs::set_permissions(
        tree.join("etc/motd"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let made = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(image.join("rootfs.ext4"))
        .arg("64M")
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::set_permissions(
        image.join("rootfs.ext4"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let tool = tmp.path().join("belljar-ns");
    std::fs::copy(env!("CARGO_BIN_EXE_belljar-ns"), &tool).unwrap();
    let etc = tmp.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    user_etc(&etc);
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(UID), Some(UID)).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let cache = home.join("cache");
    let copy = ok(as_user(
        &etc,
        true,
        &["user-tree", &s(&image), &s(&cache)],
        &tool,
    ));
    let copy = Path::new(copy.trim());
    assert!(copy.starts_with(&cache), "{}", copy.display());
    assert_eq!(std::fs::metadata(copy).unwrap().uid(), UID);
    let motd = std::fs::metadata(copy.join("etc/motd")).unwrap();
    assert_eq!((motd.uid(), motd.mode() & 0o777), (UID, 0o600));
    // Made once: a second call answers the same directory at once.
    let again = ok(as_user(
        &etc,
        true,
        &["user-tree", &s(&image), &s(&cache)],
        &tool,
    ));
    assert_eq!(Path::new(again.trim()), copy);

    let state = home.join("sb");
    let launch = ["launch", "unpacked", &s(copy), &s(&state), &s(&agent)];
    let running: Running = serde_json::from_str(&ok(as_user(&etc, true, &launch, &tool))).unwrap();
    belljar_namespace::wait_ready(&running.socket, std::time::Duration::from_secs(20)).unwrap();
    let out = ok(as_user(
        &etc,
        true,
        &[
            "sh",
            &s(&state),
            "stat -c %u:%g /home/belljar; cat /etc/motd; echo changed > /etc/motd; cat /etc/motd",
        ],
        &tool,
    ));
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["1000:1000", "root's", "changed"]
    );
    ok(as_user(&etc, true, &["destroy", &s(&state)], &tool));
    assert!(!state.exists());
    let _ = Command::new("rm").arg("-rf").arg(&cache).status();
}
