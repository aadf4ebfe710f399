//! A daemon killed with `kill -9` and started again loses nothing: sandbox records, finished
//! commands' output and files survive, running sandboxes keep running and are adopted, and a
//! command that was running when the daemon died can still be waited for and read.

use std::time::Duration;

use belljar_api::{CommandStatus, CreateSandbox, RunCommand, SandboxStatus};
use belljar_client::{self as client, Client, log_bytes};
use belljar_e2e::{Daemon, stderr, stdout};

async fn logs(c: &Client, id: &str, cmd: &str) -> Vec<u8> {
    let mut lines = c.command_logs(id, cmd, true).await.unwrap();
    let mut out = Vec::new();
    while let Some(l) = lines.next().await.unwrap() {
        out.extend(log_bytes(&l));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_and_restart_loses_nothing() {
    let d = Daemon::start();
    let c = d.unix();
    let running = d
        .create(
            &c,
            CreateSandbox {
                name: Some("survivor".into()),
                tags: Some([("k".to_string(), "v".to_string())].into()),
                ..Default::default()
            },
        )
        .await;
    let stopped = d.create(&c, CreateSandbox::default()).await;

    // A finished command, a file, a stopped sandbox and a command still running.
    let done = c
        .run_command(
            &running.id,
            &RunCommand {
                argv: vec!["sh".into(), "-c".into(), "echo before-kill".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    c.write_file(
        &running.id,
        "/workspace/keep.txt",
        None,
        client::full("kept\n"),
    )
    .await
    .unwrap();
    c.stop_sandbox(&stopped.id).await.unwrap();
    let busy = c
        .run_command(
            &running.id,
            &RunCommand {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo start; sleep 4; echo end; exit 6".into(),
                ],
                detached: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // The daemon dies only once the command is running: its first line is out.
    let mut lines = c.command_logs(&running.id, &busy.id, true).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next())
        .await
        .expect("the detached command's first line within 30 s")
        .unwrap();
    assert_eq!(first.as_ref().map(log_bytes), Some(b"start\n".to_vec()));
    drop(lines);

    d.kill9();
    // The sandbox's processes outlive the daemon.
    d.restart();
    let c = d.unix();

    let s = c.sandbox(&running.id).await.unwrap();
    assert_eq!(s.status, SandboxStatus::Running, "{s:?}\nlog:\n{}", d.log());
    assert_eq!(s.name.as_deref(), Some("survivor"));
    assert_eq!(s.tags["k"], "v");
    let st = c.sandbox(&stopped.id).await.unwrap();
    assert_eq!(st.status, SandboxStatus::Stopped);

    assert_eq!(logs(&c, &running.id, &done.id).await, b"before-kill\n");
    let body = c
        .read_file_bytes(&running.id, "/workspace/keep.txt")
        .await
        .unwrap();
    assert_eq!(&body[..], b"kept\n");

    // The command that ran across the restart finishes and keeps all of its output.
    let finished = c.wait_command(&running.id, &busy.id).await.unwrap();
    assert_eq!(finished.status, CommandStatus::Exited);
    assert_eq!(finished.exit_code, Some(6));
    assert_eq!(logs(&c, &running.id, &busy.id).await, b"start\nend\n");

    // New commands work on the adopted sandbox, through the CLI too.
    let out = d.cli(["exec", &running.id, "--", "cat", "/workspace/keep.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "kept\n");
}
