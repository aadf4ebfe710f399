//! Commands run in the sandbox: starting them as the right user with pipes or a PTY, pumping
//! their output to disk as it comes, stdin, signals, resizes, and waiting for their exit.

mod child;
mod follow;
pub mod output;
pub mod spawn;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belljar_agent_proto::{CommandInfo, CommandStatus, PtySize, StartCommand, Stream};
use bytes::Bytes;
use futures::{Stream as FutStream, StreamExt};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::error::AgentError;
use crate::fdio::FdStream;
use crate::reaper::{Exit, Reaper};
use crate::users::{self, User};
use output::{Chunk, OutputLog, utf8_cut};

/// How long output is still read after a command exited when nothing more arrives: a
/// background process that kept the pipe open must not hold the stream open forever.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How long output is read after a command exited at most, however often more arrives: a
/// background process that keeps the pipe open and writes more often than [`DRAIN_GRACE`]
/// must not keep a wait from answering. What the command itself wrote before it exited is in
/// the pipe already and is read at once.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// The PATH commands get unless they set their own.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

type ExitState = Option<(Exit, i64)>;

/// One started command.
#[derive(Debug)]
pub struct Command {
    seq: u64,
    id: String,
    argv: Vec<String>,
    cwd: String,
    user: String,
    pid: u32,
    started_at: i64,
    exit: watch::Sender<ExitState>,
    stdin: tokio::sync::Mutex<Option<FdStream>>,
    pty: bool,
    /// Kept for resizes while the command runs; closed when it exits so that a long-lived
    /// agent does not collect descriptors.
    pty_master: Mutex<Option<OwnedFd>>,
    log: Arc<OutputLog>,
    /// The client's id for it, so that a client can find it again after losing the answer.
    client_id: Option<String>,
}

impl Command {
    /// The command as the API reports it.
    pub fn info(&self) -> CommandInfo {
        let exit = *self.exit.borrow();
        let (exit_code, signal) = match exit {
            Some((Exit::Code(c), _)) => (Some(c), None),
            Some((Exit::Signal(s), _)) => (None, Some(s)),
            None => (None, None),
        };
        CommandInfo {
            id: self.id.clone(),
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            pty: self.pty,
            pid: self.pid,
            status: if exit.is_some() {
                CommandStatus::Exited
            } else {
                CommandStatus::Running
            },
            exit_code,
            signal,
            started_at: self.started_at,
            finished_at: exit.map(|(_, at)| at),
            output_truncated_bytes: self.log.progress().dropped,
            client_id: self.client_id.clone(),
        }
    }

    fn exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Once the command has exited and its output is complete.
    async fn ended(&self) {
        let mut exit = self.exit.subscribe();
        let _ = exit.wait_for(Option::is_some).await;
        self.log.closed().await;
    }
}

/// Every command of the sandbox's life.
#[derive(Debug)]
pub struct Commands {
    reaper: Arc<Reaper>,
    dir: PathBuf,
    limit: u64,
    next: AtomicU64,
    map: Mutex<HashMap<String, Arc<Command>>>,
    /// Agent ids by client id. Held across a start with a client id, so that two starts with
    /// the same id cannot both run the command.
    by_client: Mutex<Clients>,
}

/// What starts with a client id are checked against, under one lock.
#[derive(Debug, Default)]
struct Clients {
    /// Agent ids by client id.
    ids: HashMap<String, String>,
    /// Once set, starts of another epoch are refused (see `StartCommand::epoch`).
    fence: Option<u64>,
}

impl Commands {
    /// Keeps output under `state_dir/commands`, at most `limit` bytes per command.
    pub fn new(reaper: Arc<Reaper>, state_dir: &Path, limit: u64) -> std::io::Result<Self> {
        let dir = state_dir.join("commands");
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            reaper,
            dir,
            limit,
            next: AtomicU64::new(1),
            map: Mutex::new(HashMap::new()),
            by_client: Mutex::default(),
        })
    }

    /// Starts a command and returns at once. A start with a client id that a command of this
    /// sandbox already has returns that command instead.
    pub fn start(&self, req: StartCommand) -> Result<CommandInfo, AgentError> {
        let Some(client_id) = req.client_id.clone() else {
            return self.start_new(req);
        };
        if client_id.is_empty()
            || client_id.len() > belljar_agent_proto::MAX_CLIENT_ID_LEN
            || client_id.chars().any(char::is_control)
        {
            return Err(AgentError::BadRequest(format!(
                "client_id must be 1..={} bytes without control characters",
                belljar_agent_proto::MAX_CLIENT_ID_LEN
            )));
        }
        let mut clients = self.by_client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = clients.ids.get(&client_id) {
            return Ok(self.get(existing)?.info());
        }
        if let (Some(epoch), Some(fence)) = (req.epoch, clients.fence)
            && epoch != fence
        {
            return Err(AgentError::StaleStart { epoch, fence });
        }
        let info = self.start_new(req)?;
        clients.ids.insert(client_id, info.id.clone());
        Ok(info)
    }

    fn start_new(&self, req: StartCommand) -> Result<CommandInfo, AgentError> {
        if req.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(AgentError::BadRequest("argv must name a program".into()));
        }
        if req.argv.iter().any(|a| a.contains('\0')) {
            return Err(AgentError::BadRequest("argv must not contain NUL".into()));
        }
        let user = users::resolve(req.user.as_deref())?;
        let cwd = match req.cwd {
            Some(cwd) if !cwd.starts_with('/') => return Err(AgentError::InvalidPath(cwd)),
            Some(cwd) => cwd,
            None => default_cwd(&user),
        };
        match std::fs::metadata(&cwd) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(AgentError::NotADirectory(cwd)),
            Err(e) => return Err(AgentError::io(e, &cwd)),
        }
        let mut env = base_env(&user, req.pty.is_some());
        env.extend(req.env);

        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("cmd-{seq}");
        let log = OutputLog::new(self.dir.join(format!("{id}.ndjson")));
        let spec = spawn::Spec {
            argv: &req.argv,
            cwd: &cwd,
            env: env.into_iter().collect(),
            user: &user,
            switch_user: nix::unistd::geteuid().is_root(),
            pty: req.pty,
            stdin: req.stdin,
        };
        let (pid, spawned, exit_rx) = self
            .reaper
            .spawn(|| spawn::spawn(&spec).map(|s| (s.pid, s)))
            .map_err(|e| AgentError::ExecFailed {
                program: req.argv[0].clone(),
                reason: e.to_string(),
            })?;

        let internal = |e: std::io::Error| AgentError::Internal(e.to_string());
        let (chunks_tx, chunks_rx) = mpsc::channel::<Chunk>(16);
        let (exit_tx, _) = watch::channel(None);
        let mut stdin = None;
        if let Some(master) = &spawned.pty_master {
            let reader = FdStream::new(master.try_clone().map_err(internal)?).map_err(internal)?;
            tokio::spawn(pump(
                reader,
                Stream::Stdout,
                chunks_tx.clone(),
                exit_tx.subscribe(),
            ));
            stdin = Some(FdStream::new(master.try_clone().map_err(internal)?).map_err(internal)?);
        }
        for (fd, stream) in [
            (spawned.stdout, Stream::Stdout),
            (spawned.stderr, Stream::Stderr),
        ] {
            if let Some(fd) = fd {
                let reader = FdStream::new(fd).map_err(internal)?;
                tokio::spawn(pump(reader, stream, chunks_tx.clone(), exit_tx.subscribe()));
            }
        }
        drop(chunks_tx);
        if let Some(fd) = spawned.stdin {
            stdin = Some(FdStream::new(fd).map_err(internal)?);
        }

        let command = Arc::new(Command {
            seq,
            id: id.clone(),
            argv: req.argv,
            cwd,
            user: user.name,
            pid,
            started_at: now_ms(),
            exit: exit_tx,
            stdin: tokio::sync::Mutex::new(stdin),
            pty: spawned.pty_master.is_some(),
            pty_master: Mutex::new(spawned.pty_master),
            log: Arc::new(log),
            client_id: req.client_id,
        });
        {
            let command = command.clone();
            tokio::spawn(async move {
                let exit = exit_rx.await.unwrap_or(Exit::Signal(libc::SIGKILL));
                command.exit.send_replace(Some((exit, now_ms())));
                *command.stdin.lock().await = None;
                command
                    .pty_master
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
            });
        }
        {
            let log = command.log.clone();
            let mut exited = command.exit.subscribe();
            let limit = self.limit;
            tokio::spawn(async move {
                let done = async move {
                    let _ = exited.wait_for(Option::is_some).await;
                };
                log.write_from(chunks_rx, limit, done).await;
            });
        }
        let info = command.info();
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, command);
        Ok(info)
    }

    fn get(&self, id: &str) -> Result<Arc<Command>, AgentError> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| AgentError::CommandNotFound(id.to_owned()))
    }

    /// Every command, in the order they were started. With `fence`, starts of any other
    /// epoch are refused from now on; the fence is set and the list taken under the lock that
    /// starts hold, so a start is either in the list or refused. Returns the fence in force.
    pub fn list(&self, fence: Option<u64>) -> (Vec<CommandInfo>, Option<u64>) {
        let mut clients = self.by_client.lock().unwrap_or_else(|e| e.into_inner());
        if fence.is_some() {
            clients.fence = fence;
        }
        (self.list_all(), clients.fence)
    }

    fn list_all(&self) -> Vec<CommandInfo> {
        let mut all: Vec<_> = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by_key(|c| c.seq);
        all.iter().map(|c| c.info()).collect()
    }

    /// The command now, or, when `wait` is set, once it has exited and its output is
    /// complete: its pipes reached EOF (or, after the exit, stayed quiet for [`DRAIN_GRACE`]
    /// or were read for [`DRAIN_LIMIT`]) and every byte read is in the output file. A client
    /// that waits and then reads the output must find all of it, however fast the command
    /// exited.
    pub async fn info(&self, id: &str, wait: bool) -> Result<CommandInfo, AgentError> {
        let command = self.get(id)?;
        if wait {
            command.ended().await;
        }
        Ok(command.info())
    }

    /// The command's output as NDJSON from line `skip`, followed when `follow` is set.
    pub fn output(
        &self,
        id: &str,
        skip: u64,
        follow: bool,
    ) -> Result<impl FutStream<Item = std::io::Result<Bytes>> + Send + 'static, AgentError> {
        let command = self.get(id)?;
        Ok(follow::sent_by(move |tx| async move {
            if let Err(e) = command.log.read_into(skip, follow, tx.clone()).await {
                let _ = tx.send(Err(e)).await;
            }
        }))
    }

    /// Writes `body` to the command's stdin; at its end closes stdin (a PTY gets ^D instead).
    pub async fn write_stdin<S, E>(&self, id: &str, body: S, close: bool) -> Result<(), AgentError>
    where
        S: FutStream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let command = self.get(id)?;
        let mut stdin = command.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(if command.exited() {
                AgentError::CommandFinished(id.to_owned())
            } else {
                AgentError::BadRequest(format!("{id} has no open stdin"))
            });
        };
        let broken = |e: std::io::Error| match e.raw_os_error() {
            Some(libc::EPIPE) => AgentError::CommandFinished(id.to_owned()),
            _ => AgentError::Internal(e.to_string()),
        };
        let mut body = std::pin::pin!(body);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| AgentError::BadRequest(e.to_string()))?;
            pipe.write_all(&chunk).await.map_err(broken)?;
        }
        if close {
            if command.pty {
                pipe.write_all(&[4]).await.map_err(broken)?;
            } else {
                *stdin = None;
            }
        }
        Ok(())
    }

    /// Sends `signal` (a number or a name, with or without `SIG`) to the command's group.
    pub fn signal(&self, id: &str, signal: &str) -> Result<(), AgentError> {
        let command = self.get(id)?;
        let signal = parse_signal(signal)?;
        if command.exited() {
            return Err(AgentError::CommandFinished(id.to_owned()));
        }
        killpg(Pid::from_raw(command.pid as i32), signal).map_err(|e| match e {
            nix::errno::Errno::ESRCH => AgentError::CommandFinished(id.to_owned()),
            e => AgentError::Internal(e.to_string()),
        })
    }

    /// Resizes the command's PTY; its foreground process group gets SIGWINCH.
    pub fn resize(&self, id: &str, size: PtySize) -> Result<(), AgentError> {
        let command = self.get(id)?;
        if !command.pty {
            return Err(AgentError::BadRequest(format!("{id} has no terminal")));
        }
        let master = command.pty_master.lock().unwrap_or_else(|e| e.into_inner());
        let Some(master) = master.as_ref() else {
            return Err(AgentError::CommandFinished(id.to_owned()));
        };
        let ws = spawn::winsize(size);
        // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at `ws`, and
        // `master` is an open PTY master owned by the command.
        let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc < 0 {
            return Err(AgentError::Internal(
                std::io::Error::last_os_error().to_string(),
            ));
        }
        Ok(())
    }

    /// Sends `signal` to every command still running (shutdown).
    pub fn signal_all(&self, signal: Signal) {
        for command in self.map.lock().unwrap_or_else(|e| e.into_inner()).values() {
            if !command.exited() {
                let _ = killpg(Pid::from_raw(command.pid as i32), signal);
            }
        }
    }
}

/// Reads `fd` until EOF, or once the command exited until the pipe stayed quiet for
/// [`DRAIN_GRACE`] or [`DRAIN_LIMIT`] has passed, sending chunks that never end inside a
/// UTF-8 sequence.
async fn pump(
    mut fd: FdStream,
    stream: Stream,
    tx: mpsc::Sender<Chunk>,
    mut exit: watch::Receiver<ExitState>,
) {
    let mut buf = vec![0u8; 32 * 1024];
    let mut carry = 0;
    // When reading stops at the latest, once the command has exited.
    let mut drain_until = None;
    loop {
        if drain_until.is_none() && exit.borrow().is_some() {
            drain_until = Some(tokio::time::Instant::now() + DRAIN_LIMIT);
        }
        let read = if let Some(until) = drain_until {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(left.min(DRAIN_GRACE), fd.read(&mut buf[carry..])).await {
                Ok(r) => r,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                r = fd.read(&mut buf[carry..]) => r,
                changed = exit.changed() => {
                    if changed.is_err() {
                        drain_until = Some(tokio::time::Instant::now() + DRAIN_LIMIT);
                    }
                    continue;
                }
            }
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let ts = now_ms();
        let total = carry + n;
        let cut = utf8_cut(&buf[..total]);
        if cut > 0 {
            let data = Bytes::copy_from_slice(&buf[..cut]);
            buf.copy_within(cut..total, 0);
            carry = total - cut;
            if tx.send(Chunk { stream, data, ts }).await.is_err() {
                return;
            }
        } else {
            carry = total;
        }
    }
    if carry > 0 {
        let data = Bytes::copy_from_slice(&buf[..carry]);
        let _ = tx
            .send(Chunk {
                stream,
                data,
                ts: now_ms(),
            })
            .await;
    }
}

fn default_cwd(user: &User) -> String {
    [belljar_agent_proto::DEFAULT_CWD, &user.home]
        .into_iter()
        .find(|dir| Path::new(dir).is_dir())
        .unwrap_or("/")
        .to_owned()
}

fn base_env(user: &User, pty: bool) -> std::collections::BTreeMap<String, String> {
    let mut env = std::collections::BTreeMap::new();
    env.insert("PATH".into(), DEFAULT_PATH.into());
    env.insert("HOME".into(), user.home.clone());
    env.insert("USER".into(), user.name.clone());
    env.insert("LOGNAME".into(), user.name.clone());
    env.insert("SHELL".into(), user.shell.clone());
    env.insert("LANG".into(), "C.UTF-8".into());
    if pty {
        env.insert("TERM".into(), "xterm-256color".into());
    }
    // The sandbox's CA for credential brokering, once the daemon installed it: for the
    // runtimes that do not read the system store (Node) or read only their own (requests).
    use belljar_agent_proto::net::{SANDBOX_CA_PATH, SYSTEM_CA_BUNDLE};
    if Path::new(SANDBOX_CA_PATH).is_file() {
        let bundle = if Path::new(SYSTEM_CA_BUNDLE).is_file() {
            SYSTEM_CA_BUNDLE
        } else {
            SANDBOX_CA_PATH
        };
        env.insert("SSL_CERT_FILE".into(), bundle.into());
        env.insert("REQUESTS_CA_BUNDLE".into(), bundle.into());
        env.insert("NODE_EXTRA_CA_CERTS".into(), SANDBOX_CA_PATH.into());
    }
    env
}

/// `9`, `KILL` or `SIGKILL`.
pub fn parse_signal(name: &str) -> Result<Signal, AgentError> {
    let bad = || AgentError::BadRequest(format!("unknown signal {name}"));
    if let Ok(n) = name.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&full).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_signals_by_number_and_name() {
        assert_eq!(parse_signal("9").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("sigint").unwrap(), Signal::SIGINT);
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("999").is_err());
    }
}
