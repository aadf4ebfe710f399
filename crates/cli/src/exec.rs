//! Runs a command in a sandbox the way a local one runs: output streams as it comes, stdin and
//! the terminal size follow, and the caller gets the command's exit status.
//!
//! The command is started detached and its logs are followed, so output appears at once
//! instead of when the command ends.

use std::collections::BTreeMap;

use belljar_api::{Command, PtySize, RunCommand, Stream};
use belljar_client::{Client, ClientError, NdjsonError, log_bytes};

use crate::terminal::{self, RawMode, TerminalError};

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Stream(#[from] NdjsonError),
    #[error(transparent)]
    Terminal(#[from] TerminalError),
    /// Writing the command's output locally failed.
    #[error("Cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

impl ExecError {
    pub fn code(&self) -> &str {
        match self {
            Self::Client(e) => e.code(),
            Self::Stream(_) => "connection_lost",
            Self::Terminal(e) => e.code(),
            Self::Output(_) => "io",
        }
    }
}

/// What to run and how.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub sudo: bool,
    /// Return once the command started, without following it.
    pub detach: bool,
    /// Run on a PTY the size of the local terminal, in raw mode.
    pub tty: bool,
    /// Forward local stdin to the command.
    pub stdin: bool,
}

impl ExecOptions {
    pub fn new(argv: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    fn request(&self) -> RunCommand {
        RunCommand {
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: (!self.env.is_empty()).then(|| self.env.clone()),
            sudo: self.sudo,
            detached: true,
            pty: self.tty.then(terminal::size),
            stdin: self.stdin || self.tty,
        }
    }
}

/// Starts a command; with `detach`, returns it running. Otherwise streams its output into
/// `sink` as it comes and returns it exited.
pub async fn exec(
    client: &Client,
    sandbox: &str,
    opts: &ExecOptions,
    sink: &mut (dyn FnMut(Stream, &[u8]) -> std::io::Result<()> + Send),
) -> Result<Command, ExecError> {
    let cmd = client.run_command(sandbox, &opts.request()).await?;
    if opts.detach {
        return Ok(cmd);
    }
    let _raw = if opts.tty {
        Some(RawMode::enable()?)
    } else {
        None
    };
    let forwarder = (opts.stdin || opts.tty).then(|| {
        let client = client.clone();
        let (sandbox, cid) = (sandbox.to_owned(), cmd.id.clone());
        let tty = opts.tty;
        tokio::spawn(async move { forward_input(&client, &sandbox, &cid, tty).await })
    });
    let result = follow(client, sandbox, &cmd.id, sink).await;
    if let Some(f) = forwarder {
        f.abort();
    }
    result?;
    Ok(client.wait_command(sandbox, &cmd.id).await?)
}

/// Writes every log line of a command into `sink` until the command's output ends.
pub async fn follow(
    client: &Client,
    sandbox: &str,
    cid: &str,
    sink: &mut (dyn FnMut(Stream, &[u8]) -> std::io::Result<()> + Send),
) -> Result<(), ExecError> {
    let mut lines = client.command_logs(sandbox, cid, true).await?;
    while let Some(line) = lines.next().await? {
        sink(line.stream, &log_bytes(&line))?;
    }
    Ok(())
}

/// Sends local stdin (and, on a PTY, size changes) to the command until stdin ends.
async fn forward_input(
    client: &Client,
    sandbox: &str,
    cid: &str,
    tty: bool,
) -> Result<(), ClientError> {
    let mut input = terminal::stdin_chunks();
    let mut winch = if tty { Some(terminal::resizes()) } else { None };
    loop {
        tokio::select! {
            chunk = input.recv() => match chunk {
                Some(bytes) => client.write_stdin(sandbox, cid, bytes, false).await?,
                None => return client.write_stdin(sandbox, cid, Default::default(), true).await,
            },
            Some(sz) = async { match winch.as_mut() { Some(w) => w.recv().await, None => None } } => {
                let size = PtySize { rows: sz.rows, cols: sz.cols };
                let _: Result<(), _> = client.resize_command(sandbox, cid, size).await;
            }
        }
    }
}

/// The shell-style exit status of a finished command.
pub fn exit_status(cmd: &Command) -> i32 {
    terminal::exit_status(cmd.exit_code, cmd.signal)
}

/// The one-line warning for a command whose output the sandbox did not keep in full, so that
/// a cut-off output is never mistaken for the whole of it.
pub fn truncation_warning(cmd: &Command) -> Option<String> {
    (cmd.output_truncated_bytes > 0).then(|| {
        format!(
            "belljar: warning: output truncated: the sandbox dropped {} bytes of {}'s output \
             (over its per-command output limit)",
            cmd.output_truncated_bytes, cmd.id
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_is_always_detached_and_pty_implies_stdin() {
        let mut o = ExecOptions::new(["echo", "hi"]);
        let r = o.request();
        assert!(r.detached && !r.stdin && r.pty.is_none() && r.env.is_none());
        o.tty = true;
        o.env.insert("A".into(), "1".into());
        let r = o.request();
        assert!(r.stdin && r.pty.is_some());
        assert_eq!(r.env.unwrap()["A"], "1");
    }

    #[test]
    fn only_a_truncated_command_gets_a_warning() {
        let mut cmd: Command = serde_json::from_str(
            r#"{"id":"cmd_a","sandbox_id":"sbx_a","argv":["yes"],"cwd":"/","user":"u",
                "pty":false,"status":"exited","exit_code":0,"started_at":1}"#,
        )
        .unwrap();
        assert_eq!(truncation_warning(&cmd), None);
        cmd.output_truncated_bytes = 4096;
        let w = truncation_warning(&cmd).unwrap();
        assert!(w.contains("4096 bytes") && w.contains("cmd_a") && !w.contains('\n'));
    }
}
