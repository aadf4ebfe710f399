//! A sandbox's guest attacks the host side: what the daemon opens, reads or decodes on behalf
//! of a sandbox must stay that sandbox's, and bounded, whatever the guest plants.

use belljar_api::{CreateSandbox, Sandbox};
use belljar_e2e::{Daemon, stderr, stdout};

fn hostname(d: &Daemon, id: &str) -> String {
    let out = d.cli(["exec", id, "--", "hostname"]);
    assert!(out.status.success(), "{}\nlog:\n{}", stderr(&out), d.log());
    stdout(&out).trim().to_owned()
}

/// The guest of A replaces everything it can reach under `/run/belljar` with links to B's
/// agent socket (in the layout of this and of earlier versions) and to the daemon's own
/// socket; after a daemon restart, commands and files "in A" must still be A's.
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_redirect_the_daemon_to_another_sandbox() {
    let d = Daemon::start();
    let c = d.unix();
    let a: Sandbox = d.create(&c, CreateSandbox::default()).await;
    let b: Sandbox = d.create(&c, CreateSandbox::default()).await;
    let own = |s: &Sandbox| s.id.replace('_', "-");
    assert_eq!(hostname(&d, &a.id), own(&a));
    assert_eq!(hostname(&d, &b.id), own(&b));

    let sandboxes = d.home.path().join("data/sandboxes");
    let b_dir = sandboxes.join(&b.id);
    let daemon_socket = d.home.path().join("run/belljard.sock");
    let plant = format!(
        "set -e; cd /run/belljar; \
         ln -sfn {b_old} agent.sock.new && mv -f agent.sock.new agent.sock; \
         ln -sfn {b_new} agent.sock.b; ln -sfn {daemon} belljard.sock; ls -l /run/belljar",
        b_old = b_dir.join("ns/run/agent.sock").display(),
        b_new = b_dir.join("namespace/agent.sock").display(),
        daemon = daemon_socket.display(),
    );
    let out = d.cli(["exec", &a.id, "--sudo", "--", "sh", "-c", &plant]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A restart drops every cached connection: the daemon must find A's agent afresh.
    d.kill9();
    d.restart();
    assert_eq!(hostname(&d, &a.id), own(&a), "log:\n{}", d.log());
    let out = d.cli([
        "exec",
        &a.id,
        "--",
        "sh",
        "-c",
        "echo mine > /workspace/whose.txt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli(["exec", &b.id, "--", "ls", "/workspace"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("whose.txt"), "{}", stdout(&out));
    assert_eq!(hostname(&d, &b.id), own(&b));

    // Nothing of the state directory the daemon opens is reachable from inside: the sandbox
    // sees neither its socket nor its disk image.
    let out = d.cli([
        "exec",
        &a.id,
        "--sudo",
        "--",
        "sh",
        "-c",
        "find / -xdev \\( -name agent.sock -o -name disk.ext4 -o -name sandbox.json \\) -print 2>/dev/null; true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let found: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("/run/belljar/"))
        .collect();
    assert!(found.is_empty(), "{found:?}");
}

/// `disk_mib` holds on the namespace backend: writes past it fail inside with ENOSPC, `df`
/// shows the sandbox's size, the host's disk takes no more than that, and the limit is
/// reported as enforced.
#[tokio::test(flavor = "multi_thread")]
async fn the_disk_limit_holds() {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("not root: the namespace backend cannot mount a sized disk");
        return;
    }
    let d = Daemon::start();
    let c = d.unix();
    let s: Sandbox = d
        .create(
            &c,
            CreateSandbox {
                disk_mib: Some(64),
                ..Default::default()
            },
        )
        .await;
    assert!(s.limits.disk.enforced, "{:?}", s.limits);
    let out = d.cli([
        "exec",
        &s.id,
        "--",
        "sh",
        "-c",
        "df -m / | tail -n 1; dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1; echo rc=$?",
    ]);
    let text = stdout(&out);
    assert!(text.contains("No space left on device"), "{text}");
    assert!(!text.contains("rc=0"), "{text}");
    let size_mib: u64 = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("df: {text}"));
    assert!(
        (40..=64).contains(&size_mib),
        "df says {size_mib} MiB: {text}"
    );
    // The sandbox still works once its disk is full, and frees space again.
    let out = d.cli(["exec", &s.id, "--", "rm", "/workspace/big"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli([
        "exec",
        &s.id,
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/workspace/ok bs=1M count=8 2>/dev/null && echo written",
    ]);
    assert_eq!(stdout(&out).trim(), "written", "{}", stderr(&out));
}
