//! Generates Tauri's context (config, capabilities, icons) at build time, and the permissions of
//! the app's own commands, which capabilities grant by name (needed for the UI when the window
//! loads it from the daemon, a remote origin to Tauri).

const COMMANDS: &[&str] = &[
    "daemon_connection",
    "daemon_ui_url",
    "set_tray",
    "open_terminal_window",
    "read_dropped_file",
    "open_url",
];

fn main() {
    let attributes = tauri_build::Attributes::new()
        .app_manifest(tauri_build::AppManifest::new().commands(COMMANDS));
    if let Err(e) = tauri_build::try_build(attributes) {
        panic!("tauri-build: {e:#}");
    }
}
