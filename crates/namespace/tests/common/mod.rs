//! What the namespace backend's tests with real sandboxes share: a sandbox's spec with the
//! stand-in agent from `belljar_namespace::testing` as PID 1, a shell in it, and a guard that
//! destroys it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use belljar_namespace::testing::{self, Output};
use belljar_namespace::{Limits, SandboxSpec};

/// How long a sandbox may take to answer.
pub const T: Duration = Duration::from_secs(20);

/// A sandbox named `id` with its state under `tmp` and no layers, mounts or disk.
pub fn spec(tmp: &Path, id: &str, limits: Limits) -> SandboxSpec {
    let (rootfs, agent) = testing::fixtures().expect("fixtures");
    SandboxSpec {
        // Unique per process, so concurrent test runs on one machine do not share cgroups.
        id: format!("{id}-{}", std::process::id()),
        rootfs,
        layers: Vec::new(),
        state_dir: tmp.join(id),
        agent,
        hostname: format!("{id}-host"),
        limits,
        env: vec![("BELLJAR_TEST".into(), "1".into())],
        mounts: vec![],
        binds: vec![],
        durable: false,
    }
}

/// Runs `cmd` with `sh -c` in the sandbox; panics if its agent does not answer.
pub fn sh(socket: &Path, cmd: &str) -> Output {
    testing::shell(socket, cmd, T).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// Destroys the sandbox even when an assertion fails, so no test leaves one running.
pub struct Guard(pub PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = belljar_namespace::destroy(&self.0);
    }
}

/// A scratch directory for sandboxes' state, under `/tmp`.
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bjns")
        .tempdir_in("/tmp")
        .unwrap()
}
