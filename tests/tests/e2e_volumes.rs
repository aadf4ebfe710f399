//! Host folders and named volumes in namespace sandboxes, through a real daemon run as root:
//! two-way and live, owned by the folder's owner on the host and by the sandbox's user
//! inside, `:ro` enforced by the kernel, the escapes a mount could open closed (symlinks,
//! `..`, hard links), who may mount what (the Unix peer's permissions, the TCP allow-roots,
//! folders nobody may mount), volumes shared, capped and kept, and mounts kept by forks,
//! left out of snapshots and kept across a daemon `kill -9`.
//!
//! Needs root (it makes a test account with `useradd`) and the `base` image.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use belljar_api::{
    BackendChoice, CreateSandbox, CreateSnapshot, CreateVolume, ErrorCode, ForkSandbox,
    SandboxStatus, VolumeMount,
};
use belljar_client::Client;
use belljar_e2e::{Daemon, run, sh, sh_ok, stderr, stdout};

/// Accounts of this test are named `bjvol<pid>`, so a run that was killed leaves one the next
/// run removes.
const PREFIX: &str = "bjvol";

/// A test account; dropping it removes it.
struct Account {
    name: String,
    uid: u32,
    gid: u32,
}

impl Account {
    fn create(tag: &str) -> Self {
        let name = format!("{PREFIX}{tag}{}", std::process::id());
        let _ = Command::new("userdel").arg(&name).output();
        let out = Command::new("useradd")
            .args(["-M", "-s", "/bin/sh", &name])
            .output()
            .expect("useradd");
        assert!(out.status.success(), "useradd: {}", stderr(&out));
        let id = |flag: &str| {
            let out = Command::new("id").args([flag, &name]).output().unwrap();
            stdout(&out).trim().parse::<u32>().unwrap()
        };
        let (uid, gid) = (id("-u"), id("-g"));
        Self { name, uid, gid }
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// A folder for mounting, outside the daemon's directories, searchable by everyone on the
/// way (tempdirs are 0700).
fn folder(parent: &tempfile::TempDir, name: &str, owner: Option<&Account>, mode: u32) -> PathBuf {
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = parent.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(a) = owner {
        std::os::unix::fs::chown(&dir, Some(a.uid), Some(a.gid)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

fn mount(source: &Path, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        source: source.display().to_string(),
        path: path.into(),
        read_only: read_only.then_some(true),
    }
}

fn volume(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        source: name.into(),
        path: path.into(),
        read_only: None,
    }
}

fn with(volumes: Vec<VolumeMount>) -> CreateSandbox {
    CreateSandbox {
        volumes: Some(volumes),
        ..Default::default()
    }
}

/// Runs `script` as the sandbox's user (not root).
async fn user_sh(c: &Client, id: &str, script: &str) -> (i32, String) {
    run(c, id, &["sh", "-c", script], false).await
}

async fn create_err(c: &Client, req: CreateSandbox) -> (ErrorCode, String) {
    let req = CreateSandbox {
        backend: req.backend.or(Some(BackendChoice::Namespace)),
        ..req
    };
    match c.create_sandbox(&req).await {
        Ok(s) => panic!("created {} though it should have been refused", s.id),
        Err(e) => (
            e.code().parse().unwrap_or(ErrorCode::Internal),
            e.to_string(),
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_folder_is_live_both_ways_owned_right_and_no_way_out() {
    let d = Daemon::start();
    let c = d.unix();
    let owner = Account::create("o");
    let tmp = tempfile::tempdir().unwrap();
    let work = folder(&tmp, "work", Some(&owner), 0o755);
    let docs = folder(&tmp, "docs", Some(&owner), 0o755);
    std::fs::write(work.join("from-host"), "hello from the host\n").unwrap();
    std::os::unix::fs::chown(work.join("from-host"), Some(owner.uid), Some(owner.gid)).unwrap();
    std::fs::write(docs.join("readme"), "read me\n").unwrap();
    std::os::unix::fs::symlink("/etc/shadow", work.join("shadow-link")).unwrap();
    let s = d
        .create(
            &c,
            with(vec![
                mount(&work, "/home/belljar/work", false),
                mount(&docs, "/docs", true),
            ]),
        )
        .await;
    let listed = c.sandbox(&s.id).await.unwrap().volumes.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].read_only, Some(true));

    // Host → sandbox, and the owner's file is the sandbox user's inside.
    let (code, out) = user_sh(
        &c,
        &s.id,
        "cat /home/belljar/work/from-host && stat -c %u:%g /home/belljar/work/from-host",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "hello from the host\n1000:1000\n");
    // Sandbox → host, at once, owned by the folder's owner.
    let (code, out) = user_sh(
        &c,
        &s.id,
        "echo from the sandbox > /home/belljar/work/new && mkdir /home/belljar/work/d",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::fs::read_to_string(work.join("new")).unwrap(),
        "from the sandbox\n"
    );
    for made in ["new", "d"] {
        let meta = std::fs::metadata(work.join(made)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (owner.uid, owner.gid), "{made}");
    }
    // A write on the host after the start is seen too.
    std::fs::write(work.join("later"), "later\n").unwrap();
    assert_eq!(
        sh_ok(&c, &s.id, "cat /home/belljar/work/later").await,
        "later\n"
    );

    // `:ro` is the kernel's, for root too.
    for sudo in [false, true] {
        let (code, out) = run(&c, &s.id, &["touch", "/docs/x"], sudo).await;
        assert_ne!(code, 0);
        assert!(out.contains("Read-only file system"), "{out}");
    }
    assert_eq!(sh_ok(&c, &s.id, "cat /docs/readme").await, "read me\n");
    assert!(!docs.join("x").exists());

    // A symlink in the folder resolves inside the sandbox: its own /etc/shadow.
    let inside = sh_ok(&c, &s.id, "md5sum < /home/belljar/work/shadow-link").await;
    let own = sh_ok(&c, &s.id, "md5sum < /etc/shadow").await;
    assert_eq!(inside, own);
    let host = Command::new("sh")
        .args(["-c", "md5sum < /etc/shadow"])
        .output()
        .unwrap();
    assert_ne!(
        inside,
        stdout(&host),
        "the link reached the host's /etc/shadow"
    );
    // `..` from the mount's root is the sandbox's directory.
    assert_eq!(
        sh_ok(&c, &s.id, "stat -c %i /home/belljar/work/.. /home/belljar").await,
        sh_ok(&c, &s.id, "stat -c %i /home/belljar /home/belljar").await
    );
    assert_eq!(
        sh_ok(
            &c,
            &s.id,
            "test -x /home/belljar/work/../../../sbin/belljar-agent && echo ours"
        )
        .await,
        "ours\n"
    );
    // No hard link across the mount's edge.
    let (code, out) = sh(&c, &s.id, "ln /etc/passwd /home/belljar/work/pw").await;
    assert_ne!(code, 0);
    assert!(out.contains("Invalid cross-device link"), "{out}");
    assert!(!work.join("pw").exists());
    // Nor a setuid program or a device through it.
    let (code, _) = sh(
        &c,
        &s.id,
        "mknod /home/belljar/work/null c 1 3 && echo x > /home/belljar/work/null",
    )
    .await;
    assert_ne!(code, 0);

    // Deleting the sandbox leaves the folder's files.
    c.delete_sandbox(&s.id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("new")).unwrap(),
        "from the sandbox\n"
    );
    assert!(work.join("from-host").exists() && work.join("d").is_dir());
}

#[tokio::test(flavor = "multi_thread")]
async fn only_what_the_caller_may_read_is_mounted() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = folder(&tmp, "allowed", None, 0o755);
    let d = Daemon::start_with_env(&[("BELLJAR_ALLOW_MOUNT_ROOTS", allowed.to_str().unwrap())]);
    let c = d.unix();
    let caller = Account::create("c");
    // Root's private folder: the account cannot read it; its own folder it can.
    let private = folder(&tmp, "private", None, 0o700);
    let its_own = folder(&tmp, "own", Some(&caller), 0o700);
    let readable = folder(&tmp, "readable", None, 0o755);

    // The account reaches the daemon's socket (the test opens it to it), and the daemon
    // checks the folder as the account (SO_PEERCRED).
    let mut dir = d.paths.socket();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o666)).unwrap();
    while dir.pop() && dir != Path::new("/") {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o711)).unwrap();
    }
    let as_caller = |volume: &Path, extra: &str| {
        let v = format!("{}:/w{extra}", volume.display());
        Command::new("setpriv")
            .args([
                &format!("--reuid={}", caller.uid),
                &format!("--regid={}", caller.gid),
                "--init-groups",
            ])
            .arg(belljar_e2e::binary("belljar"))
            .args(["create", "--backend", "namespace", "-v", &v])
            .env_clear()
            .env("BELLJAR_HOME", d.home.path())
            .env("BELLJAR_PORT", "0")
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/")
            .output()
            .expect("setpriv")
    };
    let out = as_caller(&private, "");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("mount_denied"), "{}", stderr(&out));
    let out = as_caller(&readable, "");
    assert!(
        !out.status.success(),
        "rw mount of a folder it cannot write"
    );
    assert!(stderr(&out).contains("mount_denied"), "{}", stderr(&out));
    let out = as_caller(&readable, ":ro");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_caller(&its_own, "");
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_owned();
    assert_eq!(
        c.sandbox(&id).await.unwrap().volumes.unwrap()[0].source,
        its_own.display().to_string()
    );

    // Over TCP only under an allowed root, whatever root could read.
    let http = d.http();
    let (code, msg) = create_err(&http, with(vec![mount(&readable, "/w", true)])).await;
    assert_eq!(code, ErrorCode::MountDenied, "{msg}");
    let s = d
        .create(&http, with(vec![mount(&allowed, "/w", false)]))
        .await;
    assert_eq!(s.status, SandboxStatus::Running);
    let (code, msg) = create_err(
        &http,
        with(vec![mount(
            &tmp.path().join("allowed/../private"),
            "/w",
            true,
        )]),
    )
    .await;
    assert!(
        matches!(code, ErrorCode::MountDenied | ErrorCode::BadRequest),
        "{code:?} {msg}"
    );

    // Folders nobody may mount, even root over the socket.
    for nobody in ["/", "/proc", "/sys/kernel", "/dev"] {
        let (code, msg) = create_err(&c, with(vec![mount(Path::new(nobody), "/w", true)])).await;
        assert_eq!(code, ErrorCode::MountDenied, "{nobody}: {msg}");
    }
    let (code, msg) = create_err(&c, with(vec![mount(d.home.path(), "/w", true)])).await;
    assert_eq!(code, ErrorCode::MountDenied, "{msg}");
    let sandboxes = d.paths.data.join("sandboxes");
    let (code, msg) = create_err(&c, with(vec![mount(&sandboxes, "/w", true)])).await;
    assert_eq!(code, ErrorCode::MountDenied, "{msg}");
    // A path through a symlink is refused, not followed.
    std::os::unix::fs::symlink(&private, tmp.path().join("link")).unwrap();
    let (code, msg) = create_err(&c, with(vec![mount(&tmp.path().join("link"), "/w", true)])).await;
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    assert!(msg.contains("symlink"), "{msg}");
    // Bad paths inside.
    for bad in ["/", "relative", "/proc/x", "/a/../b"] {
        let (code, msg) = create_err(&c, with(vec![mount(&readable, bad, true)])).await;
        assert!(
            matches!(code, ErrorCode::InvalidPath | ErrorCode::BadRequest),
            "{bad}: {code:?} {msg}"
        );
    }
    // A microVM has no virtio-fs yet: refused, never silently dropped.
    let (code, msg) = create_err(
        &c,
        CreateSandbox {
            backend: Some(BackendChoice::Microvm),
            ..with(vec![mount(&readable, "/w", true)])
        },
    )
    .await;
    assert_eq!(code, ErrorCode::NotSupported, "{msg}");
    assert!(msg.contains("virtio-fs"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_is_shared_capped_and_outlives_its_sandboxes() {
    let d = Daemon::start();
    let c = d.unix();
    let shared = c
        .create_volume(&CreateVolume {
            name: "shared".into(),
            size_mib: None,
        })
        .await
        .unwrap();
    assert!(shared.used_by.is_empty());
    let dup = c
        .create_volume(&CreateVolume {
            name: "shared".into(),
            size_mib: None,
        })
        .await
        .unwrap_err();
    assert_eq!(dup.code(), "conflict");
    c.create_volume(&CreateVolume {
        name: "small".into(),
        size_mib: Some(16),
    })
    .await
    .unwrap();
    let (code, msg) = create_err(&c, with(vec![volume("missing", "/m")])).await;
    assert_eq!(code, ErrorCode::VolumeNotFound, "{msg}");

    let a = d
        .create(
            &c,
            with(vec![volume("shared", "/data"), volume("small", "/small")]),
        )
        .await;
    let b = d
        .create(&c, with(vec![volume("shared", "/srv/data")]))
        .await;
    let (code, out) = user_sh(&c, &a.id, "echo from a > /data/a && stat -c %u /data").await;
    assert_eq!((code, out.as_str()), (0, "1000\n"));
    assert_eq!(sh_ok(&c, &b.id, "cat /srv/data/a").await, "from a\n");
    let (code, _) = user_sh(&c, &b.id, "echo from b > /srv/data/b").await;
    assert_eq!(code, 0);
    assert_eq!(sh_ok(&c, &a.id, "cat /data/b").await, "from b\n");
    assert_eq!(
        c.volume("shared").await.unwrap().used_by,
        [a.id.clone(), b.id.clone()]
    );

    // The cap is the kernel's.
    let (code, out) = user_sh(
        &c,
        &a.id,
        "dd if=/dev/zero of=/small/fill bs=1M count=64 2>&1",
    )
    .await;
    assert_ne!(code, 0);
    assert!(out.contains("No space left on device"), "{out}");

    // In use: not removed.
    let err = c.delete_volume("shared").await.unwrap_err();
    assert_eq!(err.code(), "volume_in_use", "{err}");
    c.delete_sandbox(&a.id).await.unwrap();
    c.delete_sandbox(&b.id).await.unwrap();
    let listed = c.list_volumes().await.unwrap().volumes;
    let names: Vec<&str> = listed.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["shared", "small"]);
    assert!(listed.iter().all(|v| v.used_by.is_empty()));
    // Kept after both are gone, and the CLI lists and removes them.
    let later = d.create(&c, with(vec![volume("shared", "/again")])).await;
    assert_eq!(
        sh_ok(&c, &later.id, "cat /again/a /again/b").await,
        "from a\nfrom b\n"
    );
    c.delete_sandbox(&later.id).await.unwrap();
    let out = d.cli(["volumes", "ls"]);
    assert!(stdout(&out).contains("shared") && stdout(&out).contains("16 MiB"));
    let out = d.cli(["volumes", "rm", "shared", "small"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(c.list_volumes().await.unwrap().volumes.is_empty());
    assert_eq!(
        c.volume("shared").await.unwrap_err().code(),
        "volume_not_found"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_snapshots_and_restarts_keep_mounts_not_their_contents() {
    let d = Daemon::start();
    let c = d.unix();
    let owner = Account::create("f");
    let tmp = tempfile::tempdir().unwrap();
    let work = folder(&tmp, "work", Some(&owner), 0o755);
    // 8 MiB in the folder: a snapshot that copied it would be at least that large.
    belljar_e2e::random_file(&work.join("big"), 8 << 20);
    let s = d
        .create(
            &c,
            CreateSandbox {
                persistent: Some(true),
                ..with(vec![mount(&work, "/w", false)])
            },
        )
        .await;
    sh_ok(&c, &s.id, "echo own > /root/own-file").await;

    let snap = c
        .snapshot_sandbox(
            &s.id,
            &CreateSnapshot {
                keep_running: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(
        snap.size_bytes < 4 << 20,
        "the snapshot holds {} bytes: it copied the mount",
        snap.size_bytes
    );

    // A sandbox from the snapshot mounts the same folder (its definition, live), and has
    // its own files from the snapshot.
    let from_snap = d
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
    assert_eq!(from_snap.volumes, s.volumes);
    std::fs::write(work.join("after-snapshot"), "live\n").unwrap();
    assert_eq!(
        sh_ok(&c, &from_snap.id, "cat /w/after-snapshot /root/own-file").await,
        "live\nown\n"
    );
    c.delete_sandbox(&from_snap.id).await.unwrap();

    let fork = c
        .fork_sandbox(&s.id, &ForkSandbox::default())
        .await
        .unwrap();
    assert_eq!(fork.volumes, s.volumes);
    std::fs::write(work.join("after-fork"), "seen\n").unwrap();
    assert_eq!(sh_ok(&c, &fork.id, "cat /w/after-fork").await, "seen\n");
    assert_eq!(sh_ok(&c, &fork.id, "cat /root/own-file").await, "own\n");
    c.delete_sandbox(&fork.id).await.unwrap();

    // The daemon dies with the sandbox running: adopted, it still has its mount.
    d.kill9();
    d.restart();
    let c = d.unix();
    std::fs::write(work.join("after-restart"), "still\n").unwrap();
    assert_eq!(sh_ok(&c, &s.id, "cat /w/after-restart").await, "still\n");

    // A persistent sandbox gets its mounts back at its next start.
    c.stop_sandbox(&s.id).await.unwrap();
    let started = c.start_sandbox(&s.id).await.unwrap();
    assert_eq!(started.volumes, s.volumes);
    let (code, out) = user_sh(&c, &s.id, "cat /w/after-restart && echo back > /w/back").await;
    assert_eq!((code, out.as_str()), (0, "still\n"));
    assert_eq!(
        std::fs::metadata(work.join("back")).unwrap().uid(),
        owner.uid
    );
    assert!(work.join("big").exists());
}
