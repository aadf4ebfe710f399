//! The app's Tauri commands: only what a page in a browser cannot do (find or start the daemon,
//! the tray, windows, dropped files, links to the user's browser). Each one is thin: it calls
//! one function and maps the error.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use tauri::{AppHandle, Manager, State, WebviewUrl, WebviewWindowBuilder};

use crate::AppState;
use crate::browser::BrowserError;
use crate::daemon::{Connection, DaemonError};
use crate::drop::DropError;
use crate::tray::{TRAY_ID, TrayError, TrayState};

/// How long the UI waits for a daemon the app has just started.
pub(crate) const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    Drop(#[from] DropError),
    #[error(transparent)]
    Tray(#[from] TrayError),
    #[error(transparent)]
    Browser(#[from] BrowserError),
    /// A window could not be opened.
    #[error("Cannot open a window: {0}")]
    Window(#[from] tauri::Error),
    /// The worker thread of a command panicked or was cancelled: a bug of the app's, not the
    /// daemon's state.
    #[error("The app's worker failed")]
    Worker(#[source] tauri::Error),
}

impl CommandError {
    fn code(&self) -> &'static str {
        match self {
            Self::Daemon(
                DaemonError::Timeout { .. }
                | DaemonError::NotRunning { .. }
                | DaemonError::Spawn(_)
                | DaemonError::Socket(_),
            ) => "daemon_unavailable",
            Self::Daemon(_) => "daemon_config",
            Self::Drop(DropError::NotDropped(_)) => "forbidden",
            Self::Drop(_) => "io",
            Self::Browser(BrowserError::NotWeb(_)) => "bad_request",
            Self::Browser(_) => "no_browser",
            Self::Tray(_) | Self::Window(_) | Self::Worker(_) => "internal",
        }
    }
}

/// Errors cross into the page as `{ code, message }`, like the daemon's.
impl Serialize for CommandError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            code: &'a str,
            message: String,
        }
        Body {
            code: self.code(),
            message: self.to_string(),
        }
        .serialize(s)
    }
}

/// The daemon's address and bearer token, once it answers.
#[tauri::command]
pub async fn daemon_connection(state: State<'_, AppState>) -> Result<Connection, CommandError> {
    let paths = state.paths.clone();
    let startup = state.startup.clone();
    tauri::async_runtime::spawn_blocking(move || {
        startup.wait_running(&paths, DAEMON_START_TIMEOUT)?;
        paths.connection()
    })
    .await
    .map_err(CommandError::Worker)?
    .map_err(CommandError::from)
}

/// The daemon's own UI with a one-time sign-in, for a window that cannot call the daemon from
/// the embedded page (a daemon without CORS for the app's origin).
#[tauri::command]
pub async fn daemon_ui_url(state: State<'_, AppState>) -> Result<String, CommandError> {
    let paths = state.paths.clone();
    let startup = state.startup.clone();
    tauri::async_runtime::spawn_blocking(move || {
        startup.wait_running(&paths, DAEMON_START_TIMEOUT)?;
        paths.ui_login_url()
    })
    .await
    .map_err(CommandError::Worker)?
    .map_err(CommandError::from)
}

/// Replaces what the tray menu shows.
#[tauri::command]
pub fn set_tray(app: AppHandle, tray: TrayState) -> Result<(), CommandError> {
    let menu = crate::tray::build_menu(&app, &tray)?;
    if let Some(icon) = app.tray_by_id(TRAY_ID) {
        icon.set_menu(Some(menu))?;
    }
    Ok(())
}

/// Opens a window with one terminal on a sandbox.
#[tauri::command]
pub fn open_terminal_window(app: AppHandle, sandbox_id: String) -> Result<(), CommandError> {
    crate::open_terminal_window(&app, &sandbox_id)
}

/// Opens an `http`/`https` address in the user's browser (the webview opens no new window).
#[tauri::command]
pub async fn open_url(url: String) -> Result<(), CommandError> {
    tauri::async_runtime::spawn_blocking(move || crate::browser::open(&url))
        .await
        .map_err(CommandError::Worker)?
        .map_err(CommandError::from)
}

/// The bytes of a file that was dropped onto a window.
#[tauri::command]
pub fn read_dropped_file(
    state: State<'_, AppState>,
    path: PathBuf,
) -> Result<tauri::ipc::Response, CommandError> {
    Ok(tauri::ipc::Response::new(state.drops.read(&path)?))
}

/// Shows and focuses the main window.
pub fn show_main(app: &AppHandle) {
    if let Some(w) = app.get_webview_window("main") {
        let _ = w.show();
        let _ = w.unminimize();
        let _ = w.set_focus();
    }
}

/// Builds a terminal window; its page learns the sandbox from an initialization script.
pub fn terminal_window(app: &AppHandle, sandbox_id: &str, n: u64) -> Result<(), CommandError> {
    let id_json = serde_json::to_string(sandbox_id).unwrap_or_else(|_| "\"\"".into());
    let label = format!("terminal-{n}");
    WebviewWindowBuilder::new(app, label, WebviewUrl::App("index.html".into()))
        .title(format!("Terminal — {sandbox_id}"))
        .inner_size(900.0, 560.0)
        .initialization_script(format!("window.__BELLJAR_TERMINAL__ = {id_json};"))
        .build()?;
    Ok(())
}
