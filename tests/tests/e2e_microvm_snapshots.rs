//! Snapshots on the `microvm` backend end to end (live, directory, stopping, fork, persistence,
//! snapshot mounts), as `e2e_microvm` runs sandboxes: ignored by default,
//! `scripts/test-microvm.sh` runs them where KVM works (nested in L1 here).

use std::time::Instant;

use belljar_api::{CreateSandbox, CreateSnapshot, SandboxStatus, Source};
use belljar_e2e::microvm::{console, create_vm, small, vm_state};
use belljar_e2e::{Daemon, sh, sh_ok, snapshots};
use belljar_vmm_api::control::VmState;

/// The files a snapshot must carry: a new file, a mode, a deletion of an image file (a
/// whiteout) and a directory of the image replaced (an opaque directory).
const CHANGES: &str = "mkdir -p /workspace/d && echo kept > /workspace/d/kept.txt && \
    printf '#!/bin/sh\\necho ran\\n' > /workspace/run.sh && chmod 0751 /workspace/run.sh && \
    rm /etc/issue && rm -rf /etc/apt && mkdir /etc/apt && echo new > /etc/apt/only.txt";
const CHECK: &str = "cat /workspace/d/kept.txt; stat -c %a /workspace/run.sh; /workspace/run.sh; \
    test -e /etc/issue && echo issue-back; ls -A /etc/apt";
const CHECKED: &str = "kept\n751\nran\nonly.txt\n";

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn a_live_snapshot_starts_a_microvm_with_its_files_and_mounts() {
    let d = Daemon::start_via_cli();
    let c = d.unix();
    belljar_e2e::block_on(async {
        let a = create_vm(&d, &c, small()).await;
        sh_ok(&c, &a.id, CHANGES).await;

        // A live snapshot: the VM is paused while its layer is copied, then runs on.
        let t = Instant::now();
        let snap = c
            .snapshot_sandbox(&a.id, &snapshots::live())
            .await
            .unwrap_or_else(|e| panic!("snapshot: {e}\nlog:\n{}", d.log()));
        let snapshot_took = t.elapsed();
        assert_eq!(
            snap.status,
            belljar_api::SnapshotStatus::Created,
            "{snap:?}"
        );
        assert!(snap.size_bytes > 0, "{snap:?}");
        assert_eq!(
            c.sandbox(&a.id).await.unwrap().status,
            SandboxStatus::Running
        );
        assert_eq!(vm_state(&d, &a.id), VmState::Running);
        let source = Some(Source::Snapshot {
            snapshot_id: snap.id.clone(),
        });
        // A directory snapshot: the guest's view of one directory (image, layers and its
        // writes put together on the host while the VM is paused).
        let t = Instant::now();
        let dir = c
            .snapshot_sandbox(&a.id, &snapshots::of_directory("/workspace/d"))
            .await
            .unwrap_or_else(|e| panic!("directory snapshot: {e}\nlog:\n{}", d.log()));
        let dir_took = t.elapsed();
        assert_eq!(vm_state(&d, &a.id), VmState::Running);

        // A microVM from the live snapshot sees the same files, and mounts the directory
        // snapshot copy-on-write where it was asked to.
        let t = Instant::now();
        let b = create_vm(
            &d,
            &c,
            CreateSandbox {
                source: source.clone(),
                mounts: Some(vec![snapshots::mount(&dir.id, "/data/d")]),
                persistent: Some(true),
                ..small()
            },
        )
        .await;
        let (code, out) = sh(&c, &b.id, CHECK).await;
        let from_took = t.elapsed();
        assert_eq!(
            (code, out.as_str()),
            (0, CHECKED),
            "console:\n{}",
            console(&d, &b.id)
        );
        let (code, out) = sh(
            &c,
            &b.id,
            "cat /data/d/kept.txt && echo w > /data/d/w && cat /data/d/w && \
             grep -c ' /data/d overlay ' /proc/mounts",
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "kept\nw\n1\n"),
            "console:\n{}",
            console(&d, &b.id)
        );
        // The source never saw the mount's write.
        let (_, out) = sh(&c, &a.id, "ls /workspace/d").await;
        assert_eq!(out, "kept.txt\n");

        // A fork of a microVM that mounts a snapshot mounts it as its source sees it: the
        // mount's writes are captured (the source paused) on top of the mounted snapshot.
        let t = Instant::now();
        let f = c
            .fork_sandbox(&b.id, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("fork: {e}\nlog:\n{}", d.log()));
        let script = "cat /data/d/kept.txt /data/d/w && echo f > /data/d/f";
        let (code, out) = sh(&c, &f.id, script).await;
        let fork_took = t.elapsed();
        assert_eq!(
            (code, out.as_str()),
            (0, "kept\nw\n"),
            "console:\n{}",
            console(&d, &f.id)
        );
        let (_, out) = sh(&c, &b.id, "ls /data/d").await;
        assert_eq!(out, "kept.txt\nw\n", "the fork's write reached its source");
        c.delete_sandbox(&f.id).await.unwrap();

        // A persistent microVM keeps its writes under the mount across a stop and a start.
        sh_ok(&c, &b.id, "echo session > /data/d/session").await;
        let t = Instant::now();
        c.stop_sandbox(&b.id).await.unwrap();
        let stop_took = t.elapsed();
        c.start_sandbox(&b.id)
            .await
            .unwrap_or_else(|e| panic!("start: {e}\nlog:\n{}", d.log()));
        let (code, out) = sh(&c, &b.id, "cat /data/d/kept.txt /data/d/w /data/d/session").await;
        assert_eq!(
            (code, out.as_str()),
            (0, "kept\nw\nsession\n"),
            "console:\n{}\nlog:\n{}",
            console(&d, &b.id),
            d.log()
        );
        let mounts = c.sandbox_mounts(&b.id).await.unwrap().mounts;
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(mounts[0].path, "/data/d");
        assert_ne!(
            mounts[0].snapshot_id, dir.id,
            "the mount moved onto its writes"
        );
        // Not here: a namespace sandbox from it (L1 shares the image over 9p, which has no
        // idmapped mounts); the stopping snapshot and a fork without mounts are in the next test.
        eprintln!(
            "microvm: live snapshot {snapshot_took:?} (frozen {:?} ms), directory snapshot {dir_took:?} (frozen {:?} ms), create from them to the first command {from_took:?}, fork of it with its mount to the first command {fork_took:?}, persistent stop with a mount {stop_took:?}",
            snap.frozen_ms, dir.frozen_ms
        );
    });
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn fork_stopping_snapshot_and_persistence_on_microvm() {
    let d = Daemon::start_via_cli();
    let c = d.unix();
    belljar_e2e::block_on(async {
        let a = create_vm(
            &d,
            &c,
            CreateSandbox {
                persistent: Some(true),
                name: Some("keeper".into()),
                ..small()
            },
        )
        .await;
        sh_ok(&c, &a.id, CHANGES).await;

        // A fork: a new microVM with the source's files while the source runs on.
        let t = Instant::now();
        let b = c
            .fork_sandbox(&a.id, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("fork: {e}\nlog:\n{}", d.log()));
        let (code, out) = sh(&c, &b.id, CHECK).await;
        let fork_took = t.elapsed();
        assert_eq!(
            (code, out.as_str()),
            (0, CHECKED),
            "console:\n{}",
            console(&d, &b.id)
        );
        assert_eq!(b.backend, belljar_api::Backend::Microvm, "{b:?}");
        assert_eq!(vm_state(&d, &a.id), VmState::Running);

        // A stopping snapshot (the default): the fork stops, its writable layer becomes the
        // snapshot, and the snapshot holds what the fork changed on top of the source's.
        sh_ok(&c, &b.id, "echo forked > /workspace/forked.txt").await;
        let t = Instant::now();
        let snap = c
            .snapshot_sandbox(&b.id, &CreateSnapshot::default())
            .await
            .unwrap_or_else(|e| panic!("snapshot: {e}\nlog:\n{}", d.log()));
        let stop_snapshot_took = t.elapsed();
        assert_eq!(
            snap.status,
            belljar_api::SnapshotStatus::Created,
            "{snap:?}"
        );
        assert_eq!(
            c.sandbox(&b.id).await.unwrap().status,
            SandboxStatus::Stopped
        );
        let diff = c.snapshot_diff(&snap.id, None).await.unwrap();
        let forked = diff
            .changes
            .iter()
            .find(|ch| ch.path == "/workspace/forked.txt")
            .unwrap_or_else(|| panic!("forked.txt not in the snapshot: {diff:?}"));
        assert_eq!(forked.new.as_ref().map(|e| e.size_bytes), Some(7));

        // Persistence: stopping snapshots the source, starting resumes it with the same id,
        // name and files.
        sh_ok(&c, &a.id, "echo before-stop > /workspace/session.txt").await;

        // A diff against the running source: its layer is captured (frozen meanwhile), and the
        // fork's snapshot differs from it by the fork's file and the source's new one.
        let t = Instant::now();
        let diff = c
            .snapshot_diff(&snap.id, Some(&a.id))
            .await
            .unwrap_or_else(|e| panic!("diff: {e}\nlog:\n{}", d.log()));
        let diff_took = t.elapsed();
        let seen: Vec<(&str, belljar_api::ChangeKind)> = diff
            .changes
            .iter()
            .filter(|ch| ch.path.starts_with("/workspace/"))
            .map(|ch| (ch.path.as_str(), ch.change))
            .collect();
        assert_eq!(
            seen,
            [
                ("/workspace/forked.txt", belljar_api::ChangeKind::Deleted),
                ("/workspace/session.txt", belljar_api::ChangeKind::Added),
            ],
            "{diff:?}"
        );
        assert_eq!(vm_state(&d, &a.id), VmState::Running);
        let t = Instant::now();
        let stopped = c.stop_sandbox(&a.id).await.unwrap();
        let stop_took = t.elapsed();
        assert_eq!(stopped.status, SandboxStatus::Stopped);
        let t = Instant::now();
        let again = c
            .start_sandbox(&a.id)
            .await
            .unwrap_or_else(|e| panic!("start: {e}\nlog:\n{}", d.log()));
        let (code, out) = sh(&c, &a.id, &format!("{CHECK}; cat /workspace/session.txt")).await;
        let start_took = t.elapsed();
        assert_eq!(
            (again.id.as_str(), again.name.as_deref()),
            (a.id.as_str(), Some("keeper"))
        );
        assert_eq!(again.status, SandboxStatus::Running);
        assert_eq!(
            (code, out),
            (0, format!("{CHECKED}before-stop\n")),
            "console:\n{}",
            console(&d, &a.id)
        );
        eprintln!(
            "microvm: fork to the first command {fork_took:?}, stopping snapshot \
             {stop_snapshot_took:?}, diff against the running source {diff_took:?}, persistent \
             stop {stop_took:?}, start to the first command {start_took:?}"
        );
    });
}
