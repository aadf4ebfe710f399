//! A daemon killed with `kill -9` and started again loses nothing: sandbox records, finished
//! commands' output and files survive, running sandboxes keep running and are adopted, and a
//! command that was running when the daemon died can still be waited for and read.

use std::time::Duration;

use belljar_api::{
    Command, CommandStatus, CreateSandbox, LogLine, RunCommand, Sandbox, SandboxStatus,
};
use belljar_client as client;
use belljar_client::Lines;
use belljar_client::log_bytes;
use belljar_client::routes::with_query;
use belljar_e2e::{Daemon, get_bytes, stderr, stdout};
use http::Method;

async fn logs(c: &client::Client, id: &str, cmd: &str) -> Vec<u8> {
    let resp = c
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/commands/{cmd}/logs?follow=true"),
            client::empty(),
            None,
        )
        .await
        .unwrap();
    let mut lines = Lines::new(resp.into_body());
    let mut out = Vec::new();
    while let Some(l) = lines.next::<LogLine>().await.unwrap() {
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
    let done: Command = c
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/commands", running.id),
            &RunCommand {
                argv: vec!["sh".into(), "-c".into(), "echo before-kill".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let put = with_query(
        &format!("/v1/sandboxes/{}/files", running.id),
        &[("path", Some("/workspace/keep.txt".into()))],
    );
    c.request(
        Method::PUT,
        &put,
        client::full("kept\n"),
        Some("application/octet-stream"),
    )
    .await
    .unwrap();
    let _: Sandbox = c
        .call_empty(Method::POST, &format!("/v1/sandboxes/{}/stop", stopped.id))
        .await
        .unwrap();
    let busy: Command = c
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/commands", running.id),
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
    tokio::time::sleep(Duration::from_millis(500)).await;

    d.kill9();
    // The sandbox's processes outlive the daemon.
    d.restart();
    let c = d.unix();

    let s: Sandbox = c
        .get(&format!("/v1/sandboxes/{}", running.id))
        .await
        .unwrap();
    assert_eq!(s.status, SandboxStatus::Running, "{s:?}\nlog:\n{}", d.log());
    assert_eq!(s.name.as_deref(), Some("survivor"));
    assert_eq!(s.tags["k"], "v");
    let st: Sandbox = c
        .get(&format!("/v1/sandboxes/{}", stopped.id))
        .await
        .unwrap();
    assert_eq!(st.status, SandboxStatus::Stopped);

    assert_eq!(logs(&c, &running.id, &done.id).await, b"before-kill\n");
    let get = with_query(
        &format!("/v1/sandboxes/{}/files", running.id),
        &[("path", Some("/workspace/keep.txt".into()))],
    );
    let body = get_bytes(&c, &get).await;
    assert_eq!(&body[..], b"kept\n");

    // The command that ran across the restart finishes and keeps all of its output.
    let finished: Command = c
        .get(&format!(
            "/v1/sandboxes/{}/commands/{}?wait=true",
            running.id, busy.id
        ))
        .await
        .unwrap();
    assert_eq!(finished.status, CommandStatus::Exited);
    assert_eq!(finished.exit_code, Some(6));
    assert_eq!(logs(&c, &running.id, &busy.id).await, b"start\nend\n");

    // New commands work on the adopted sandbox, through the CLI too.
    let out = d.cli(["exec", &running.id, "--", "cat", "/workspace/keep.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "kept\n");
}
