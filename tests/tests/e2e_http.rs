//! End to end through the HTTP API on 127.0.0.1 with the bearer token: a real daemon in a
//! temporary `BELLJAR_HOME`, sandboxes on the namespace backend with the real `base` image.

use std::time::Duration;

use belljar_api::{
    Command, CommandStatus, CreateSandbox, Event, FileKind, LogLine, MoveRequest, NetworkMode,
    NetworkPolicy, PtySize, RunCommand, Sandbox, SandboxStatus, Stream, TerminalMessage,
    WatchEvent,
};
use belljar_client::routes::{self, with_query};
use belljar_client::{self as client, Client, ClientError, Lines, TerminalOptions, log_bytes};
use belljar_e2e::{Daemon, eventually};
use futures::{SinkExt, StreamExt};
use http::{Method, header};
use http_body_util::BodyExt;
use tokio_tungstenite::tungstenite::Message;

async fn run(c: &Client, id: &str, req: RunCommand) -> Command {
    c.run_command(id, &req).await.expect("run command")
}

async fn sh(c: &Client, id: &str, script: &str) -> Command {
    run(
        c,
        id,
        RunCommand {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        },
    )
    .await
}

async fn output(c: &Client, id: &str, cmd: &str, follow: bool) -> (Vec<u8>, Vec<u8>) {
    // By hand rather than `command_logs`, to see the answer's content type.
    let path = with_query(
        &routes::command_sub(id, cmd, "logs"),
        &[("follow", follow.then(|| "true".to_string()))],
    );
    let resp = c
        .request(Method::GET, &path, client::empty(), None)
        .await
        .expect("logs");
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .split(';')
            .next(),
        Some("application/x-ndjson")
    );
    let mut lines = Lines::new(resp.into_body());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(line) = lines.next::<LogLine>().await.unwrap() {
        match line.stream {
            Stream::Stdout => out.extend(log_bytes(&line)),
            Stream::Stderr => err.extend(log_bytes(&line)),
        }
    }
    (out, err)
}

fn api_err(e: ClientError) -> (u16, String) {
    match e {
        ClientError::Api { status, code, .. } => (status, code.to_string()),
        other => panic!("expected an API error, got {other}"),
    }
}

/// Sends a raw request and returns the status and the error code of the body, if any.
async fn raw(c: &Client, req: http::Request<client::Body>) -> (u16, Option<String>) {
    let resp = c.send(req).await.expect("send");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let code = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
    (status, code)
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_lifecycle_and_commands() {
    let d = Daemon::start();
    let c = d.http();
    let info = c.info().await.unwrap();
    assert!(!info.default_backend_reason.is_empty());
    let doc = c.openapi().await.unwrap();
    assert!(
        doc["paths"][routes::SANDBOXES].is_object(),
        "openapi lacks {}",
        routes::SANDBOXES
    );

    let s = d
        .create(
            &c,
            CreateSandbox {
                env: Some([("FOO".to_string(), "bar".to_string())].into()),
                name: Some("http".into()),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(s.status, SandboxStatus::Running);
    assert_eq!(s.vcpus, 2);
    assert_eq!(s.memory_mib, 1024);
    assert_eq!(s.timeout_ms, 300_000);
    let got = c.sandbox(&s.id).await.unwrap();
    assert_eq!(got.id, s.id);

    // Waited command with output and exit code; env overridden per command.
    let cmd = sh(&c, &s.id, "echo $FOO; echo e >&2; exit 4").await;
    assert_eq!(cmd.status, CommandStatus::Exited);
    assert_eq!(cmd.exit_code, Some(4));
    let (out, err) = output(&c, &s.id, &cmd.id, false).await;
    assert_eq!(out, b"bar\n");
    assert_eq!(err, b"e\n");
    let cmd = run(
        &c,
        &s.id,
        RunCommand {
            argv: vec!["sh".into(), "-c".into(), "echo $FOO".into()],
            env: Some([("FOO".to_string(), "baz".to_string())].into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(output(&c, &s.id, &cmd.id, false).await.0, b"baz\n");

    // Detached: returns running; logs read later; wait gives the exit code.
    let cmd = run(
        &c,
        &s.id,
        RunCommand {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "sleep 1; echo later; exit 2".into(),
            ],
            detached: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(cmd.status, CommandStatus::Running);
    let done = c.wait_command(&s.id, &cmd.id).await.unwrap();
    assert_eq!(done.exit_code, Some(2));
    assert_eq!(output(&c, &s.id, &cmd.id, false).await.0, b"later\n");

    // Stdin and kill.
    let cat = run(
        &c,
        &s.id,
        RunCommand {
            argv: vec!["cat".into()],
            detached: true,
            stdin: true,
            ..Default::default()
        },
    )
    .await;
    c.write_stdin(&s.id, &cat.id, "piped in\n".into(), true)
        .await
        .unwrap();
    let done = c.wait_command(&s.id, &cat.id).await.unwrap();
    assert_eq!(done.exit_code, Some(0));
    assert_eq!(output(&c, &s.id, &cat.id, true).await.0, b"piped in\n");
    let long = run(
        &c,
        &s.id,
        RunCommand {
            argv: vec!["sleep".into(), "1000".into()],
            detached: true,
            ..Default::default()
        },
    )
    .await;
    c.kill_command(&s.id, &long.id, Some("KILL")).await.unwrap();
    let done = c.wait_command(&s.id, &long.id).await.unwrap();
    assert_eq!(done.signal, Some(9));

    // PTY.
    let tty = run(
        &c,
        &s.id,
        RunCommand {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "stty size; test -t 0 && echo tty".into(),
            ],
            pty: Some(PtySize {
                rows: 33,
                cols: 101,
            }),
            ..Default::default()
        },
    )
    .await;
    assert!(tty.pty);
    assert_eq!(
        output(&c, &s.id, &tty.id, false).await.0,
        b"33 101\r\ntty\r\n"
    );

    let list = c.commands(&s.id).await.unwrap();
    assert!(list.commands.len() >= 6);

    // Extend, stop, delete.
    let ext = c.extend_sandbox(&s.id, 60_000).await.unwrap();
    assert_eq!(ext.timeout_ms, 360_000);
    let stopped = c.stop_sandbox(&s.id).await.unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    // Output of finished commands outlives the sandbox.
    assert_eq!(output(&c, &s.id, &cmd.id, false).await.0, b"later\n");
    c.delete_sandbox(&s.id).await.unwrap();
    let (status, code) = api_err(c.sandbox(&s.id).await.unwrap_err());
    assert_eq!((status, code.as_str()), (404, "not_found"));
}

#[tokio::test(flavor = "multi_thread")]
async fn files_api() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let name = "/workspace/dir one/ünï côdé.txt";

    let entry = c
        .write_file(&s.id, name, Some(0o600), client::full("contents\n"))
        .await
        .unwrap();
    assert_eq!(entry.size, 9);
    assert_eq!(entry.mode & 0o777, 0o600);

    let body = c.read_file_bytes(&s.id, name).await.unwrap();
    assert_eq!(&body[..], b"contents\n");

    let stat = c.stat(&s.id, name).await.unwrap();
    assert_eq!(stat.kind, FileKind::File);
    let list = c
        .list_files(&s.id, "/workspace/dir one", None, None)
        .await
        .unwrap();
    assert_eq!(list.entries.len(), 1);
    assert_eq!(list.entries[0].name, "ünï côdé.txt");

    let made = c.mkdir(&s.id, "/workspace/a/b/c").await.unwrap();
    assert_eq!(made.kind, FileKind::Directory);
    let req = MoveRequest {
        from: name.into(),
        to: "/workspace/a/b/c/moved.txt".into(),
        overwrite: false,
    };
    let moved = c.move_file(&s.id, &req).await.unwrap();
    assert_eq!(moved.path, "/workspace/a/b/c/moved.txt");

    // Tar of a tree contains the moved file.
    let tar = c
        .download_tar(&s.id, "/workspace/a")
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let tar_names: Vec<String> = {
        let mut a = tar::Archive::new(&tar[..]);
        a.entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    };
    assert!(
        tar_names.iter().any(|n| n.ends_with("b/c/moved.txt")),
        "{tar_names:?}"
    );

    // A directory where a file is expected, and a missing file.
    let (status, code) = api_err(c.read_file(&s.id, "/workspace/a").await.unwrap_err());
    assert_eq!(code, "is_a_directory");
    assert!(status == 400 || status == 409, "status {status}");
    let (status, code) = api_err(c.read_file(&s.id, "/workspace/nope").await.unwrap_err());
    assert_eq!((status, code.as_str()), (404, "not_found"));

    c.remove(&s.id, "/workspace/a", true).await.unwrap();
    let (status, _) = api_err(c.stat(&s.id, "/workspace/a").await.unwrap_err());
    assert_eq!(status, 404);
    assert_eq!(c.try_stat(&s.id, "/workspace/a").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn events_and_watch_stream() {
    let d = Daemon::start();
    let c = d.http();
    let mut events = c.events(None).await.unwrap();
    let s = d.create(&c, CreateSandbox::default()).await;
    let sid = s.id.clone();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = events.next().await.unwrap().expect("events stream ended");
            if let Event::Sandbox { sandbox, .. } = e
                && sandbox.id == sid
                && sandbox.status == SandboxStatus::Running
            {
                break;
            }
        }
    })
    .await
    .expect("no running event for the new sandbox");
    // A sandbox's event carries what GET answers, its network policy too: the app's Network
    // tab shows the policy from these events.
    let deny = NetworkPolicy::Mode(NetworkMode::DenyAll);
    c.set_network_policy(&sid, &deny).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = events.next().await.unwrap().expect("events stream ended");
            if let Event::Sandbox { sandbox, .. } = e
                && sandbox.id == sid
                && sandbox.network_policy.as_ref() == Some(&deny)
            {
                break;
            }
        }
    })
    .await
    .expect("no event for the new policy");
    let cmd = sh(&c, &s.id, "true").await;
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = events.next().await.unwrap().expect("events stream ended");
            if let Event::Command { command, .. } = e
                && command.id == cmd.id
                && command.status == CommandStatus::Exited
            {
                break;
            }
        }
    })
    .await
    .expect("no exited event for the command");

    // Watch /workspace as NDJSON and create a file in it.
    // The answer's head comes once the agent has installed the watch (it refuses a path it
    // cannot watch before it answers), so a change made now is seen.
    let mut watch = c.watch(&s.id, "/workspace", true).await.unwrap();
    sh(&c, &s.id, "echo x > /workspace/watched.txt").await;
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let e: WatchEvent = watch.next().await.unwrap().expect("watch ended");
            if e.path.ends_with("/watched.txt") {
                break;
            }
        }
    })
    .await
    .expect("no watch event for /workspace/watched.txt");
}

#[tokio::test(flavor = "multi_thread")]
async fn terminal_websocket() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let size = |rows, cols| TerminalOptions {
        rows: Some(rows),
        cols: Some(cols),
        ..Default::default()
    };
    let mut ws = c.terminal(&s.id, &size(30, 90)).await.unwrap();
    ws.send(Message::Binary(
        "stty size; echo marker-$((6*7)); exit 5\n".into(),
    ))
    .await
    .unwrap();
    let mut seen = Vec::new();
    let exit = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(msg) = ws.next().await {
            match msg.unwrap() {
                Message::Binary(b) => seen.extend_from_slice(&b),
                Message::Text(t) => {
                    if let Ok(TerminalMessage::Exit { exit_code, .. }) = serde_json::from_str(&t) {
                        return exit_code;
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        None
    })
    .await
    .expect("terminal did not exit");
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("marker-42"), "{text}");
    assert!(text.contains("30 90"), "{text}");
    assert_eq!(exit, Some(5));

    // Resize message on a second shell.
    let mut ws = c.terminal(&s.id, &size(10, 20)).await.unwrap();
    let resize = serde_json::to_string(&TerminalMessage::Resize {
        rows: 50,
        cols: 132,
    })
    .unwrap();
    ws.send(Message::Text(resize.into())).await.unwrap();
    // No wait needed: the daemon applies a resize before it reads the next frame.
    ws.send(Message::Binary("stty size; exit\n".into()))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(msg)) = ws.next().await {
            match msg {
                Message::Binary(b) => seen.extend_from_slice(&b),
                Message::Close(_) => break,
                Message::Text(t) if t.contains("\"exit\"") => break,
                _ => {}
            }
        }
    })
    .await;
    assert!(String::from_utf8_lossy(&seen).contains("50 132"));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_the_right_code() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;

    // Unknown ids.
    let (st, code) = api_err(c.sandbox("sbx_doesnotexist").await.unwrap_err());
    assert_eq!((st, code.as_str()), (404, "not_found"));
    let (st, code) = api_err(c.command(&s.id, "cmd_nope").await.unwrap_err());
    assert_eq!((st, code.as_str()), (404, "not_found"));

    // Bad JSON, a wrong field type, a negative timeout, an empty argv, a negative extension.
    let bad = c
        .request(
            Method::POST,
            routes::SANDBOXES,
            client::full("{not json"),
            Some("application/json"),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    let bad = c
        .call::<_, Sandbox>(
            Method::POST,
            routes::SANDBOXES,
            &serde_json::json!({"vcpus": "two"}),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    let bad = c
        .call::<_, Sandbox>(
            Method::POST,
            routes::SANDBOXES,
            &serde_json::json!({"timeout_ms": -5}),
        )
        .await
        .unwrap_err();
    let msg = bad.to_string();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    assert!(
        msg.contains("timeout"),
        "message does not name the field: {msg}"
    );
    let bad = c
        .call::<_, Command>(
            Method::POST,
            &routes::commands(&s.id),
            &serde_json::json!({"argv": []}),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    let bad = c
        .call::<_, Sandbox>(
            Method::POST,
            &routes::sandbox_sub(&s.id, "extend"),
            &serde_json::json!({"duration_ms": -1000}),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));

    // Writing to a path that is a directory.
    let bad = c
        .write_file(&s.id, "/workspace", None, client::full("x"))
        .await
        .unwrap_err();
    let (st, code) = api_err(bad);
    assert_eq!(code, "is_a_directory");
    assert!(st == 400 || st == 409, "status {st}");

    // No token, a wrong token, a foreign Origin, a non-loopback Host.
    let anon = d.http_without_token();
    let (st, code) = raw(
        &anon,
        anon.builder(Method::GET, routes::SANDBOXES)
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!((st, code.as_deref()), (401, Some("unauthorized")));
    let (st, _) = raw(
        &anon,
        anon.builder(Method::GET, routes::SANDBOXES)
            .header(header::AUTHORIZATION, "Bearer wrong")
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, 401);
    let (st, code) = raw(
        &c,
        c.builder(Method::GET, routes::SANDBOXES)
            .header(header::ORIGIN, "https://evil.example")
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!((st, code.as_deref()), (403, Some("forbidden")));
    // The daemon's own origin is fine.
    let own = format!("http://127.0.0.1:{}", d.addr().port());
    let (st, _) = raw(
        &c,
        c.builder(Method::GET, routes::SANDBOXES)
            .header(header::ORIGIN, own)
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, 200);
    let token = d.paths.token().unwrap();
    let req = http::Request::builder()
        .uri(routes::SANDBOXES)
        .header(header::HOST, "attacker.example")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(client::empty())
        .unwrap();
    let (st, code) = raw(&c, req).await;
    assert_eq!((st, code.as_deref()), (403, Some("forbidden")));
    // A WebSocket with a foreign Origin is refused too.
    let (st, _) = raw(
        &c,
        c.builder(Method::GET, &routes::sandbox_sub(&s.id, "terminal"))
            .header(header::ORIGIN, "https://evil.example")
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_expiry_over_http() {
    let d = Daemon::start();
    let c = d.http();
    let s = d
        .create(
            &c,
            CreateSandbox {
                timeout_ms: Some(2_000),
                ..Default::default()
            },
        )
        .await;
    let stopped = eventually(Duration::from_secs(30), "the sandbox to time out", || {
        let c = c.clone();
        let id = s.id.clone();
        async move {
            let s = c.sandbox(&id).await.ok()?;
            s.status.is_final().then_some(s)
        }
    })
    .await;
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    assert_eq!(stopped.status_reason.as_deref(), Some("timeout"));
}
