//! End to end through the HTTP API on 127.0.0.1 with the bearer token: a real daemon in a
//! temporary `BELLJAR_HOME`, sandboxes on the namespace backend with the real `base` image.

use std::time::Duration;

use belljar_api::{
    Command, CommandStatus, CreateSandbox, Event, ExtendSandbox, FileEntry, FileKind, FileList,
    Info, LogLine, MkdirRequest, MoveRequest, PtySize, RunCommand, Sandbox, SandboxStatus, Stream,
    TerminalMessage, WatchEvent,
};
use belljar_client::Lines;
use belljar_client::log_bytes;
use belljar_client::routes::with_query;
use belljar_client::{self as client, Client, ClientError};
use belljar_e2e::{Daemon, eventually, get_bytes};
use futures::{SinkExt, StreamExt};
use http::{Method, header};
use http_body_util::BodyExt;
use tokio_tungstenite::tungstenite::Message;

async fn run(c: &Client, id: &str, req: RunCommand) -> Command {
    c.call(Method::POST, &format!("/v1/sandboxes/{id}/commands"), &req)
        .await
        .expect("run command")
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
    let path = with_query(
        &format!("/v1/sandboxes/{id}/commands/{cmd}/logs"),
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
    let info: Info = c.get("/v1/info").await.unwrap();
    assert!(!info.default_backend_reason.is_empty());
    let doc: serde_json::Value = c.get("/v1/openapi.json").await.unwrap();
    assert!(
        doc["paths"]["/v1/sandboxes"].is_object(),
        "openapi lacks /v1/sandboxes"
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
    let got: Sandbox = c.get(&format!("/v1/sandboxes/{}", s.id)).await.unwrap();
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
    let path = format!("/v1/sandboxes/{}/commands/{}", s.id, cmd.id);
    let done: Command = c.get(&format!("{path}?wait=true")).await.unwrap();
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
    let cat_path = format!("/v1/sandboxes/{}/commands/{}", s.id, cat.id);
    c.call_no_content(
        Method::POST,
        &format!("{cat_path}/stdin?close=true"),
        client::full("piped in\n"),
        Some("application/octet-stream"),
    )
    .await
    .unwrap();
    let done: Command = c.get(&format!("{cat_path}?wait=true")).await.unwrap();
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
    let long_path = format!("/v1/sandboxes/{}/commands/{}", s.id, long.id);
    let _: Command = c
        .call(
            Method::POST,
            &format!("{long_path}/kill"),
            &serde_json::json!({"signal": "KILL"}),
        )
        .await
        .unwrap();
    let done: Command = c.get(&format!("{long_path}?wait=true")).await.unwrap();
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

    let list: belljar_api::CommandList = c
        .get(&format!("/v1/sandboxes/{}/commands", s.id))
        .await
        .unwrap();
    assert!(list.commands.len() >= 6);

    // Extend, stop, delete.
    let ext: Sandbox = c
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/extend", s.id),
            &ExtendSandbox {
                duration_ms: 60_000,
            },
        )
        .await
        .unwrap();
    assert_eq!(ext.timeout_ms, 360_000);
    let stopped: Sandbox = c
        .call_empty(Method::POST, &format!("/v1/sandboxes/{}/stop", s.id))
        .await
        .unwrap();
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    // Output of finished commands outlives the sandbox.
    assert_eq!(output(&c, &s.id, &cmd.id, false).await.0, b"later\n");
    c.call_no_content(
        Method::DELETE,
        &format!("/v1/sandboxes/{}", s.id),
        client::empty(),
        None,
    )
    .await
    .unwrap();
    let (status, code) = api_err(
        c.get::<Sandbox>(&format!("/v1/sandboxes/{}", s.id))
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (404, "not_found"));
}

#[tokio::test(flavor = "multi_thread")]
async fn files_api() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let files = format!("/v1/sandboxes/{}/files", s.id);
    let name = "/workspace/dir one/ünï côdé.txt";

    let put = with_query(
        &files,
        &[("path", Some(name.into())), ("mode", Some("600".into()))],
    );
    let resp = c
        .request(
            Method::PUT,
            &put,
            client::full("contents\n"),
            Some("application/octet-stream"),
        )
        .await
        .unwrap();
    let entry: FileEntry = client::decode(resp, "put").await.unwrap();
    assert_eq!(entry.size, 9);
    assert_eq!(entry.mode & 0o777, 0o600);

    let get = with_query(&files, &[("path", Some(name.into()))]);
    let body = get_bytes(&c, &get).await;
    assert_eq!(&body[..], b"contents\n");

    let stat: FileEntry = c
        .get(&with_query(
            &format!("{files}/stat"),
            &[("path", Some(name.into()))],
        ))
        .await
        .unwrap();
    assert_eq!(stat.kind, FileKind::File);
    let list: FileList = c
        .get(&with_query(
            &format!("{files}/list"),
            &[("path", Some("/workspace/dir one".into()))],
        ))
        .await
        .unwrap();
    assert_eq!(list.entries.len(), 1);
    assert_eq!(list.entries[0].name, "ünï côdé.txt");

    let made: FileEntry = c
        .call(
            Method::POST,
            &format!("{files}/mkdir"),
            &MkdirRequest {
                path: "/workspace/a/b/c".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(made.kind, FileKind::Directory);
    let moved: FileEntry = c
        .call(
            Method::POST,
            &format!("{files}/move"),
            &MoveRequest {
                from: name.into(),
                to: "/workspace/a/b/c/moved.txt".into(),
                overwrite: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(moved.path, "/workspace/a/b/c/moved.txt");

    // Tar of a tree contains the moved file.
    let tar = get_bytes(
        &c,
        &with_query(
            &format!("{files}/tar"),
            &[("path", Some("/workspace/a".into()))],
        ),
    )
    .await;
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
    let (status, code) = api_err(
        c.request(
            Method::GET,
            &with_query(&files, &[("path", Some("/workspace/a".into()))]),
            client::empty(),
            None,
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, "is_a_directory");
    assert!(status == 400 || status == 409, "status {status}");
    let (status, code) = api_err(
        c.request(
            Method::GET,
            &with_query(&files, &[("path", Some("/workspace/nope".into()))]),
            client::empty(),
            None,
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (404, "not_found"));

    c.call_no_content(
        Method::DELETE,
        &with_query(
            &files,
            &[
                ("path", Some("/workspace/a".into())),
                ("recursive", Some("true".into())),
            ],
        ),
        client::empty(),
        None,
    )
    .await
    .unwrap();
    let (status, _) = api_err(
        c.get::<FileEntry>(&with_query(
            &format!("{files}/stat"),
            &[("path", Some("/workspace/a".into()))],
        ))
        .await
        .unwrap_err(),
    );
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn events_and_watch_stream() {
    let d = Daemon::start();
    let c = d.http();
    let resp = c
        .request(Method::GET, "/v1/events", client::empty(), None)
        .await
        .unwrap();
    let mut events = Lines::new(resp.into_body());
    let s = d.create(&c, CreateSandbox::default()).await;
    let sid = s.id.clone();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e: Event = events.next().await.unwrap().expect("events stream ended");
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
    let cmd = sh(&c, &s.id, "true").await;
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e: Event = events.next().await.unwrap().expect("events stream ended");
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
    let watch = with_query(
        &format!("/v1/sandboxes/{}/files/watch", s.id),
        &[
            ("path", Some("/workspace".into())),
            ("recursive", Some("true".into())),
        ],
    );
    let resp = c
        .request(Method::GET, &watch, client::empty(), None)
        .await
        .unwrap();
    let mut watch = Lines::new(resp.into_body());
    // Give the watch a moment to be installed in the sandbox before the change.
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let mut ws = c
        .websocket(&format!("/v1/sandboxes/{}/terminal?rows=30&cols=90", s.id))
        .await
        .unwrap();
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
    let mut ws = c
        .websocket(&format!("/v1/sandboxes/{}/terminal?rows=10&cols=20", s.id))
        .await
        .unwrap();
    let resize = serde_json::to_string(&TerminalMessage::Resize {
        rows: 50,
        cols: 132,
    })
    .unwrap();
    ws.send(Message::Text(resize.into())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let (st, code) = api_err(
        c.get::<Sandbox>("/v1/sandboxes/sbx_doesnotexist")
            .await
            .unwrap_err(),
    );
    assert_eq!((st, code.as_str()), (404, "not_found"));
    let (st, code) = api_err(
        c.get::<Command>(&format!("/v1/sandboxes/{}/commands/cmd_nope", s.id))
            .await
            .unwrap_err(),
    );
    assert_eq!((st, code.as_str()), (404, "not_found"));

    // Bad JSON, a wrong field type, a negative timeout, an empty argv, a negative extension.
    let bad = c
        .request(
            Method::POST,
            "/v1/sandboxes",
            client::full("{not json"),
            Some("application/json"),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    let bad = c
        .call::<_, Sandbox>(
            Method::POST,
            "/v1/sandboxes",
            &serde_json::json!({"vcpus": "two"}),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    let bad = c
        .call::<_, Sandbox>(
            Method::POST,
            "/v1/sandboxes",
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
            &format!("/v1/sandboxes/{}/commands", s.id),
            &serde_json::json!({"argv": []}),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));
    let bad = c
        .call::<_, Sandbox>(
            Method::POST,
            &format!("/v1/sandboxes/{}/extend", s.id),
            &serde_json::json!({"duration_ms": -1000}),
        )
        .await
        .unwrap_err();
    assert_eq!(api_err(bad), (400, "bad_request".to_string()));

    // Writing to a path that is a directory.
    let bad = c
        .request(
            Method::PUT,
            &with_query(
                &format!("/v1/sandboxes/{}/files", s.id),
                &[("path", Some("/workspace".into()))],
            ),
            client::full("x"),
            Some("application/octet-stream"),
        )
        .await
        .unwrap_err();
    let (st, code) = api_err(bad);
    assert_eq!(code, "is_a_directory");
    assert!(st == 400 || st == 409, "status {st}");

    // No token, a wrong token, a foreign Origin, a non-loopback Host.
    let anon = d.http_without_token();
    let (st, code) = raw(
        &anon,
        anon.builder(Method::GET, "/v1/sandboxes")
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!((st, code.as_deref()), (401, Some("unauthorized")));
    let (st, _) = raw(
        &anon,
        anon.builder(Method::GET, "/v1/sandboxes")
            .header(header::AUTHORIZATION, "Bearer wrong")
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, 401);
    let (st, code) = raw(
        &c,
        c.builder(Method::GET, "/v1/sandboxes")
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
        c.builder(Method::GET, "/v1/sandboxes")
            .header(header::ORIGIN, own)
            .body(client::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, 200);
    let token = d.paths.token().unwrap();
    let req = http::Request::builder()
        .uri("/v1/sandboxes")
        .header(header::HOST, "attacker.example")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(client::empty())
        .unwrap();
    let (st, code) = raw(&c, req).await;
    assert_eq!((st, code.as_deref()), (403, Some("forbidden")));
    // A WebSocket with a foreign Origin is refused too.
    let (st, _) = raw(
        &c,
        c.builder(Method::GET, &format!("/v1/sandboxes/{}/terminal", s.id))
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
    let path = format!("/v1/sandboxes/{}", s.id);
    let stopped = eventually(Duration::from_secs(30), "the sandbox to time out", || {
        let c = c.clone();
        let path = path.clone();
        async move {
            let s: Sandbox = c.get(&path).await.ok()?;
            s.status.is_final().then_some(s)
        }
    })
    .await;
    assert_eq!(stopped.status, SandboxStatus::Stopped);
    assert_eq!(stopped.status_reason.as_deref(), Some("timeout"));
}
