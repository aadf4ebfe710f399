//! The agent's life after the system is prepared: start the reaper, serve the routes (or run
//! the boot self-check), and end the sandbox when asked.

use std::sync::Arc;

use belljar_agent_proto::{ShutdownAction, StartCommand};
use futures::StreamExt;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::commands::{Commands, now_ms};
use crate::config::{Config, ConfigError, Mode};
use crate::listen::{ListenError, Listener, serve};
use crate::reaper::{Reaper, ReaperError};
use crate::server::App;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration is incomplete.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The reaper could not start.
    #[error(transparent)]
    Reaper(#[from] ReaperError),
    /// The listener could not be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The state directory is unusable.
    #[error("Cannot use the state directory {0}")]
    StateDir(String, #[source] std::io::Error),
    /// The self-check failed.
    #[error("{0}")]
    SelfCheck(String),
}

/// What the agent does once it stops serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Poweroff,
    Reboot,
}

fn app(config: &Config) -> Result<(Arc<App>, mpsc::Receiver<ShutdownAction>), RunError> {
    let reaper = Reaper::start()?;
    let state_dir = config.state_dir();
    let commands = Commands::new(reaper, &state_dir, config.output_limit)
        .map_err(|e| RunError::StateDir(state_dir.display().to_string(), e))?;
    let (tx, rx) = mpsc::channel(1);
    let app = App {
        commands,
        started: std::time::Instant::now(),
        started_at: now_ms(),
        own_uptime: config.mode() != Mode::Microvm,
        shutdown: tx,
    };
    Ok((Arc::new(app), rx))
}

/// Serves until a shutdown request (or, in self-check mode, runs the check) and says how the
/// sandbox should end. Commands still running are killed before this returns.
pub async fn run(config: &Config) -> Result<Outcome, RunError> {
    let (app, mut shutdown) = app(config)?;
    // Before serving, so that no new upload's file is taken for an old one's.
    crate::files::pending::start(&config.upload_journal());
    if config.selfcheck {
        let result = selfcheck(&app).await;
        app.commands.signal_all(Signal::SIGKILL);
        return result.map(|()| Outcome::Poweroff);
    }
    let addr = config.listen_addr()?;
    let listener = Listener::bind(&addr)?;
    tracing::info!(?addr, mode = ?config.mode(), "belljar-agent listening");
    let action = tokio::select! {
        () = serve(app.clone(), listener) => ShutdownAction::Poweroff,
        Some(action) = shutdown.recv() => action,
    };
    // Let the 204 reach the client before the sandbox goes away.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    app.commands.signal_all(Signal::SIGKILL);
    Ok(match action {
        ShutdownAction::Poweroff => Outcome::Poweroff,
        ShutdownAction::Reboot => Outcome::Reboot,
    })
}

/// The boot self-check: one command as the default user through the same machinery the API
/// uses, and (as a microVM's init) a write through the overlay.
async fn selfcheck(app: &App) -> Result<(), RunError> {
    let fail = |why: String| RunError::SelfCheck(why);
    if std::process::id() == 1 {
        crate::files::write(
            "/var/tmp/belljar-selfcheck",
            None,
            Some("root"),
            futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"ok\n"))]),
        )
        .await
        .map_err(|e| fail(format!("overlay write: {e}")))?;
    }
    let start = StartCommand {
        argv: ["/bin/sh", "-c", "id belljar && echo selfcheck-cmd-ok"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let info = app
        .commands
        .start(start)
        .map_err(|e| fail(format!("start: {e}")))?;
    let mut output = Vec::new();
    let mut lines = std::pin::pin!(
        app.commands
            .output(&info.id, 0, true)
            .map_err(|e| fail(e.to_string()))?
    );
    while let Some(chunk) = lines.next().await {
        output.extend_from_slice(&chunk.map_err(|e| fail(e.to_string()))?);
    }
    let info = app
        .commands
        .info(&info.id, true)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut text = Vec::new();
    for line in output.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        if let Ok(line) = serde_json::from_slice::<belljar_agent_proto::OutputLine>(line) {
            text.extend(line.bytes());
        }
    }
    let text = String::from_utf8_lossy(&text);
    print!("{text}");
    if info.exit_code != Some(0) || !text.contains("selfcheck-cmd-ok") {
        return Err(fail(format!(
            "command exited {:?} (signal {:?}) as {}",
            info.exit_code, info.signal, info.user
        )));
    }
    Ok(())
}
