//! The idle timeout, the hard TTL and auto-resume on the namespace backend, through a real
//! daemon: an unused sandbox pauses by itself, a use of its processes resumes it (unless
//! `auto_resume` is off), a running command keeps it awake, and the hard TTL deletes a sandbox
//! whatever its state, also when the deadline passed while the daemon was down, and the idle
//! clock counts on from the last use across a `kill -9`. Short durations stand in for long
//! ones; the tests wait on the event stream, never on a sleep (one keeps the daemon down for a
//! while: the time passing is the scenario, not a wait).
//!
//! Needs root and the `base` image (as every e2e test).

use std::time::{Duration, Instant};

use belljar_api::{CreateSandbox, RunCommand, SandboxStatus};
use belljar_client::Client;
use belljar_e2e::events::{deleted, status_of, wait_event};
use belljar_e2e::{Daemon, stderr};

async fn run(c: &Client, id: &str, argv: &[&str]) -> Result<i32, belljar_client::ClientError> {
    let cmd = c
        .run_command(
            id,
            &RunCommand {
                argv: argv.iter().map(|a| a.to_string()).collect(),
                ..Default::default()
            },
        )
        .await?;
    Ok(c.wait_command(id, &cmd.id).await?.exit_code.unwrap_or(-1))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_sandbox_pauses_and_a_use_resumes_it() {
    let d = Daemon::start();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let idle_ms = 1_500;
    let a = d
        .create(
            &c,
            CreateSandbox {
                idle_timeout_ms: Some(idle_ms),
                ..Default::default()
            },
        )
        .await;
    assert!(a.lifecycle.auto_resume, "on by default");
    let created = Instant::now();
    let paused = wait_event(
        &mut events,
        30,
        "the idle pause",
        status_of(&a.id, SandboxStatus::Paused),
    )
    .await;
    assert!(created.elapsed() >= Duration::from_millis(idle_ms as u64 - 100));
    assert_eq!(paused.status_reason.as_deref(), Some("idle"));

    // A command resumes it (and runs), and the sandbox is running again.
    assert_eq!(run(&c, &a.id, &["true"]).await.unwrap(), 0);
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Running
    );
    // A running command keeps it awake past its idle timeout: the command outlives two of
    // them and the sandbox is still running when it ends.
    assert_eq!(run(&c, &a.id, &["sleep", "4"]).await.unwrap(), 0);
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Running
    );
    // Then it goes idle again.
    wait_event(
        &mut events,
        30,
        "the second idle pause",
        status_of(&a.id, SandboxStatus::Paused),
    )
    .await;

    // Without auto-resume a paused sandbox stays paused when used.
    let out = d.cli([
        "create",
        "--backend",
        "namespace",
        "--idle-timeout",
        "1s",
        "--no-auto-resume",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    wait_event(
        &mut events,
        30,
        "the idle pause of b",
        status_of(&b, SandboxStatus::Paused),
    )
    .await;
    let err = run(&c, &b, &["true"]).await.unwrap_err();
    assert_eq!(err.code(), "sandbox_not_running", "{err}");
    assert_eq!(c.sandbox(&b).await.unwrap().status, SandboxStatus::Paused);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hard_ttl_deletes_a_sandbox_in_any_state_across_a_restart() {
    let d = Daemon::start();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    let a = d
        .create(
            &c,
            CreateSandbox {
                hard_ttl_ms: Some(3_000),
                ..Default::default()
            },
        )
        .await;
    let deletes_at = a.lifecycle.deletes_at.expect("a deadline");
    assert_eq!(deletes_at, a.created_at + 3_000);
    c.pause_sandbox(&a.id).await.unwrap();
    wait_event(&mut events, 30, "the hard TTL", deleted(&a.id)).await;
    let err = c.sandbox(&a.id).await.unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");

    // A stopped persistent sandbox whose deadline passes while the daemon is down is deleted
    // when it starts again.
    let out = d.cli([
        "create",
        "--backend",
        "namespace",
        "--persistent",
        "--hard-ttl",
        "4s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let stopped = c.stop_sandbox(&b).await.unwrap();
    let deletes_at = stopped.lifecycle.deletes_at.expect("a deadline");
    d.kill9();
    // What is under test is the clock: let the deadline pass while no daemon runs.
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let left = deletes_at - now;
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64 + 50)).await;
    }
    d.restart();
    let c = d.unix();
    // The deletion is in the event log (replayed from the start).
    let mut events = c.events(Some(0)).await.unwrap();
    wait_event(
        &mut events,
        30,
        "the deletion after the restart",
        deleted(&b),
    )
    .await;
    let err = c.sandbox(&b).await.unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
}

/// The idle clock counts from the last use across a daemon `kill -9`: a sandbox used just
/// before the daemon died pauses one idle timeout after that use, not one after the restart.
#[tokio::test(flavor = "multi_thread")]
async fn the_idle_clock_survives_a_restart() {
    let d = Daemon::start();
    let c = d.unix();
    let idle_ms = 6_000;
    let a = d
        .create(
            &c,
            CreateSandbox {
                idle_timeout_ms: Some(idle_ms),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(run(&c, &a.id, &["true"]).await.unwrap(), 0);
    let used = Instant::now();
    d.kill9();
    // The daemon stays away for most of the idle timeout: the time that passes while it is
    // down is what this test is about, not a wait for something to happen.
    std::thread::sleep(Duration::from_millis(idle_ms as u64 - 1_000));
    d.restart();
    let c = d.unix();
    let mut events = c.events(None).await.unwrap();
    if c.sandbox(&a.id).await.unwrap().status != SandboxStatus::Paused {
        wait_event(
            &mut events,
            30,
            "the idle pause",
            status_of(&a.id, SandboxStatus::Paused),
        )
        .await;
    }
    // A clock started again by the restart would pause it 6 s after the restart (11 s and
    // more after the use).
    let after = used.elapsed();
    assert!(
        after < Duration::from_millis(idle_ms as u64 + 3_000),
        "paused {after:?} after its last use"
    );
}
