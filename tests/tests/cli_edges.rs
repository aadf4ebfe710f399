//! The CLI at its edges, against a real daemon: output into a pipe whose reader went away
//! (`belljar info ID | head -1`), and a daemon that cannot start because the port asked for
//! is taken.

use std::process::{Output, Stdio};

use belljar_e2e::{Daemon, stderr, stdout};

/// `belljar ARGS` against `d` with stdout on a pipe that nobody reads any more.
fn into_closed_pipe(d: &Daemon, args: &[&str]) -> Output {
    let (read, write) = nix::unistd::pipe().unwrap();
    // Closed before the CLI starts, so its first write fails with EPIPE.
    drop(read);
    d.cli_command()
        .args(args)
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_with_141() {
    let d = Daemon::start_via_cli();
    let out = d.cli(["create", "--backend", "namespace"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let out = d.cli(["exec", &id, "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for args in [
        vec!["info", &id],
        vec!["info", &id, "--json"],
        vec!["ls"],
        vec!["ls", "--json"],
        vec!["exec", &id, "--", "seq", "1", "100000"],
        vec!["logs", &id],
    ] {
        let out = into_closed_pipe(&d, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_daemon_that_cannot_take_its_port_is_one_line_of_error() {
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let d = Daemon::start_via_cli();
    let out = d.cli(["daemon", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli(["daemon", "start", "--port", &port]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "error: belljard could not start: Cannot listen on 127.0.0.1:{port}: Address already in use"
        )),
        "{err}"
    );
}
