//! The real `belljar` binary writing into a pipe whose reader is gone (`belljar ... | head -1`):
//! it must end quietly with status 141, not panic with status 101.

use std::process::{Command, Output, Stdio};

/// Runs `belljar ARGS` with stdout on a pipe that nobody reads any more, in an empty home.
fn into_closed_pipe(args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    let (read, write) = nix::unistd::pipe().unwrap();
    // Closed before the CLI starts, so its first write already fails with EPIPE.
    drop(read);
    Command::new(env!("CARGO_BIN_EXE_belljar"))
        .args(args)
        .env("BELLJAR_HOME", home.path())
        .env("BELLJARD", "/nonexistent/belljard")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly_with_status_141() {
    for args in [
        &["completions", "bash"][..],
        &["daemon", "status"],
        &["daemon", "status", "--json"],
    ] {
        let out = into_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
    }
}
