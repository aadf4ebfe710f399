//! Shared helpers of the end-to-end tests: find the built binaries, check that the guest
//! images exist, and run a real `belljard` in a temporary `BELLJAR_HOME` that is torn down
//! (sandboxes deleted, daemon stopped) even when a test fails.

#![forbid(unsafe_code)]

pub mod events;
pub mod host;
pub mod microvm;
pub mod oci;
pub mod snapshots;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use belljar_api::{BackendChoice, CreateSandbox, ListSandboxesQuery, Sandbox};
use belljar_cli::launcher;
use belljar_client::{Client, Paths};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a daemon may take to answer after it was spawned.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory holding the workspace's built binaries (`target/<profile>`), found from the
/// running test executable (`target/<profile>/deps/e2e_*`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    if deps.ends_with("deps") {
        deps.parent().expect("target/<profile>").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// A built binary of the workspace; panics with the command to build it when missing.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// The image cache the daemon reads (`BELLJAR_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/belljar`).
pub fn cache_dir() -> PathBuf {
    let over = std::env::var_os("BELLJAR_CACHE").map(PathBuf::from);
    belljar_client::paths::image_cache(over.as_deref()).expect("a home directory")
}

/// Panics, naming the script that builds it, unless image `name` has been built.
pub fn require_image(name: &str) {
    let dir = cache_dir().join("images").join(name).join("current");
    assert!(
        dir.exists(),
        "image {name:?} is not built ({} is missing): run `guest-images/build-image.sh {name}`",
        dir.display()
    );
}

/// Polls `check` every 50 ms until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How a test daemon was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartedBy {
    /// `belljard --home DIR --port 0`, spawned by the test.
    Direct,
    /// `belljar daemon start --port 0` with `BELLJAR_HOME=DIR`.
    Cli,
}

/// A real daemon in a temporary home. Dropping it deletes its sandboxes and stops it.
pub struct Daemon {
    pub home: tempfile::TempDir,
    pub paths: Paths,
    started_by: StartedBy,
    /// Extra environment of the daemon, kept for restarts.
    env: Vec<(String, String)>,
}

impl Daemon {
    /// Starts `belljard` directly; needs the `base` image.
    pub fn start() -> Self {
        Self::start_with(StartedBy::Direct, &[])
    }

    /// Starts `belljard` directly with extra environment (e.g. a small output limit).
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
        Self::start_with(StartedBy::Direct, env)
    }

    /// Starts the daemon through `belljar daemon start`.
    pub fn start_via_cli() -> Self {
        Self::start_with(StartedBy::Cli, &[])
    }

    /// Starts the daemon through `belljar daemon start` with extra environment (it passes to
    /// the daemon, and again on [`Daemon::restart`]).
    pub fn start_via_cli_with_env(env: &[(&str, &str)]) -> Self {
        Self::start_with(StartedBy::Cli, env)
    }

    fn start_with(started_by: StartedBy, env: &[(&str, &str)]) -> Self {
        require_image("base");
        let home = tempfile::Builder::new()
            .prefix("belljar-e2e-")
            .tempdir()
            .expect("temporary BELLJAR_HOME");
        let paths = Paths::under_home(home.path());
        let d = Self {
            home,
            paths,
            started_by,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        d.spawn();
        d
    }

    fn spawn(&self) {
        match self.started_by {
            StartedBy::Direct => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.log_path())
                    .expect("daemon log");
                let mut child = Command::new(binary("belljard"))
                    .arg("--home")
                    .arg(self.home.path())
                    .args(["--port", "0"])
                    .env("BELLJAR_HOME", self.home.path())
                    .envs(self.env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().expect("log"))
                    .stderr(log)
                    .spawn()
                    .expect("spawn belljard");
                let deadline = Instant::now() + START_TIMEOUT;
                while !self.answers() {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!(
                            "belljard exited with {status} before answering; log:\n{}",
                            self.log()
                        );
                    }
                    assert!(
                        Instant::now() < deadline,
                        "belljard did not answer within {START_TIMEOUT:?}; log:\n{}",
                        self.log()
                    );
                    std::thread::sleep(Duration::from_millis(25));
                }
                // The daemon outlives this handle; reap it in the background when it exits.
                std::thread::spawn(move || {
                    let _ = child.wait();
                });
            }
            StartedBy::Cli => {
                let out = self
                    .cli_command()
                    .envs(self.env.iter().map(|(k, v)| (k, v)))
                    .args(["daemon", "start", "--port", "0"])
                    .output()
                    .expect("run belljar");
                assert!(
                    out.status.success(),
                    "belljar daemon start failed: {}\nlog:\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    self.log()
                );
            }
        }
        // The port file appears with the listener; wait for it too.
        let deadline = Instant::now() + START_TIMEOUT;
        while self.paths.port().is_none() || self.paths.token().is_none() {
            assert!(
                Instant::now() < deadline,
                "belljard wrote no port or token file; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Where the daemon's output goes.
    pub fn log_path(&self) -> PathBuf {
        match self.started_by {
            StartedBy::Direct => self.home.path().join("belljard.log"),
            StartedBy::Cli => self.paths.log_file(),
        }
    }

    /// The daemon's output so far, for failure messages.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    fn answers(&self) -> bool {
        std::os::unix::net::UnixStream::connect(self.paths.socket()).is_ok()
            && block_on(self.unix().answers())
    }

    /// A client over the Unix socket (no token needed).
    pub fn unix(&self) -> Client {
        Client::local(&self.paths)
    }

    /// A client over 127.0.0.1 with the bearer token.
    pub fn http(&self) -> Client {
        Client::local_tcp(&self.paths).expect("daemon port file")
    }

    /// A client over 127.0.0.1 without a token.
    pub fn http_without_token(&self) -> Client {
        Client::tcp(self.addr(), None)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        let port = self.paths.port().expect("daemon port file");
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        self.paths.pid().expect("daemon pid file")
    }

    /// A `belljar` invocation against this daemon.
    pub fn cli_command(&self) -> Command {
        let mut cmd = Command::new(binary("belljar"));
        cmd.env("BELLJAR_HOME", self.home.path())
            .env("BELLJARD", binary("belljard"))
            // A daemon the CLI starts by itself must not take the default port.
            .env("BELLJAR_PORT", "0")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `belljar ARGS...` to completion.
    pub fn cli<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cli_command().args(args).output().expect("run belljar")
    }

    /// `kill -9` the daemon and wait until it is gone.
    pub fn kill9(&self) {
        let pid = self.pid();
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 belljard");
        wait_gone(pid, Duration::from_secs(10));
    }

    /// Starts the daemon again on the same home (after [`Daemon::kill9`]).
    pub fn restart(&self) {
        self.spawn();
    }

    /// [`Daemon::restart`] with `env` in place of the extra environment it was started with.
    pub fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.spawn();
    }

    /// Creates a `base` sandbox on the namespace backend over `client`.
    pub async fn create(&self, client: &Client, req: CreateSandbox) -> Sandbox {
        let req = CreateSandbox {
            backend: req.backend.or(Some(BackendChoice::Namespace)),
            ..req
        };
        match client.create_sandbox(&req).await {
            Ok(s) => s,
            Err(e) => panic!(
                "create sandbox failed: {e} ({})\nlog:\n{}",
                e.code(),
                self.log()
            ),
        }
    }

    fn cleanup(&self) {
        let pid = self.paths.pid();
        if pid.is_none_or(|p| !launcher::alive(p)) {
            // The test killed it; bring it back so that it can delete what it adopted.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spawn())).is_err() {
                return;
            }
        }
        let client = self.unix();
        block_on(async {
            if let Ok(all) = client.all_sandboxes(&ListSandboxesQuery::default()).await {
                for s in all {
                    let _ = client.delete_sandbox(&s.id).await;
                }
            }
        });
        if let Some(pid) = self.paths.pid() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            if !wait_gone(pid, Duration::from_secs(10)) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                wait_gone(pid, Duration::from_secs(5));
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Waits until `pid` has exited (or is a zombie); false on timeout.
pub fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !launcher::exited(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Runs a future to completion on a private runtime in its own thread, so that it works both
/// from plain code and from inside a test's runtime (where `Drop` runs).
pub fn block_on<F>(fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(fut)
        })
        .join()
        .expect("block_on thread")
    })
}

/// Text of a command's stdout.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Text of a command's stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A file of `len` pseudo-random bytes (every byte value occurs), for round trips.
pub fn random_file(path: &Path, len: usize) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    std::fs::write(path, data).expect("write random file");
}

/// Whether two files hold the same bytes.
pub fn same_file(a: &Path, b: &Path) -> bool {
    std::fs::read(a).expect("read a") == std::fs::read(b).expect("read b")
}

/// Runs `argv` in the sandbox (as root with `sudo`, else as its user), follows its output to
/// the end and returns its exit code (-1 when it has none) and output.
pub async fn run(c: &Client, id: &str, argv: &[&str], sudo: bool) -> (i32, String) {
    let cmd = c
        .run_command(
            id,
            &belljar_api::RunCommand {
                argv: argv.iter().map(|a| (*a).to_owned()).collect(),
                sudo,
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("run {argv:?}: {e}"));
    let mut lines = c.command_logs(id, &cmd.id, true).await.unwrap();
    let mut out = Vec::new();
    while let Some(l) = lines.next().await.unwrap() {
        out.extend(belljar_client::log_bytes(&l));
    }
    let done = c.wait_command(id, &cmd.id).await.unwrap();
    (
        done.exit_code.unwrap_or(-1),
        String::from_utf8_lossy(&out).into_owned(),
    )
}

/// Runs `script` with `sh -c` as root in the sandbox; see [`run`].
pub async fn sh(c: &Client, id: &str, script: &str) -> (i32, String) {
    run(c, id, &["sh", "-c", script], true).await
}

/// Like [`sh`], and the script must succeed; returns its output.
pub async fn sh_ok(c: &Client, id: &str, script: &str) -> String {
    let (code, out) = sh(c, id, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_dir_is_above_deps() {
        assert!(!bin_dir().ends_with("deps"));
    }

    #[test]
    fn random_files_are_deterministic_and_varied() {
        let dir = tempfile::tempdir().unwrap();
        random_file(&dir.path().join("a"), 4096);
        random_file(&dir.path().join("b"), 4096);
        assert!(same_file(&dir.path().join("a"), &dir.path().join("b")));
        let data = std::fs::read(dir.path().join("a")).unwrap();
        let mut seen = [false; 256];
        for b in data {
            seen[b as usize] = true;
        }
        assert!(seen.iter().filter(|s| **s).count() > 200);
    }

    #[tokio::test]
    async fn eventually_returns_the_value() {
        let mut n = 0;
        let v = eventually(Duration::from_secs(1), "n to reach 3", || {
            n += 1;
            let v = n;
            async move { (v >= 3).then_some(v) }
        })
        .await;
        assert_eq!(v, 3);
    }

    #[test]
    fn block_on_works_inside_a_runtime() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let v = rt.block_on(async { block_on(async { 41 + 1 }) });
        assert_eq!(v, 42);
    }
}
