//! The agent's request parsing: query strings (`query::parse`, flags, `skip`, octal `mode`,
//! `user`), path segments and JSON bodies, through the real `server::handle` on an in-memory
//! HTTP/1.1 connection. Only routes that cannot reach outside a scratch directory are sent
//! whole (commands are never started; every `path=` the server sees points into the scratch
//! directory, appended last so that it wins over the input's own); the JSON bodies of the
//! other routes go through the same serde types and checks the handlers use.
//!
//! Invariants: no panic, every error answer is an `ErrorBody` with a known code, and input
//! alone never produces an `internal` error.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use belljar_agent::commands::{Commands, parse_signal};
use belljar_agent::reaper::Reaper;
use belljar_agent::server::{App, handle};
use belljar_agent_proto::{
    ErrorBody, MkdirRequest, MoveRequest, PtySize, RemoveRequest, ShutdownRequest, SignalRequest,
    StartCommand, codes, query,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::agent_answer::runtime;
use crate::input::Input;

const KNOWN_CODES: &[&str] = &[
    codes::BAD_REQUEST,
    codes::NOT_FOUND,
    codes::NOT_A_DIRECTORY,
    codes::IS_A_DIRECTORY,
    codes::PERMISSION_DENIED,
    codes::EXISTS,
    codes::NOT_EMPTY,
    codes::NO_SPACE,
    codes::INVALID_PATH,
    codes::COMMAND_NOT_FOUND,
    codes::COMMAND_FINISHED,
    codes::EXEC_FAILED,
    codes::UNKNOWN_USER,
    codes::INTERNAL,
];

struct Agent {
    app: Arc<App>,
    scratch: PathBuf,
    _shutdown: tokio::sync::mpsc::Receiver<belljar_agent_proto::ShutdownAction>,
}

/// The agent's state, made once inside the runtime (the reaper needs it).
fn agent() -> &'static Agent {
    static AGENT: OnceLock<Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        let scratch =
            std::env::temp_dir().join(format!("belljar-fuzz-agent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(scratch.join("dir")).expect("scratch dir");
        std::fs::write(scratch.join("file"), b"some bytes\n").expect("scratch file");
        let reaper = Reaper::start().expect("reaper");
        let commands = Commands::new(reaper, &scratch.join("state"), 1 << 20).expect("commands");
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let app = Arc::new(App {
            commands,
            started: std::time::Instant::now(),
            started_at: 0,
            own_uptime: false,
            shutdown: tx,
        });
        Agent {
            app,
            scratch,
            _shutdown: rx,
        }
    })
}

/// Percent-encodes arbitrary bytes for a path segment.
fn segment(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

/// One request the input describes: method, path, query and body.
fn request(input: &mut Input, scratch: &str) -> (http::Method, String, Vec<u8>) {
    use http::Method;
    let id = match input.u8() % 4 {
        0 => segment(input.string(16)),
        _ => "c1".to_owned(),
    };
    let raw_query = String::from_utf8_lossy(input.string(128)).into_owned();
    let body = input.string(512).to_vec();
    let safe_path = {
        let name = match input.u8() % 5 {
            0 => "file",
            1 => "dir",
            2 => "dir/new",
            3 => "missing/deeper",
            _ => "new",
        };
        query::encode(&format!("{scratch}/{name}"))
    };
    let with_path = format!("{raw_query}&path={safe_path}");
    let (method, path, q) = match input.u8() % 14 {
        0 => (Method::GET, "/v1/health".to_owned(), raw_query),
        1 => (Method::GET, "/v1/commands".to_owned(), raw_query),
        2 => (Method::GET, format!("/v1/commands/{id}"), raw_query),
        3 => (Method::GET, format!("/v1/commands/{id}/output"), raw_query),
        4 => (Method::POST, format!("/v1/commands/{id}/stdin"), raw_query),
        5 => (Method::POST, format!("/v1/commands/{id}/signal"), raw_query),
        6 => (Method::POST, format!("/v1/commands/{id}/resize"), raw_query),
        7 => (Method::GET, "/v1/files/read".to_owned(), with_path),
        8 => (Method::PUT, "/v1/files/write".to_owned(), with_path),
        9 => (Method::GET, "/v1/files/stat".to_owned(), with_path),
        10 => (Method::GET, "/v1/files/list".to_owned(), with_path),
        11 => (Method::POST, "/v1/shutdown".to_owned(), raw_query),
        12 => (Method::DELETE, format!("/v1/{id}"), raw_query),
        _ => (Method::GET, "/v1/metrics".to_owned(), raw_query),
    };
    // Bytes a URI cannot hold are escaped, as any client would have to.
    let q: String = q
        .bytes()
        .map(|b| {
            if b.is_ascii_graphic() && b != b'#' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    (method, format!("{path}?{q}"), body)
}

/// The JSON bodies of routes not sent whole, through the handlers' own types and checks.
fn bodies(input: &mut Input) {
    let body = input.string(512);
    let _ = serde_json::from_slice::<StartCommand>(body);
    let _ = serde_json::from_slice::<PtySize>(body);
    let _ = serde_json::from_slice::<ShutdownRequest>(body);
    if let Ok(s) = serde_json::from_slice::<SignalRequest>(body) {
        let _ = parse_signal(&s.signal);
    }
    if let Ok(m) = serde_json::from_slice::<MkdirRequest>(body) {
        let _ = belljar_agent::files::check_path(&m.path);
    }
    if let Ok(r) = serde_json::from_slice::<RemoveRequest>(body) {
        let _ = belljar_agent::files::check_path(&r.path);
    }
    if let Ok(m) = serde_json::from_slice::<MoveRequest>(body) {
        let _ = belljar_agent::files::check_path(&m.from);
        let _ = belljar_agent::files::check_path(&m.to);
    }
    let _ = parse_signal(&String::from_utf8_lossy(body));
}

/// Percent-encoding round-trips every string, and parsing what `build` made gives the pairs.
fn query_round_trip(input: &mut Input) {
    let raw = input.string(128);
    let _ = query::parse(&String::from_utf8_lossy(raw));
    let value = String::from_utf8_lossy(raw).into_owned();
    assert_eq!(
        query::decode(&query::encode(&value)).as_deref(),
        Some(value.as_str())
    );
    let built = query::build(&[("k", &value), ("path", "/x")]);
    let map = query::parse(&built[1..]).expect("what build makes parses");
    assert_eq!(map.get("k"), Some(&value));
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    query_round_trip(&mut input);
    bodies(&mut input);
    runtime().block_on(async {
        let agent = agent();
        let scratch = agent.scratch.to_str().expect("utf-8").to_owned();
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let app = agent.app.clone();
        let server = tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(app.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(server_io), service)
                .await;
        });
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(client_io)).await
        else {
            return;
        };
        let client = tokio::spawn(conn);
        for _ in 0..4 {
            if input.is_empty() {
                break;
            }
            let (method, uri, body) = request(&mut input, &scratch);
            let Ok(req) = http::Request::builder()
                .method(method)
                .uri(&uri)
                .body(Full::new(Bytes::from(body)))
            else {
                continue;
            };
            if sender.ready().await.is_err() {
                break;
            }
            let Ok(resp) = sender.send_request(req).await else {
                break;
            };
            let status = resp.status();
            let streaming = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|ct| ct.as_bytes() == b"application/x-ndjson");
            if status.is_success() && streaming {
                // An output or watch stream: its parsing is done; a new connection for more.
                break;
            }
            let Ok(body) = resp.into_body().collect().await else {
                break;
            };
            if !status.is_success() {
                let err: ErrorBody = serde_json::from_slice(&body.to_bytes())
                    .unwrap_or_else(|e| panic!("{uri}: {status} without an error body: {e}"));
                assert!(
                    KNOWN_CODES.contains(&err.error.code.as_str()),
                    "{uri}: unknown code {}",
                    err.error.code
                );
                assert_ne!(
                    err.error.code,
                    codes::INTERNAL,
                    "{uri}: input made an internal error: {}",
                    err.error.message
                );
            }
        }
        drop(sender);
        client.abort();
        server.abort();
    });
}
