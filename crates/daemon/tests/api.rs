//! The real `belljard` binary with a temporary home: readiness, the files it leaves, the
//! guards of the TCP listener, error shapes, sessions, the OpenAPI document and a clean
//! SIGTERM. Sandboxes themselves are covered by the end-to-end tests in `tests/`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn answers_on_both_listeners_with_private_files() {
    let d = Daemon::start();
    assert_eq!(mode(&d.socket()), 0o600);
    assert_eq!(mode(&d.home.path().join("config/token")), 0o600);
    let pid: u32 = std::fs::read_to_string(d.home.path().join("run/belljard.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(pid, d.child.id());

    let info = d.unix("GET", "/v1/info", "");
    assert_eq!(info.status, 200, "{}", info.body);
    let info = info.json();
    assert_eq!(info["default_backend"], "namespace");
    assert!(info["backends"].as_array().unwrap().len() == 2);
    assert!(info["free_memory_mib"].as_u64().unwrap() > 0);
    let tcp = d.tcp_authed("GET", "/v1/info", "");
    assert_eq!(tcp.status, 200);
}

#[test]
fn the_tcp_listener_checks_token_host_and_origin() {
    let d = Daemon::start();
    let no_token = d.tcp("GET", "/v1/sandboxes", &[("Host", "127.0.0.1")], "");
    assert_eq!(
        (no_token.status, no_token.code().as_str()),
        (401, "unauthorized")
    );
    let wrong = d.tcp(
        "GET",
        "/v1/sandboxes",
        &[("Host", "127.0.0.1"), ("Authorization", "Bearer nope")],
        "",
    );
    assert_eq!(wrong.status, 401);
    let bearer = format!("Bearer {}", d.token);
    let foreign = d.tcp(
        "GET",
        "/v1/sandboxes",
        &[
            ("Host", "127.0.0.1"),
            ("Authorization", &bearer),
            ("Origin", "https://evil.example"),
        ],
        "",
    );
    assert_eq!(
        (foreign.status, foreign.code().as_str()),
        (403, "forbidden")
    );
    let rebinding = d.tcp(
        "GET",
        "/v1/sandboxes",
        &[("Host", "evil.example"), ("Authorization", &bearer)],
        "",
    );
    assert_eq!(rebinding.status, 403);
    let own = format!("http://localhost:{}", d.port);
    let ok = d.tcp(
        "GET",
        "/v1/sandboxes",
        &[
            ("Host", "localhost"),
            ("Authorization", &bearer),
            ("Origin", &own),
        ],
        "",
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let app = d.tcp(
        "GET",
        "/v1/sandboxes",
        &[("Authorization", &bearer), ("Origin", "tauri://localhost")],
        "",
    );
    assert_eq!(app.status, 200);
    // The Unix socket needs no token.
    assert_eq!(d.unix("GET", "/v1/sandboxes", "").status, 200);
}

#[test]
fn the_desktop_app_gets_cors_answers_and_a_websocket_query_token() {
    let d = Daemon::start();
    let preflight = d.tcp(
        "OPTIONS",
        "/v1/sandboxes",
        &[
            ("Host", "127.0.0.1"),
            ("Origin", "tauri://localhost"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        "",
    );
    assert_eq!(preflight.status, 200, "{}", preflight.head);
    let head = preflight.head.to_ascii_lowercase();
    assert!(
        head.contains("access-control-allow-origin: tauri://localhost"),
        "{head}"
    );
    assert!(head.contains("access-control-allow-headers: authorization,content-type"));
    assert!(head.contains("access-control-max-age: 600"), "{head}");

    let foreign = d.tcp(
        "OPTIONS",
        "/v1/sandboxes",
        &[("Host", "127.0.0.1"), ("Origin", "https://evil.example")],
        "",
    );
    assert_eq!(foreign.status, 403);
    assert!(
        !foreign
            .head
            .to_ascii_lowercase()
            .contains("access-control-allow-origin")
    );

    let bearer = format!("Bearer {}", d.token);
    let app = d.tcp(
        "GET",
        "/v1/info",
        &[
            ("Authorization", &bearer),
            ("Origin", "http://tauri.localhost"),
        ],
        "",
    );
    assert_eq!(app.status, 200);
    assert!(
        app.head
            .to_ascii_lowercase()
            .contains("access-control-allow-origin: http://tauri.localhost")
    );
    // A refusal (no token) stays readable by an allowed origin's page, so it can say why.
    let refused = d.tcp(
        "GET",
        "/v1/info",
        &[("Host", "127.0.0.1"), ("Origin", "tauri://localhost")],
        "",
    );
    assert_eq!(refused.status, 401);
    assert!(
        refused
            .head
            .to_ascii_lowercase()
            .contains("access-control-allow-origin: tauri://localhost"),
        "{}",
        refused.head
    );

    // A WebSocket upgrade may carry the token in its query; the upgrade then goes through.
    let upgrade = |token: &str| {
        d.tcp(
            "GET",
            &format!("/v1/events?access_token={token}"),
            &[
                ("Host", "127.0.0.1"),
                ("Origin", "tauri://localhost"),
                ("Upgrade", "websocket"),
                ("Connection", "Upgrade"),
                ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ],
            "",
        )
    };
    assert_eq!(upgrade("wrong").status, 401);
    let ws = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    ws.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut ws = ws;
    write!(
        ws,
        "GET /v1/events?access_token={} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        d.token
    )
    .unwrap();
    let mut first = [0u8; 12];
    ws.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 101");
    // The same token in a query is not accepted outside a WebSocket upgrade.
    let plain = d.tcp(
        "GET",
        &format!("/v1/info?access_token={}", d.token),
        &[("Host", "127.0.0.1")],
        "",
    );
    assert_eq!(plain.status, 401);
}

#[test]
fn a_one_time_token_becomes_a_session_cookie() {
    let d = Daemon::start();
    let t = d.unix("POST", "/v1/session/token", "");
    assert_eq!(t.status, 200, "{}", t.body);
    let token = t.json()["token"].as_str().unwrap().to_owned();
    // Without credentials over TCP no token is handed out.
    assert_eq!(d.tcp("POST", "/v1/session/token", &[], "").status, 401);

    let login = d.tcp(
        "GET",
        &format!("/ui?token={token}"),
        &[("Host", "127.0.0.1")],
        "",
    );
    assert_eq!(login.status, 303, "{}", login.head);
    let cookie_line = login
        .head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap();
    assert!(cookie_line.contains("HttpOnly") && cookie_line.contains("SameSite=Strict"));
    let cookie = cookie_line
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let with_cookie = d.tcp("GET", "/v1/sandboxes", &[("Cookie", &cookie)], "");
    assert_eq!(with_cookie.status, 200);
    let again = d.tcp("GET", &format!("/ui?token={token}"), &[], "");
    assert_eq!(again.status, 401);
    // The UI is not built here: `/` says how to build it.
    let ui = d.tcp("GET", "/", &[], "");
    assert!(ui.body.contains("npm --prefix ui"), "{}", ui.body);
}

#[test]
fn bad_input_gets_the_right_code() {
    let d = Daemon::start();
    let unknown = d.unix("GET", "/v1/sandboxes/sbx_doesnotexist", "");
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (404, "not_found")
    );
    let cmd = d.unix("GET", "/v1/sandboxes/sbx_nope/commands/cmd_nope", "");
    assert_eq!(cmd.status, 404);
    let bad_json = d.unix("POST", "/v1/sandboxes", "{not json");
    assert_eq!(
        (bad_json.status, bad_json.code().as_str()),
        (400, "bad_request")
    );
    let negative = d.unix("POST", "/v1/sandboxes", r#"{"timeout_ms":-5}"#);
    assert_eq!(negative.status, 400);
    assert!(
        negative.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timeout_ms")
    );
    let wrong_type = d.unix("POST", "/v1/sandboxes", r#"{"vcpus":"two"}"#);
    assert!(
        wrong_type.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("vcpus")
    );
    let no_image = d.unix("POST", "/v1/sandboxes", r#"{"image":"base"}"#);
    assert_eq!(
        (no_image.status, no_image.code().as_str()),
        (400, "image_not_available")
    );
    let route = d.unix("GET", "/v1/nothing-here", "");
    assert_eq!((route.status, route.code().as_str()), (404, "not_found"));
    let extend = d.unix(
        "POST",
        "/v1/sandboxes/sbx_nope/extend",
        r#"{"duration_ms":-1}"#,
    );
    assert_eq!(extend.status, 400);
    let list = d.unix("GET", "/v1/sandboxes?status=bogus", "");
    assert_eq!(list.status, 400);
}

#[test]
fn serves_openapi_and_images() {
    let d = Daemon::start();
    let doc = d.unix("GET", "/v1/openapi.json", "");
    assert_eq!(doc.status, 200);
    let doc = doc.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["components"]["schemas"]["Sandbox"].is_object());
    let images = d.unix("GET", "/v1/images", "").json();
    let names: Vec<&str> = images
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"base") && names.contains(&"python3.13"),
        "{names:?}"
    );
    let events = d.unix("GET", "/v1/events?since=notanumber", "");
    assert_eq!(events.status, 400);
}

#[test]
fn sigterm_stops_cleanly_and_a_restart_keeps_the_token() {
    let mut d = Daemon::start();
    let token = d.token.clone();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!d.socket().exists());
    assert!(!d.home.path().join("run/belljard.pid").exists());
    let again = Command::new(env!("CARGO_BIN_EXE_belljard"))
        .args(["--port", "0", "--home"])
        .arg(d.home.path())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    d.child = again;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !d.socket().exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(d.home.path().join("config/token")).unwrap(),
        token
    );
    // A second daemon on the same home refuses to start.
    let second = Command::new(env!("CARGO_BIN_EXE_belljard"))
        .args(["--port", "0", "--home"])
        .arg(d.home.path())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("Another belljard"));
}
