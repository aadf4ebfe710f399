//! Launch, adopt, stop and destroy real namespace sandboxes (as root here), with the stand-in
//! agent from `belljar_namespace::testing` as PID 1.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belljar_namespace::testing::{self, Output};
use belljar_namespace::{Limits, SandboxSpec};

const T: Duration = Duration::from_secs(20);

fn spec(tmp: &Path, id: &str, limits: Limits) -> SandboxSpec {
    let (rootfs, agent) = testing::fixtures().expect("fixtures");
    SandboxSpec {
        id: id.into(),
        rootfs,
        state_dir: tmp.join(id),
        agent,
        hostname: format!("{id}-host"),
        limits,
        env: vec![("BELLJAR_TEST".into(), "1".into())],
    }
}

fn sh(socket: &Path, cmd: &str) -> Output {
    testing::shell(socket, cmd, T).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bjns")
        .tempdir_in("/tmp")
        .unwrap()
}

#[test]
fn launch_run_stop_destroy() {
    let tmp = tmpdir();
    let spec = spec(tmp.path(), "life", Limits::default());
    let running = belljar_namespace::launch(&spec).expect("launch");
    assert_eq!(running.socket, spec.state_dir.join("run/agent.sock"));
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    let out = sh(
        &running.socket,
        "echo $$; hostname; id -u; cat /workspace/hello.txt; echo $BELLJAR_TEST",
    );
    assert_eq!(out.code, 0, "{}", out.text);
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines[1], "life-host");
    assert_eq!(lines[2], "0");
    assert_eq!(lines[3], "hello from the image");
    assert_eq!(lines[4], "1");
    // PID 1 is the agent.
    let out = sh(&running.socket, "cat /proc/1/cmdline | tr '\\0' ' '");
    assert_eq!(
        out.text.trim(),
        "/sbin/belljar-agent --mode namespace --listen unix:/run/belljar/agent.sock"
    );
    belljar_namespace::stop(&spec.state_dir, Duration::from_secs(2)).unwrap();
    assert!(belljar_namespace::adopt(&spec.state_dir).unwrap().is_none());
    belljar_namespace::destroy(&spec.state_dir).unwrap();
    assert!(!spec.state_dir.exists());
}
