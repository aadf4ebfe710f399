//! The typed methods against a canned server on a real socket: what goes on the wire (method,
//! encoded path, headers) and how answers, errors and NDJSON streams come back.

use std::path::{Path, PathBuf};

use belljar_api::{CreateSandbox, ErrorCode, ListSandboxesQuery, LogLine, SandboxStatus, Stream};
use belljar_client::{Client, ClientError, Paths};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads one request head (and the body it announces), answers `answer`, and returns the
/// request as text.
async fn serve_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    answer: Vec<u8>,
) -> String {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "client closed before a full head");
        req.extend_from_slice(&buf[..n]);
        if let Some(p) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&req[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    while req.len() < head_end + len {
        let n = s.read(&mut buf).await.unwrap();
        req.extend_from_slice(&buf[..n]);
    }
    s.write_all(&answer).await.unwrap();
    s.shutdown().await.unwrap();
    String::from_utf8(req).unwrap()
}

fn answer(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A Unix socket at `dir` that answers one request with `answer`.
fn unix_server(dir: &Path, answer: Vec<u8>) -> (PathBuf, tokio::task::JoinHandle<String>) {
    let sock = dir.join("d.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let handle = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        serve_one(s, answer).await
    });
    (sock, handle)
}

const SANDBOX: &str = r#"{"id":"sbx_a","name":null,"status":"running","image":"base",
    "backend":"namespace","backend_reason":"","vcpus":1,"memory_mib":512,"disk_mib":1024,
    "env":{},"tags":{},"created_at":1,"started_at":1,"stopped_at":null,"timeout_ms":1000,
    "expires_at":null,"limits":{"memory":{"enforced":true,"detail":""},
    "cpu":{"enforced":true,"detail":""},"pids":{"enforced":true,"detail":""}}}"#;

#[tokio::test]
async fn info_goes_over_the_unix_socket_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, server) = unix_server(dir.path(), answer("200 OK", "{\"a\": 1}"));
    let v: serde_json::Value = Client::unix(&sock).get("/v1/info").await.unwrap();
    assert_eq!(v["a"], 1);
    let req = server.await.unwrap().to_ascii_lowercase();
    assert!(req.starts_with("get /v1/info http/1.1\r\n"), "{req}");
    assert!(req.contains("host: localhost"), "{req}");
    assert!(!req.contains("authorization"), "{req}");
}

#[tokio::test]
async fn file_paths_are_percent_encoded_in_the_query() {
    let dir = tempfile::tempdir().unwrap();
    let entry =
        r#"{"name":"a b&c","path":"/tmp/a b&c","kind":"file","size":3,"mode":420,"mtime":0}"#;
    let (sock, server) = unix_server(dir.path(), answer("200 OK", entry));
    let e = Client::unix(&sock)
        .stat("sbx_1", "/tmp/a b&c=é")
        .await
        .unwrap();
    assert_eq!(e.size, 3);
    let req = server.await.unwrap();
    assert!(
        req.starts_with("GET /v1/sandboxes/sbx_1/files/stat?path=/tmp/a%20b%26c%3D%C3%A9 HTTP/1.1"),
        "{req}"
    );
}

#[tokio::test]
async fn a_missing_file_is_none_and_other_errors_keep_their_code() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"{"error":{"code":"not_found","message":"No such file"}}"#;
    let (sock, _server) = unix_server(dir.path(), answer("404 Not Found", body));
    let client = Client::unix(&sock);
    assert_eq!(client.try_stat("sbx_1", "/nope").await.unwrap(), None);

    let dir = tempfile::tempdir().unwrap();
    let body = r#"{"error":{"code":"bad_request","message":"timeout_ms must be positive"}}"#;
    let (sock, _server) = unix_server(dir.path(), answer("400 Bad Request", body));
    let e = Client::unix(&sock)
        .create_sandbox(&CreateSandbox::default())
        .await
        .unwrap_err();
    assert!(matches!(
        &e,
        ClientError::Api {
            status: 400,
            code: ErrorCode::BadRequest,
            ..
        }
    ));
    assert_eq!(e.code(), "bad_request");
    assert_eq!(e.to_string(), "timeout_ms must be positive");
}

#[tokio::test]
async fn list_queries_carry_every_filter() {
    let dir = tempfile::tempdir().unwrap();
    let page = format!(r#"{{"sandboxes":[{SANDBOX}],"next_cursor":null}}"#);
    let (sock, server) = unix_server(dir.path(), answer("200 OK", &page));
    let q = ListSandboxesQuery {
        status: Some(SandboxStatus::Running),
        tag: Some("team=a b".into()),
        limit: Some(5),
        ..Default::default()
    };
    let list = Client::unix(&sock).list_sandboxes(&q).await.unwrap();
    assert_eq!(list.sandboxes[0].id, "sbx_a");
    let req = server.await.unwrap();
    assert!(
        req.starts_with("GET /v1/sandboxes?status=running&tag=team%3Da%20b&limit=5 HTTP/1.1"),
        "{req}"
    );
}

#[tokio::test]
async fn logs_stream_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let body = "{\"stream\":\"stdout\",\"data\":\"hi\\n\",\"ts\":1}\n\
                {\"stream\":\"stderr\",\"data_base64\":\"/wA=\",\"ts\":2}\n";
    let chunked = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let (sock, server) = unix_server(dir.path(), chunked.into_bytes());
    let mut logs = Client::unix(&sock)
        .command_logs("sbx_1", "cmd_2", true)
        .await
        .unwrap();
    let mut got: Vec<LogLine> = Vec::new();
    while let Some(line) = logs.next().await.unwrap() {
        got.push(line);
    }
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].data.as_deref(), Some("hi\n"));
    assert_eq!(got[1].stream, Stream::Stderr);
    let req = server.await.unwrap();
    assert!(
        req.starts_with("GET /v1/sandboxes/sbx_1/commands/cmd_2/logs?follow=true HTTP/1.1"),
        "{req}"
    );
}

#[tokio::test]
async fn tcp_requests_carry_the_bearer_token_read_from_the_paths() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        serve_one(s, b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()).await
    });
    let home = tempfile::tempdir().unwrap();
    let paths = Paths::under_home(home.path());
    assert!(Client::local_tcp(&paths).is_none(), "no port file yet");
    std::fs::create_dir_all(&paths.runtime).unwrap();
    std::fs::create_dir_all(&paths.config).unwrap();
    std::fs::write(paths.port_file(), format!("{}\n", addr.port())).unwrap();
    std::fs::write(paths.token_file(), "s3cret\n").unwrap();
    Client::local_tcp(&paths)
        .unwrap()
        .delete_sandbox("sbx_1")
        .await
        .unwrap();
    let req = server.await.unwrap().to_ascii_lowercase();
    assert!(
        req.starts_with("delete /v1/sandboxes/sbx_1 http/1.1"),
        "{req}"
    );
    assert!(req.contains("authorization: bearer s3cret"), "{req}");
    assert!(req.contains(&format!("host: {addr}")), "{req}");
}

#[tokio::test]
async fn the_ui_url_carries_the_one_time_token_encoded() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, server) = unix_server(dir.path(), answer("200 OK", r#"{"token":"a+b/c"}"#));
    let url = Client::unix(&sock).ui_login_url(7423).await.unwrap();
    assert_eq!(url, "http://127.0.0.1:7423/ui?token=a%2Bb/c");
    assert!(
        server
            .await
            .unwrap()
            .starts_with("POST /v1/session/token HTTP/1.1")
    );
}

#[tokio::test]
async fn a_missing_socket_is_a_connect_error_and_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let c = Client::local(&Paths::under_home(dir.path()));
    assert!(!c.answers().await);
    let e = c.info().await.unwrap_err();
    assert_eq!(e.code(), "daemon_unavailable");
}

#[tokio::test]
async fn a_keyed_run_carries_the_idempotency_key_and_the_json_body() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = r#"{"id":"cmd_a","sandbox_id":"sbx_1","argv":["true"],"cwd":"/","user":"u",
        "pty":false,"status":"exited","exit_code":0,"started_at":1}"#;
    let (sock, server) = unix_server(dir.path(), answer("200 OK", cmd));
    let req = belljar_api::RunCommand {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let got = Client::unix(&sock)
        .run_command_once("sbx_1", &req, "retry-7")
        .await
        .unwrap();
    assert_eq!(got.id, "cmd_a");
    let sent = server.await.unwrap();
    let (head, body) = sent.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /v1/sandboxes/sbx_1/commands http/1.1"),
        "{head}"
    );
    assert!(head.contains("idempotency-key: retry-7"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let body: belljar_api::RunCommand = serde_json::from_str(body).unwrap();
    assert_eq!(body, req);
}
