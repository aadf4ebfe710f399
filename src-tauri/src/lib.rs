//! Belljar's desktop shell: one window with the web UI, a tray, terminal windows, native file
//! drop, links opened in the user's browser, and the bundled daemon started when none runs.
//! Everything about sandboxes goes through the daemon's API from the web UI; the Rust side only
//! does what a page cannot.

#![forbid(unsafe_code)]

pub mod browser;
pub mod commands;
pub mod daemon;
pub mod drop;
pub mod startup;
pub mod tray;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use belljar_client::ready::ReadySocket;
use tauri::{AppHandle, DragDropEvent, Emitter, Manager, WindowEvent};
use tauri_plugin_shell::ShellExt;
use tauri_plugin_shell::process::CommandEvent;

use crate::commands::CommandError;
use crate::daemon::DaemonPaths;
use crate::drop::DropRegistry;
use crate::startup::{StartError, Startup};
use crate::tray::TrayAction;

/// Events the Rust side sends to the main window's page.
pub mod events {
    /// `{ image }`: create a sandbox from it and open a terminal window on it.
    pub const QUICK_LAUNCH: &str = "belljar://quick-launch";
    /// `{ id }`: show this sandbox.
    pub const OPEN_SANDBOX: &str = "belljar://open-sandbox";
    /// `{ id }`: stop this sandbox.
    pub const STOP_SANDBOX: &str = "belljar://stop-sandbox";
    /// A `drop::Drop`: files dropped onto the window, and where.
    pub const DROP: &str = "belljar://drop";
    /// `{ x, y }` while files are dragged over the window; `null` when they leave.
    pub const DRAG_OVER: &str = "belljar://drag-over";
}

/// State shared by the commands.
pub struct AppState {
    pub paths: DaemonPaths,
    /// How the daemon this app started is coming along (see `startup`).
    pub startup: Arc<Startup>,
    pub drops: DropRegistry,
    windows: AtomicU64,
    /// Whether the tray icon is there. Without it, closing the main window quits the app, as
    /// hiding it would leave no way back to it.
    tray: AtomicBool,
}

/// Runs the app until the user quits.
pub fn run() {
    let paths = match DaemonPaths::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("belljar-app: {e}");
            std::process::exit(1);
        }
    };
    let result = tauri::Builder::default()
        .plugin(tauri_plugin_shell::init())
        .manage(AppState {
            paths,
            startup: Arc::default(),
            drops: DropRegistry::default(),
            windows: AtomicU64::new(0),
            tray: AtomicBool::new(false),
        })
        .invoke_handler(tauri::generate_handler![
            commands::daemon_connection,
            commands::daemon_ui_url,
            commands::set_tray,
            commands::open_terminal_window,
            commands::read_dropped_file,
            commands::open_url,
        ])
        .setup(|app| {
            start_daemon_if_needed(app.handle());
            install_tray(app.handle());
            Ok(())
        })
        .on_window_event(|window, event| match event {
            // Closing the main window keeps the app in the tray, if there is one; Quit ends it.
            WindowEvent::CloseRequested { api, .. }
                if window.label() == "main"
                    && window.state::<AppState>().tray.load(Ordering::Relaxed) =>
            {
                api.prevent_close();
                let _ = window.hide();
            }
            WindowEvent::DragDrop(drop) => on_drag_drop(window, drop),
            _ => {}
        })
        .run(tauri::generate_context!());
    if let Err(e) = result {
        eprintln!("belljar-app: {e}");
        std::process::exit(1);
    }
}

/// Starts the bundled `belljard` when no daemon answers; it inherits this process's environment
/// (`BELLJAR_HOME`, `BELLJAR_PORT`, ...). Its output goes to the app's standard error. It says
/// `READY=1` on a notify socket of the app's own, which settles `AppState::startup`: the
/// commands that need the daemon wait on that, not on a poll of its socket.
fn start_daemon_if_needed(app: &AppHandle) {
    let state = app.state::<AppState>();
    if state.paths.is_running() {
        return;
    }
    let startup = state.startup.clone();
    startup.starting();
    let runtime = state.paths.runtime_dir();
    let ready = std::fs::create_dir_all(&runtime).and_then(|()| ReadySocket::bind(&runtime));
    let ready = match ready {
        Ok(r) => r,
        Err(source) => {
            let e = StartError::NotifySocket {
                dir: runtime,
                source,
            };
            eprintln!("belljar-app: {}", belljar_client::error_chain(&e));
            startup.finish(Err(e));
            return;
        }
    };
    // In a delegated systemd scope when the user's manager can give one (see
    // `belljar_client::scope`); the bundled sidecar sits beside the app's executable.
    let launch = belljar_client::scope::decide(&belljar_client::scope::Facts::gather());
    let sidecar = belljar_client::paths::beside_exe("belljard");
    let command = match (&launch, sidecar) {
        (belljar_client::scope::Launch::Scope { .. }, Some(bin)) => {
            let (program, argv) = launch.command(&bin, &[]);
            Ok(app.shell().command(program).args(argv))
        }
        _ => app.shell().sidecar("belljard"),
    };
    let spawned = command.and_then(|cmd| cmd.env(belljar_client::ready::ENV, ready.path()).spawn());
    match spawned {
        Ok((mut rx, _child)) => {
            let waiter = startup.clone();
            std::thread::spawn(move || {
                let told = ready.wait_blocking(commands::DAEMON_START_TIMEOUT);
                waiter.finish(told.map(|_| ()).map_err(StartError::NeverReady));
            });
            tauri::async_runtime::spawn(async move {
                while let Some(event) = rx.recv().await {
                    match event {
                        CommandEvent::Stdout(line) | CommandEvent::Stderr(line) => {
                            eprintln!("belljard: {}", String::from_utf8_lossy(&line).trim_end());
                        }
                        CommandEvent::Terminated(status) => {
                            eprintln!("belljard exited: {status:?}");
                            startup.finish(Err(StartError::Exited(format!("{status:?}"))));
                        }
                        _ => {}
                    }
                }
            });
        }
        Err(e) => {
            let e = StartError::Spawn(e);
            eprintln!("belljar-app: {}", belljar_client::error_chain(&e));
            startup.finish(Err(e));
        }
    }
}

/// The tray is a convenience: a desktop without a status area, or one whose icon cannot be
/// made, still gets the window, with a warning on standard error.
fn install_tray(app: &AppHandle) {
    let state = app.state::<AppState>();
    let image_dir = state.paths.runtime_dir().join("tray-icon");
    match tray::install(app, &image_dir, on_tray) {
        Ok(_) => state.tray.store(true, Ordering::Relaxed),
        Err(e) => eprintln!(
            "belljar-app: warning: running without a tray icon ({e}); closing the window quits the app"
        ),
    }
}

fn on_tray(app: &AppHandle, id: &str) {
    let Some(action) = TrayAction::parse(id) else {
        return;
    };
    let main = |event: &str, payload: serde_json::Value| {
        let _ = app.emit_to("main", event, payload);
    };
    match action {
        TrayAction::QuickLaunch(image) => {
            main(events::QUICK_LAUNCH, serde_json::json!({ "image": image }))
        }
        TrayAction::Open(id) => {
            commands::show_main(app);
            main(events::OPEN_SANDBOX, serde_json::json!({ "id": id }));
        }
        TrayAction::Terminal(id) => {
            if let Err(e) = open_terminal_window(app, &id) {
                eprintln!("belljar-app: {e}");
            }
        }
        TrayAction::Stop(id) => main(events::STOP_SANDBOX, serde_json::json!({ "id": id })),
        TrayAction::ShowApp => commands::show_main(app),
        TrayAction::Quit => app.exit(0),
    }
}

/// Opens a new terminal window on a sandbox.
pub fn open_terminal_window(app: &AppHandle, sandbox_id: &str) -> Result<(), CommandError> {
    let n = app
        .state::<AppState>()
        .windows
        .fetch_add(1, Ordering::Relaxed);
    commands::terminal_window(app, sandbox_id, n)
}

fn on_drag_drop(window: &tauri::Window, event: &DragDropEvent) {
    let scale = window.scale_factor().unwrap_or(1.0);
    let label = window.label().to_owned();
    match event {
        DragDropEvent::Enter { position, .. } | DragDropEvent::Over { position } => {
            let p = serde_json::json!({ "x": position.x / scale, "y": position.y / scale });
            let _ = window.emit_to(label.as_str(), events::DRAG_OVER, p);
        }
        DragDropEvent::Leave => {
            let _ = window.emit_to(label.as_str(), events::DRAG_OVER, serde_json::Value::Null);
        }
        DragDropEvent::Drop { paths, position } => {
            let state = window.state::<AppState>();
            let drop = state
                .drops
                .accept(paths, position.x / scale, position.y / scale);
            let _ = window.emit_to(label.as_str(), events::DROP, drop);
        }
        _ => {}
    }
}
