//! Deleting a sandbox answers once the sandbox is unreachable and finishes its teardown in
//! the background. These tests hold the daemon to what that promises: the teardown ends by
//! itself and leaves no process, cgroup, mount, loop device or file behind; and a daemon
//! killed before its teardown ran finishes it at its next start, with the same result.
//! Needs root and the `base` image, like every namespace e2e test.

use std::path::Path;
use std::time::Duration;

use belljar_api::{CreateSandbox, RunCommand};
use belljar_e2e::host::{Held, held, mounted_under};
use belljar_e2e::{Daemon, eventually, wait_gone};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Loop devices whose backing file is under `dir` (a deleted one reads "<path> (deleted)").
fn loops_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|f| f.starts_with(&prefix))
        .collect()
}

/// Everything of `h` still on the host, empty when the sandbox left nothing.
fn leftovers(h: &Held) -> Vec<String> {
    let mut left = Vec::new();
    if h.dir.exists() {
        left.push(format!("directory {}", h.dir.display()));
    }
    left.extend(
        h.cgroups
            .iter()
            .filter(|g| g.exists())
            .map(|g| format!("cgroup {}", g.display())),
    );
    left.extend(
        mounted_under(&h.dir)
            .into_iter()
            .map(|m| format!("mount {m}")),
    );
    left.extend(loops_under(&h.dir).into_iter().map(|l| format!("loop {l}")));
    left
}

/// A sandbox with a process of the user's running, and what it holds.
async fn busy_sandbox(d: &Daemon) -> (String, Held) {
    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;
    let cmd = c
        .run_command(
            &s.id,
            &RunCommand {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo x > /tmp/f; sleep 600".into(),
                ],
                // Without it the call answers when the command ends, in ten minutes.
                detached: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(cmd.id.starts_with("cmd_"));
    let h = held(d, &s.id);
    assert!(
        !belljar_cli::launcher::exited(h.pid),
        "sandbox {} not running (pid {}); log:\n{}",
        s.id,
        h.pid,
        d.log()
    );
    assert!(h.cgroups.iter().any(|g| g.is_dir()), "no cgroup found");
    assert!(!mounted_under(&h.dir).is_empty(), "no disk mounted");
    assert!(!loops_under(&h.dir).is_empty(), "no loop device");
    (s.id, h)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delete_tears_everything_down_in_the_background() {
    let d = Daemon::start();
    let c = d.unix();
    let (id, h) = busy_sandbox(&d).await;
    c.delete_sandbox(&id).await.unwrap();
    let gone = c.sandbox(&id).await.unwrap_err();
    assert_eq!(gone.code(), "not_found", "{gone}");
    assert!(
        wait_gone(h.pid, Duration::from_secs(10)),
        "PID 1 still runs"
    );
    eventually(
        Duration::from_secs(30),
        "the teardown to finish",
        || async { leftovers(&h).is_empty().then_some(()) },
    )
    .await;
    // The daemon goes on serving: a new sandbox with a fresh disk works.
    let (again, h2) = busy_sandbox(&d).await;
    c.delete_sandbox(&again).await.unwrap();
    eventually(Duration::from_secs(30), "the second teardown", || async {
        leftovers(&h2).is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_teardown_cut_by_a_crash_is_finished_at_the_next_start() {
    // This daemon answers deletes but never starts their teardowns.
    let mut d = Daemon::start_with_env(&[("BELLJAR_TEST_HOLD_TEARDOWN", "1")]);
    let c = d.unix();
    let (id, h) = busy_sandbox(&d).await;
    let (kept, kept_held) = busy_sandbox(&d).await;
    c.delete_sandbox(&id).await.unwrap();
    assert_eq!(c.sandbox(&id).await.unwrap_err().code(), "not_found");
    // Unreachable at once (its processes were killed), but its teardown has not run.
    assert!(
        wait_gone(h.pid, Duration::from_secs(10)),
        "PID 1 still runs"
    );
    assert!(h.dir.join("deleting").exists());
    assert!(
        !mounted_under(&h.dir).is_empty(),
        "the teardown ran; nothing to test"
    );

    d.kill9();
    d.restart_with_env(&[]);

    // The start finished the teardown before it served anything.
    assert_eq!(leftovers(&h), Vec::<String>::new(), "\n{}", d.log());
    let c = d.unix();
    assert_eq!(c.sandbox(&id).await.unwrap_err().code(), "not_found");
    // The sandbox that was not deleted is untouched and still runs commands.
    assert!(!kept_held.dir.join("deleting").exists());
    let s = c.sandbox(&kept).await.unwrap();
    assert!(!s.status.is_final(), "{:?}", s.status);
    let cmd = c
        .run_command(
            &kept,
            &RunCommand {
                argv: vec!["cat".into(), "/tmp/f".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        c.wait_command(&kept, &cmd.id).await.unwrap().exit_code,
        Some(0)
    );
    c.delete_sandbox(&kept).await.unwrap();
    eventually(
        Duration::from_secs(30),
        "the kept sandbox's teardown",
        || async { leftovers(&kept_held).is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_right_after_deletes_leaves_nothing_behind() {
    let d = Daemon::start();
    let c = d.unix();
    // One sandbox per way the daemon can end right after a delete answered: a clean stop
    // (which waits for the teardowns) and a `kill -9` in the middle of one.
    let (first, h1) = busy_sandbox(&d).await;
    c.delete_sandbox(&first).await.unwrap();
    let pid = d.pid();
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    assert!(
        wait_gone(pid, Duration::from_secs(60)),
        "belljard did not stop"
    );
    d.restart();
    assert_eq!(leftovers(&h1), Vec::<String>::new(), "\n{}", d.log());

    let c = d.unix();
    let (second, h2) = busy_sandbox(&d).await;
    c.delete_sandbox(&second).await.unwrap();
    d.kill9();
    d.restart();
    assert_eq!(leftovers(&h2), Vec::<String>::new(), "\n{}", d.log());
    let c = d.unix();
    assert_eq!(c.sandbox(&second).await.unwrap_err().code(), "not_found");
    let left = c.list_sandboxes(&Default::default()).await.unwrap();
    assert!(left.sandboxes.is_empty(), "{:?}", left.sandboxes);
}
