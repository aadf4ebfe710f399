//! Finds, starts and stops the daemon, so that `belljar` works on a machine where nobody
//! started `belljard` yet: the first command starts it in the background, with the settings
//! of its last start (`belljar_client::settings`).

use std::fs::OpenOptions;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use belljar_client::ready::ReadySocket;
use belljar_client::settings::{self, DaemonSettings};
use belljar_client::{Client, Paths};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a freshly started daemon may take to answer on its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `daemon stop` waits for the daemon to exit before it gives up.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// `belljard` is neither next to `belljar` nor on `PATH`.
    #[error("Cannot find belljard next to {exe} or on PATH; set BELLJARD to its path")]
    NotFound { exe: String },
    /// Creating the log file or spawning the process failed.
    #[error("Cannot start {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    /// The daemon exited before it answered; `reason` is its own one-line error.
    #[error("belljard could not start: {reason} (see {log})")]
    Exited { reason: String, log: String },
    /// The daemon did not answer in time.
    #[error("belljard did not answer on {socket} within {secs}s; see {log}")]
    Timeout {
        socket: String,
        log: String,
        secs: u64,
    },
    /// There is no daemon to stop.
    #[error("The daemon is not running")]
    NotRunning,
    /// The daemon ignored SIGTERM.
    #[error("The daemon (pid {pid}) did not exit within {secs}s")]
    StopTimeout { pid: i32, secs: u64 },
    /// Sending a signal failed.
    #[error("Cannot signal the daemon (pid {pid}): {source}")]
    Signal { pid: i32, source: Errno },
}

impl LauncherError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotRunning => "not_running",
            _ => "daemon_unavailable",
        }
    }
}

/// Where `belljard` is: `$BELLJARD`, next to the running executable, or on `PATH`.
pub fn daemon_binary() -> Result<PathBuf, LauncherError> {
    if let Some(p) = std::env::var_os("BELLJARD").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(beside) = belljar_client::paths::beside_exe("belljard") {
        return Ok(beside);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("belljard");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let exe = std::env::current_exe().unwrap_or_default();
    Err(LauncherError::NotFound {
        exe: exe.display().to_string(),
    })
}

/// A client of the daemon, starting the daemon first if nothing answers on its socket.
pub async fn ensure_running(paths: &Paths) -> Result<Client, LauncherError> {
    let client = Client::local(paths);
    if !client.answers().await {
        start(paths, &[]).await?;
    }
    Ok(client)
}

/// Starts `belljard` detached (its own session, output to the log file) and waits until it
/// answers on its socket. Returns its process id. Where the user's systemd manager can give
/// it a delegated scope it starts in one (`belljar_client::scope`); when that start fails
/// (`systemd-run` refused, say), it starts directly, as it would without systemd.
pub async fn start(paths: &Paths, args: &[String]) -> Result<u32, LauncherError> {
    use belljar_client::scope::{Facts, Launch, decide};
    let launch = decide(&Facts::gather());
    match start_as(paths, args, &launch).await {
        Err(LauncherError::Exited { reason, .. }) if matches!(launch, Launch::Scope { .. }) => {
            let direct = Launch::Direct {
                reason: format!("the scoped start failed: {reason}"),
            };
            start_as(paths, args, &direct).await
        }
        other => other,
    }
}

async fn start_as(
    paths: &Paths,
    args: &[String],
    launch: &belljar_client::scope::Launch,
) -> Result<u32, LauncherError> {
    let bin = daemon_binary()?;
    let spawn_err = |source| LauncherError::Spawn {
        bin: bin.display().to_string(),
        source,
    };
    let log_file = paths.log_file();
    if let Some(dir) = log_file.parent() {
        std::fs::create_dir_all(dir).map_err(spawn_err)?;
    }
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_file)
        .map_err(spawn_err)?;
    // Only what this start writes explains why it failed.
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let log2 = log.try_clone().map_err(spawn_err)?;
    // In a delegated systemd scope, the daemon's sandbox groups live in a tree of its own.
    let (program, argv) = launch.command(&bin, args);
    let mut cmd = Command::new(program);
    cmd.args(argv).stdin(Stdio::null()).stdout(log).stderr(log2);
    detach(&mut cmd);
    // The daemon says when it listens (systemd's notify protocol; see `belljar_client::ready`).
    let runtime = paths
        .socket()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&runtime)
        .map_err(spawn_err)?;
    // The settings of the daemon's last start come back, so that one started by whichever
    // command found it down is the daemon the user set up; the caller's own variables win.
    if let Some(last) = DaemonSettings::load(&settings::path(paths)) {
        for (name, value) in settings::restored_env(&last, |k| std::env::var_os(k).is_some()) {
            cmd.env(name, value);
        }
    }
    let ready = ReadySocket::bind(&runtime).map_err(spawn_err)?;
    cmd.env(belljar_client::ready::ENV, ready.path());
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(spawn_err)?;
    let pid = child.id().unwrap_or_default();
    tokio::select! {
        told = ready.wait() => {
            told.map_err(spawn_err)?;
            Ok(pid)
        }
        status = child.wait() => Err(LauncherError::Exited {
            reason: failure_reason(&log_file, log_start).unwrap_or_else(|| match status {
                Ok(s) => format!("it exited with {s}"),
                Err(e) => format!("waiting for it failed: {e}"),
            }),
            log: log_file.display().to_string(),
        }),
        () = tokio::time::sleep(START_TIMEOUT) => Err(LauncherError::Timeout {
            socket: paths.socket().display().to_string(),
            log: log_file.display().to_string(),
            secs: START_TIMEOUT.as_secs(),
        }),
    }
}

/// Puts the child in its own session so that closing the terminal does not end the daemon.
#[allow(unsafe_code)]
fn detach(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls setsid(2), which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

/// The daemon's own error line (`belljard: error: ...`) among what it logged from byte
/// `from` on, or else its last line: why it did not start, in one line.
fn failure_reason(log: &Path, from: u64) -> Option<String> {
    let bytes = std::fs::read(log).ok()?;
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    let lines = || text.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .filter_map(|l| l.strip_prefix("belljard: error: "))
        .next_back()
        .or_else(|| lines().next_back())
        .map(str::to_owned)
}

/// Whether a process with this id exists.
pub fn alive(pid: i32) -> bool {
    matches!(kill(Pid::from_raw(pid), None), Ok(()) | Err(Errno::EPERM))
}

/// Asks the daemon to exit (SIGTERM; its sandboxes keep running) and waits until it has.
pub async fn stop(paths: &Paths) -> Result<i32, LauncherError> {
    let pid = match paths.pid() {
        Some(pid) if alive(pid) => pid,
        _ => return Err(LauncherError::NotRunning),
    };
    kill(Pid::from_raw(pid), Signal::SIGTERM)
        .map_err(|source| LauncherError::Signal { pid, source })?;
    let deadline = Instant::now() + STOP_TIMEOUT;
    while !exited(pid) {
        if Instant::now() > deadline {
            return Err(LauncherError::StopTimeout {
                pid,
                secs: STOP_TIMEOUT.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(pid)
}

/// A zombie has exited; only its parent has not reaped it yet (e.g. a test harness).
fn is_zombie(pid: i32) -> bool {
    use procfs_core::FromRead;
    procfs_core::process::Stat::from_file(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.state == 'Z')
}

/// Whether `pid` has exited: gone, or a zombie that only waits for its parent to reap it.
pub fn exited(pid: i32) -> bool {
    !alive(pid) || is_zombie(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_not_a_zombie() {
        let me = std::process::id() as i32;
        assert!(alive(me));
        assert!(!is_zombie(me));
    }

    #[test]
    fn an_unreaped_child_has_exited_while_its_pid_lives_on() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_zombie(pid) {
            assert!(Instant::now() < deadline, "`true` did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(alive(pid) && exited(pid));
        child.wait().unwrap();
        assert!(exited(pid) && !is_zombie(pid));
    }

    #[test]
    fn reaped_process_is_not_alive() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!alive(pid));
    }

    #[tokio::test]
    async fn stop_without_daemon_says_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::under_home(dir.path());
        assert!(matches!(stop(&paths).await, Err(LauncherError::NotRunning)));
    }

    #[test]
    fn the_failure_reason_is_the_daemons_error_line_of_this_start() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let old = "belljard: error: an earlier failure\n";
        std::fs::write(
            &log,
            format!("{old}INFO starting\nbelljard: error: Cannot listen on 127.0.0.1:7423: Address in use\n   \n"),
        )
        .unwrap();
        assert_eq!(
            failure_reason(&log, old.len() as u64).as_deref(),
            Some("Cannot listen on 127.0.0.1:7423: Address in use")
        );
        std::fs::write(&log, "a\nthe last line\n").unwrap();
        assert_eq!(failure_reason(&log, 0).as_deref(), Some("the last line"));
        assert_eq!(failure_reason(&log, 1000), None);
        assert_eq!(failure_reason(&dir.path().join("none"), 0), None);
    }
}
