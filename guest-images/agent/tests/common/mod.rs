//! Starts the real `belljar-agent` binary in plain mode on a Unix socket in a temporary
//! directory and connects the proto crate's client to it.

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use belljar_agent_proto::client::AgentClient;
use belljar_agent_proto::{CommandInfo, OutputLine, StartCommand};
use futures::TryStreamExt;

pub struct Agent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub client: AgentClient,
    pub socket: PathBuf,
}

impl Agent {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Self {
        Self::start_wrapped(&[], "plain", extra).await
    }

    /// Starts the agent under `wrapper` (e.g. `unshare ...`) in `mode`.
    pub async fn start_wrapped(wrapper: &[&str], mode: &str, extra: &[&str]) -> Self {
        Self::launch(wrapper, mode, extra, &[], &[]).await
    }

    /// Starts the agent with the signals `ignored` set to SIG_IGN and `blocked` in its signal
    /// mask, as a parent (a daemon under `nohup`, a runtime that blocks signals) may pass them
    /// down: both survive `execve`.
    pub async fn start_with_inherited_signals(ignored: &[i32], blocked: &[i32]) -> Self {
        Self::launch(&[], "plain", &[], ignored, blocked).await
    }

    async fn launch(
        wrapper: &[&str],
        mode: &str,
        extra: &[&str],
        ignored: &[i32],
        blocked: &[i32],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("files")).unwrap();
        Self::launch_in(dir, wrapper, mode, extra, ignored, blocked).await
    }

    /// Kills the agent with SIGKILL, as a sandbox stopped hard ends it, and starts a new one
    /// on the same directories (files, state), as the sandbox's next start does.
    pub async fn kill_and_restart(mut self) -> Self {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let dir = tempfile::Builder::new().tempdir().unwrap();
        // The old harness's directory is taken over, not deleted with it.
        let old = std::mem::replace(&mut self.dir, dir);
        drop(self);
        let _ = std::fs::remove_file(old.path().join("agent.sock"));
        Self::launch_in(old, &[], "plain", &[], &[], &[]).await
    }

    async fn launch_in(
        dir: tempfile::TempDir,
        wrapper: &[&str],
        mode: &str,
        extra: &[&str],
        ignored: &[i32],
        blocked: &[i32],
    ) -> Self {
        let socket = dir.path().join("agent.sock");
        let program = env!("CARGO_BIN_EXE_belljar-agent");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(program);
                cmd
            }
            None => Command::new(program),
        };
        cmd.arg("--mode")
            .arg(mode)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(extra)
            .env("BELLJAR_LOG", "warn")
            .stdin(Stdio::null())
            // Its own process group, so that dropping the harness also ends a wrapped agent.
            .process_group(0);
        let (ignored, blocked) = (ignored.to_vec(), blocked.to_vec());
        // SAFETY: the closure makes only async-signal-safe calls (rt_sigaction through a raw
        // syscall, so that glibc's reserved signals can be set too, and sigprocmask) on memory
        // allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                // A zeroed kernel `struct sigaction` with the handler set to SIG_IGN.
                let ignore: [usize; 4] = [libc::SIG_IGN, 0, 0, 0];
                for &sig in &ignored {
                    if libc::syscall(
                        libc::SYS_rt_sigaction,
                        sig,
                        ignore.as_ptr(),
                        std::ptr::null_mut::<libc::c_void>(),
                        8usize,
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                let mut mask: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut mask);
                for &sig in &blocked {
                    libc::sigaddset(&mut mask, sig);
                }
                if libc::sigprocmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            if let Ok(client) = AgentClient::connect_unix(&socket).await
                && client.health().await.is_ok()
            {
                break client;
            }
            assert!(Instant::now() < deadline, "agent did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Agent {
            child,
            dir,
            client,
            socket,
        }
    }

    /// A fresh connection, as a daemon that restarted would open.
    pub async fn connect(&self) -> AgentClient {
        AgentClient::connect_unix(&self.socket).await.unwrap()
    }

    /// An absolute path under the test's scratch directory.
    pub fn path(&self, rel: &str) -> String {
        self.dir
            .path()
            .join("files")
            .join(rel)
            .display()
            .to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's peak resident set size so far, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        use procfs_core::FromRead;
        procfs_core::process::Status::from_file(format!("/proc/{}/status", self.pid()))
            .unwrap()
            .vmhwm
            .expect("VmHWM in /proc/PID/status")
    }

    /// Runs a command to its end and returns its final info and all its output.
    pub async fn run(&self, start: StartCommand) -> (CommandInfo, Vec<OutputLine>) {
        let info = self.client.start_command(&start).await.unwrap();
        let lines: Vec<OutputLine> = self
            .client
            .output(&info.id, 0, true)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let info = self.client.wait_command(&info.id).await.unwrap();
        (info, lines)
    }

    /// Runs `sh -c script` and returns its info, stdout and stderr.
    pub async fn sh(&self, script: &str) -> (CommandInfo, String, String) {
        let (info, lines) = self.run(argv(&["/bin/sh", "-c", script])).await;
        let (out, err) = split(&lines);
        (
            info,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn argv(args: &[&str]) -> StartCommand {
    StartCommand {
        argv: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// Waits for a command, then reads (without following) all of its output.
pub async fn wait_then_read(client: &AgentClient, id: &str) -> (CommandInfo, Vec<OutputLine>) {
    let info = client.wait_command(id).await.unwrap();
    let lines = client
        .output(id, 0, false)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    (info, lines)
}

/// Concatenated stdout and stderr bytes.
pub fn split(lines: &[OutputLine]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for line in lines {
        match line.stream {
            belljar_agent_proto::Stream::Stdout => out.extend(line.bytes()),
            belljar_agent_proto::Stream::Stderr => err.extend(line.bytes()),
        }
    }
    (out, err)
}

/// Whether `pid` has ended and waits to be reaped; false once it is gone.
pub fn is_zombie(pid: u32) -> bool {
    use procfs_core::FromRead;
    procfs_core::process::Stat::from_file(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.state == 'Z')
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    // Not a format procfs-core parses: a plain list of PIDs.
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether a test that needs root can run; off root it says so and is not run. CI runs as
/// root, so there a run without root fails instead of passing without testing anything.
pub fn root_or_not_run(why: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI runs as root ({why})");
    eprintln!("not run: needs root ({why})");
    false
}
