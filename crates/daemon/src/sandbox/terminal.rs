//! Interactive shells: a PTY `bash -l` in a sandbox, pumped between a client's terminal and
//! the sandbox's agent.
//!
//! The pump lives here, in the sandbox layer, so that the transport (the WebSocket handler in
//! `http::terminal`) only turns its frames into [`TerminalFrame`]s and back. The shell is an
//! ordinary PTY command of the sandbox, so its output is also in its command log.

use belljar_agent_proto::client::{AgentClient, body_from_reader};
use belljar_api::{Command, ErrorCode, PtySize, RunCommand, TerminalMessage};
use bytes::Bytes;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use super::{SandboxError, Sandboxes};

/// A PTY shell started for a terminal.
pub struct Terminal {
    pub command: Command,
    agent: AgentClient,
    agent_id: String,
}

/// What travels between a client's terminal and the pump, either way: raw terminal bytes, or
/// a control message (`resize` in; `started`, `exit`, `error` out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalFrame {
    Bytes(Bytes),
    Message(TerminalMessage),
}

/// How much typed input may wait for the agent before the pump stops reading the client.
const STDIN_BUFFER: usize = 64 * 1024;

impl Sandboxes {
    /// Starts an interactive `bash -l` on a PTY of `size` in the sandbox.
    pub async fn start_terminal(
        &self,
        id: &str,
        size: PtySize,
        cwd: Option<String>,
        sudo: bool,
    ) -> Result<Terminal, SandboxError> {
        let req = RunCommand {
            argv: vec!["bash".into(), "-l".into()],
            cwd,
            sudo,
            detached: true,
            pty: Some(size),
            stdin: true,
            env: Some([("TERM".to_owned(), "xterm-256color".to_owned())].into()),
        };
        let (rec, agent) = self.start_command(id, req, None, None).await?;
        Ok(Terminal {
            agent_id: rec.agent_id.clone().unwrap_or_default(),
            command: rec.command,
            agent,
        })
    }

    /// Pumps a started terminal until the shell exits or the client goes: `input` ends, or
    /// `output` refuses a frame. Sends `started` first; then the shell's output as bytes;
    /// then `exit` (or `error`). A client that goes hangs the shell up (`SIGHUP`), as closing a
    /// terminal window does.
    pub async fn run_terminal<I, O>(&self, id: &str, term: Terminal, input: I, output: &mut O)
    where
        I: Stream<Item = TerminalFrame> + Unpin,
        O: Sink<TerminalFrame> + Unpin,
    {
        let cid = term.command.id.clone();
        let hang_up = || async {
            let _ = term.agent.signal(&term.agent_id, "HUP").await;
        };
        let started = TerminalMessage::Started {
            command_id: cid.clone(),
        };
        if output.send(TerminalFrame::Message(started)).await.is_err() {
            return hang_up().await;
        }
        let mut shell_output = match term.agent.output(&term.agent_id, 0, true).await {
            Ok(o) => o,
            Err(e) => {
                let error = TerminalMessage::Error {
                    code: ErrorCode::AgentUnavailable,
                    message: e.to_string(),
                };
                let _ = output.send(TerminalFrame::Message(error)).await;
                return;
            }
        };
        // One long stdin request per terminal; typed bytes go through an in-memory pipe whose
        // read side is the request's body.
        let (stdin_body, mut stdin) = tokio::io::simplex(STDIN_BUFFER);
        let agent = term.agent.clone();
        let agent_id = term.agent_id.clone();
        tokio::spawn(async move {
            let body = body_from_reader(stdin_body);
            if let Err(e) = agent.write_stdin(&agent_id, body, true).await {
                tracing::debug!(error = %e, "terminal stdin ended");
            }
        });
        let mut input = input;
        let client_gone = loop {
            tokio::select! {
                line = shell_output.next() => match line {
                    Some(Ok(line)) => {
                        let bytes = TerminalFrame::Bytes(line.bytes().into());
                        if output.send(bytes).await.is_err() {
                            break true;
                        }
                    }
                    _ => break false,
                },
                frame = input.next() => match frame {
                    Some(TerminalFrame::Bytes(b)) => {
                        // The shell may have ended and its stdin with it; the output says so.
                        let _ = stdin.write_all(&b).await;
                    }
                    Some(TerminalFrame::Message(TerminalMessage::Resize { rows, cols })) => {
                        let size = PtySize { rows, cols };
                        if let Err(e) = self.resize_command(id, &cid, size).await {
                            tracing::debug!(error = %e, "terminal resize failed");
                        }
                    }
                    Some(TerminalFrame::Message(_)) => {}
                    None => break true,
                },
            }
        };
        drop(stdin);
        if client_gone {
            return hang_up().await;
        }
        let end = match self.wait_command(id, &cid).await {
            Ok(c) => TerminalMessage::Exit {
                exit_code: c.exit_code,
                signal: c.signal,
            },
            Err(e) => TerminalMessage::Error {
                code: ErrorCode::Internal,
                message: e.to_string(),
            },
        };
        let _ = output.send(TerminalFrame::Message(end)).await;
    }
}
