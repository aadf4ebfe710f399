//! Two daemons on one machine: the second (another home) takes a free port when the default
//! port is taken, keeps serving, and says where in its port file; a port asked for by name
//! that is taken is one clear line of error.

mod common;

use std::net::TcpListener;
use std::process::{Command, Stdio};

use common::Daemon;

#[test]
fn a_taken_default_port_falls_back_and_a_taken_explicit_port_is_one_line() {
    // Hold the default port for the whole test, unless someone else already does: taken
    // either way.
    let _held = TcpListener::bind(("127.0.0.1", belljar_api::routes::DEFAULT_PORT));
    let first = Daemon::start_with(&[]);
    let second = Daemon::start_with(&[]);
    for d in [&first, &second] {
        assert_ne!(d.port, belljar_api::routes::DEFAULT_PORT);
        assert_eq!(d.unix("GET", "/v1/info", "").status, 200);
        assert_eq!(d.tcp_authed("GET", "/v1/info", "").status, 200);
    }
    assert_ne!(first.port, second.port);

    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_belljard"))
        .args(["--port", &first.port.to_string(), "--home"])
        .arg(home.path())
        .env("BELLJAR_UI_DIR", home.path().join("no-ui"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("belljard: error:"))
        .collect();
    assert_eq!(
        errors,
        [format!(
            "belljard: error: Cannot listen on 127.0.0.1:{}: Address already in use (os error 98)",
            first.port
        )],
        "{stderr}"
    );
    assert!(
        !stderr.contains("Caused by") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}
