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

/// A daemon and a sandbox on a sized disk of `mib`; `None` when not root (the namespace
/// backend cannot mount one then), which CI never is.
async fn with_sized_disk(mib: u64) -> Option<(Daemon, Sandbox)> {
    if !nix::unistd::Uid::effective().is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("not root: the namespace backend cannot mount a sized disk");
        return None;
    }
    let d = Daemon::start();
    let s = d
        .create(
            &d.unix(),
            CreateSandbox {
                disk_mib: Some(mib),
                ..Default::default()
            },
        )
        .await;
    Some((d, s))
}

/// `disk_mib` holds on the namespace backend: writes past it fail inside with ENOSPC, `df`
/// shows the sandbox's size, the host's disk takes no more than that, and the limit is
/// reported as enforced.
#[tokio::test(flavor = "multi_thread")]
async fn the_disk_limit_holds() {
    let Some((d, s)) = with_sized_disk(64).await else {
        return;
    };
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

/// The layer under sandboxes started from `from`, found by a file it holds.
fn layer_holding(d: &Daemon, rel: &str) -> std::path::PathBuf {
    let layers = d.paths.data.join("layers");
    std::fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .map(|e| e.path().join(rel))
        .find(|p| p.symlink_metadata().is_ok())
        .unwrap_or_else(|| panic!("no layer in {} holds {rel}", layers.display()))
}

/// A 6 GiB sparse file in a 512 MiB sandbox is snapshotted as the 4 KiB it holds (it once
/// wrote 6.1 GiB to the host and kept the sandbox frozen for minutes), and a sandbox made from
/// the snapshot sees the same file: its size, its data where it was, zeros elsewhere.
#[tokio::test(flavor = "multi_thread")]
async fn a_sparse_file_cannot_fill_the_host_disk_through_a_snapshot() {
    use std::os::unix::fs::MetadataExt;
    let Some((d, s)) = with_sized_disk(512).await else {
        return;
    };
    let c = d.unix();
    belljar_e2e::sh_ok(
        &c,
        &s.id,
        "set -e; truncate -s 6G /workspace/sparse; \
         printf middle | dd of=/workspace/sparse bs=1 seek=3221225472 conv=notrunc 2>/dev/null",
    )
    .await;
    let snap = c
        .snapshot_sandbox(
            &s.id,
            &belljar_api::CreateSnapshot {
                keep_running: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(snap.size_bytes <= 1 << 20, "{snap:?}");
    let copy = std::fs::metadata(layer_holding(&d, "workspace/sparse")).unwrap();
    assert_eq!(copy.len(), 6 << 30);
    assert!(
        copy.blocks() * 512 <= 1 << 20,
        "the layer's copy takes {} bytes of the host's disk",
        copy.blocks() * 512
    );
    let from = d
        .create(
            &c,
            CreateSandbox {
                source: Some(belljar_api::Source::Snapshot {
                    snapshot_id: snap.id.clone(),
                }),
                ..Default::default()
            },
        )
        .await;
    let seen = belljar_e2e::sh_ok(
        &c,
        &from.id,
        "stat -c %s /workspace/sparse; \
         dd if=/workspace/sparse bs=1 skip=3221225470 count=10 2>/dev/null | od -An -c",
    )
    .await;
    let mut lines = seen.lines();
    assert_eq!(lines.next().map(str::trim), Some("6442450944"), "{seen}");
    let bytes: String = lines.collect::<Vec<_>>().join(" ");
    let bytes: Vec<&str> = bytes.split_whitespace().collect();
    assert_eq!(
        bytes,
        ["\\0", "\\0", "m", "i", "d", "d", "l", "e", "\\0", "\\0"],
        "{seen}"
    );
}

/// A directory snapshot reads with the sandbox's rights: a file the sandbox's root cannot read
/// (the host's, as a bind mount or `/sys` shows them) makes it fail with `permission_denied`
/// instead of handing the file to whoever mounts the snapshot; `/proc`, `/sys` and `/dev`, and
/// links into them, are refused with `invalid_path` before anything is read.
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_snapshot_reads_nothing_the_sandbox_cannot() {
    use belljar_api::{CreateSnapshot, ErrorCode};
    use belljar_client::ClientError;
    if !nix::unistd::Uid::effective().is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("not root: no sandbox id block to read outside of");
        return;
    }
    let d = Daemon::start();
    let c = d.unix();
    let s: Sandbox = d.create(&c, CreateSandbox::default()).await;
    belljar_e2e::sh_ok(
        &c,
        &s.id,
        "set -e; mkdir -p /workspace/probe /workspace/fine; echo mine > /workspace/fine/mine; \
         ln -s /sys/kernel /workspace/kernel",
    )
    .await;
    // A file of the host's root, as the sandbox sees one it did not make: through its
    // writable layer, owned by an id outside its block.
    let upper = d
        .paths
        .data
        .join("sandboxes")
        .join(&s.id)
        .join("namespace/fs/upper/workspace/probe");
    let secret = upper.join("secret");
    std::fs::write(&secret, b"host only").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (code, out) = belljar_e2e::sh(&c, &s.id, "cat /workspace/probe/secret").await;
    assert_ne!(code, 0, "the sandbox's root reads the host's file: {out}");

    let dir = |path: &str| CreateSnapshot {
        keep_running: Some(true),
        path: Some(path.into()),
        ..Default::default()
    };
    let refused = |r: Result<belljar_api::Snapshot, ClientError>| match r {
        Err(ClientError::Api { code, message, .. }) => (code, message),
        other => panic!("not refused: {other:?}"),
    };
    let (code, message) = refused(c.snapshot_sandbox(&s.id, &dir("/workspace/probe")).await);
    assert_eq!(code, ErrorCode::PermissionDenied, "{message}");
    assert!(message.contains("/workspace/probe/secret"), "{message}");
    for path in [
        "/sys/firmware/acpi/tables",
        "/proc",
        "/dev",
        "/workspace/kernel",
    ] {
        let (code, message) = refused(c.snapshot_sandbox(&s.id, &dir(path)).await);
        assert_eq!(code, ErrorCode::InvalidPath, "{path}: {message}");
    }
    // What the sandbox may read is still captured, and the sandbox runs on.
    let ok = c
        .snapshot_sandbox(&s.id, &dir("/workspace/fine"))
        .await
        .unwrap();
    assert_eq!(ok.path.as_deref(), Some("/workspace/fine"));
    belljar_e2e::sh_ok(&c, &s.id, "true").await;
}
