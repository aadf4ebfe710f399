//! Entry point of the desktop app; everything lives in the library so that it can be tested.

#![forbid(unsafe_code)]
// No console window next to the app on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    belljar_app::run();
}
