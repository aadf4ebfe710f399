//! The local terminal: raw mode while a remote PTY owns the keyboard, its size, and stdin read
//! on a plain thread (a blocked read must not keep the runtime from shutting down).
//! Also `belljar sh`, an interactive shell over the terminal WebSocket.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;

use belljar_api::{PtySize, TerminalMessage};
use belljar_client::{Client, ClientError, TerminalOptions};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use nix::sys::termios::{self, SetArg, Termios};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    /// Reading or changing the terminal's mode failed.
    #[error("Cannot set up the terminal: {0}")]
    Termios(#[from] nix::Error),
    /// Talking to the daemon failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The daemon reported an error on the terminal socket.
    #[error("{message}")]
    Remote {
        code: belljar_api::ErrorCode,
        message: String,
    },
    /// Writing to the local terminal failed.
    #[error("Cannot write to the terminal: {0}")]
    Io(#[from] std::io::Error),
}

impl TerminalError {
    pub fn code(&self) -> &str {
        match self {
            Self::Client(e) => e.code(),
            Self::Remote { code, .. } => code.as_str(),
            _ => "terminal",
        }
    }
}

/// Puts stdin into raw mode until dropped, when the old mode comes back.
pub struct RawMode {
    saved: Option<Termios>,
}

impl RawMode {
    /// Raw mode when stdin is a terminal; does nothing otherwise (pipes, tests).
    pub fn enable() -> Result<Self, TerminalError> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(Self { saved: None });
        }
        let saved = termios::tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)?;
        Ok(Self { saved: Some(saved) })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}

/// The size of the local terminal, or 24x80 when there is none.
pub fn size() -> PtySize {
    terminal_size::terminal_size_of(std::io::stdout())
        .or_else(|| terminal_size::terminal_size_of(std::io::stdin()))
        .map(|(w, h)| PtySize {
            rows: h.0,
            cols: w.0,
        })
        .unwrap_or(PtySize { rows: 24, cols: 80 })
}

/// Chunks of stdin as they are typed or piped; the channel closes at end of input.
pub fn stdin_chunks() -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// Terminal size changes (SIGWINCH), as new sizes.
pub fn resizes() -> mpsc::Receiver<PtySize> {
    let (tx, rx) = mpsc::channel(4);
    if let Ok(mut winch) = signal(SignalKind::window_change()) {
        tokio::spawn(async move {
            while winch.recv().await.is_some() {
                if tx.send(size()).await.is_err() {
                    break;
                }
            }
        });
    }
    rx
}

/// Options of `belljar sh`.
#[derive(Debug, Clone, Default)]
pub struct ShellOptions {
    pub cwd: Option<String>,
    pub sudo: bool,
}

/// An interactive shell in the sandbox over the terminal WebSocket; returns its exit status.
pub async fn shell(client: &Client, id: &str, opts: &ShellOptions) -> Result<i32, TerminalError> {
    let sz = size();
    let terminal = TerminalOptions {
        rows: Some(sz.rows),
        cols: Some(sz.cols),
        cwd: opts.cwd.clone(),
        sudo: opts.sudo,
    };
    let ws = client.terminal(id, &terminal).await?;
    let (mut sink, mut stream) = ws.split();
    let _raw = RawMode::enable()?;
    let mut input = stdin_chunks();
    let mut winch = resizes();
    let mut stdout = std::io::stdout();
    let mut input_open = true;
    loop {
        tokio::select! {
            chunk = input.recv(), if input_open => match chunk {
                Some(bytes) => sink.send(Message::Binary(bytes)).await.map_err(ClientError::from)?,
                None => input_open = false,
            },
            Some(sz) = winch.recv() => {
                let msg = TerminalMessage::Resize { rows: sz.rows, cols: sz.cols };
                let text = serde_json::to_string(&msg).expect("resize serializes");
                sink.send(Message::Text(text.into())).await.map_err(ClientError::from)?;
            }
            msg = stream.next() => match msg {
                None | Some(Ok(Message::Close(_))) => return Ok(0),
                Some(Err(e)) => return Err(ClientError::from(e).into()),
                Some(Ok(Message::Binary(data))) => {
                    stdout.write_all(&data)?;
                    stdout.flush()?;
                }
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<TerminalMessage>(&text) {
                    Ok(TerminalMessage::Exit { exit_code, signal }) => {
                        return Ok(exit_status(exit_code, signal));
                    }
                    Ok(TerminalMessage::Error { code, message }) => {
                        return Err(TerminalError::Remote { code, message });
                    }
                    _ => {}
                },
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The shell-style exit status of a process: its code, 128 + the signal that killed it, or 1.
pub fn exit_status(exit_code: Option<i32>, signal: Option<i32>) -> i32 {
    match (exit_code, signal) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_like_a_shell() {
        assert_eq!(exit_status(Some(3), None), 3);
        assert_eq!(exit_status(None, Some(9)), 137);
        assert_eq!(exit_status(None, None), 1);
    }

    #[test]
    fn raw_mode_is_a_no_op_without_a_terminal() {
        // Under `cargo test` stdin is not a terminal; enabling must neither fail nor change it.
        if !std::io::stdin().is_terminal() {
            let raw = RawMode::enable().unwrap();
            assert!(raw.saved.is_none());
        }
    }

    #[test]
    fn size_has_a_fallback() {
        let sz = size();
        assert!(sz.rows > 0 && sz.cols > 0);
    }
}
