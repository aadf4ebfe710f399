//! Generates Tauri's context (config, capabilities, icons) at build time.

fn main() {
    tauri_build::build();
}
