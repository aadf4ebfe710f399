//! The tray menu: New sandbox ▸ each image, each running sandbox ▸ Open/Terminal/Stop, Open
//! Belljar, Quit.
//!
//! The tray knows nothing of the daemon's API: the web UI, which follows the daemon's event
//! stream anyway, tells it what to show (`set_tray`), and actions that need the API are handed
//! back to the UI as events. Only window handling happens here.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tauri::menu::{Menu, MenuItem, PredefinedMenuItem, Submenu};
use tauri::tray::{TrayIcon, TrayIconBuilder};
use tauri::{AppHandle, Runtime};

/// The id of the app's one tray icon.
pub const TRAY_ID: &str = "belljar";

#[derive(Debug, thiserror::Error)]
pub enum TrayError {
    /// Tauri refused to build the menu.
    #[error("Cannot build the tray menu: {0}")]
    Menu(#[from] tauri::Error),
    /// The desktop's tray took no icon (its image file could not be written, for one).
    #[error("Cannot make the tray icon: {0}")]
    Icon(#[source] tauri::Error),
}

/// What the tray shows, as sent by the UI.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct TrayState {
    /// Image names for "New sandbox ▸".
    pub images: Vec<String>,
    /// Running sandboxes.
    pub sandboxes: Vec<TraySandbox>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct TraySandbox {
    pub id: String,
    /// What the user calls it: its name, else its id, with its image.
    pub label: String,
}

/// What a click on a tray item asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrayAction {
    /// Create a sandbox from this image and open a terminal window on it.
    QuickLaunch(String),
    Open(String),
    Terminal(String),
    Stop(String),
    ShowApp,
    Quit,
}

impl TrayAction {
    /// The menu item id that stands for this action.
    pub fn id(&self) -> String {
        match self {
            Self::QuickLaunch(image) => format!("new:{image}"),
            Self::Open(id) => format!("open:{id}"),
            Self::Terminal(id) => format!("term:{id}"),
            Self::Stop(id) => format!("stop:{id}"),
            Self::ShowApp => "show".to_owned(),
            Self::Quit => "quit".to_owned(),
        }
    }

    /// The action behind a menu item id.
    pub fn parse(id: &str) -> Option<Self> {
        match id {
            "show" => return Some(Self::ShowApp),
            "quit" => return Some(Self::Quit),
            _ => {}
        }
        let (kind, arg) = id.split_once(':')?;
        if arg.is_empty() {
            return None;
        }
        let arg = arg.to_owned();
        match kind {
            "new" => Some(Self::QuickLaunch(arg)),
            "open" => Some(Self::Open(arg)),
            "term" => Some(Self::Terminal(arg)),
            "stop" => Some(Self::Stop(arg)),
            _ => None,
        }
    }
}

/// Puts the app's icon, with an empty menu until the UI sends one, in the desktop's tray;
/// `on_menu` gets the id of each item clicked. The icon's image is a file the status area
/// reads, written to `image_dir`: the app's private runtime directory, not the tray library's
/// default, which without `XDG_RUNTIME_DIR` is a `/tmp/tray-icon` that the first user of the
/// machine owns and every other user then fails to write.
pub fn install<R: Runtime>(
    app: &AppHandle<R>,
    image_dir: &Path,
    on_menu: fn(&AppHandle<R>, &str),
) -> Result<TrayIcon<R>, TrayError> {
    let menu = build_menu(app, &TrayState::default())?;
    let mut builder = TrayIconBuilder::with_id(TRAY_ID)
        .tooltip("Belljar")
        .menu(&menu)
        .temp_dir_path(image_dir)
        .on_menu_event(move |app, event| on_menu(app, event.id().as_ref()));
    if let Ok(icon) = tauri::image::Image::from_bytes(include_bytes!("../../icons/tray@2x.png")) {
        builder = builder.icon(icon);
    }
    builder.build(app).map_err(TrayError::Icon)
}

/// Builds the tray menu for a state.
pub fn build_menu<R: Runtime>(app: &AppHandle<R>, state: &TrayState) -> Result<Menu<R>, TrayError> {
    let new = Submenu::with_id(app, "new", "New sandbox", true)?;
    if state.images.is_empty() {
        new.append(&MenuItem::with_id(
            app,
            "new-none",
            "No images yet",
            false,
            None::<&str>,
        )?)?;
    }
    for image in &state.images {
        let action = TrayAction::QuickLaunch(image.clone());
        new.append(&MenuItem::with_id(
            app,
            action.id(),
            image,
            true,
            None::<&str>,
        )?)?;
    }
    let menu = Menu::with_items(app, &[&new, &PredefinedMenuItem::separator(app)?])?;
    if state.sandboxes.is_empty() {
        menu.append(&MenuItem::with_id(
            app,
            "running-none",
            "No running sandboxes",
            false,
            None::<&str>,
        )?)?;
    }
    for sandbox in &state.sandboxes {
        let id = &sandbox.id;
        let sub = Submenu::with_id(app, format!("sbx:{id}"), &sandbox.label, true)?;
        for (action, text) in [
            (TrayAction::Open(id.clone()), "Open"),
            (TrayAction::Terminal(id.clone()), "Terminal"),
            (TrayAction::Stop(id.clone()), "Stop"),
        ] {
            sub.append(&MenuItem::with_id(
                app,
                action.id(),
                text,
                true,
                None::<&str>,
            )?)?;
        }
        menu.append(&sub)?;
    }
    menu.append(&PredefinedMenuItem::separator(app)?)?;
    menu.append(&MenuItem::with_id(
        app,
        TrayAction::ShowApp.id(),
        "Open Belljar",
        true,
        None::<&str>,
    )?)?;
    menu.append(&MenuItem::with_id(
        app,
        TrayAction::Quit.id(),
        "Quit",
        true,
        None::<&str>,
    )?)?;
    Ok(menu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_round_trips_through_its_menu_id() {
        for action in [
            TrayAction::QuickLaunch("python3.13".into()),
            TrayAction::Open("sbx_a1".into()),
            TrayAction::Terminal("sbx_a1".into()),
            TrayAction::Stop("sbx_a1".into()),
            TrayAction::ShowApp,
            TrayAction::Quit,
        ] {
            assert_eq!(TrayAction::parse(&action.id()), Some(action));
        }
    }

    #[test]
    fn unknown_and_informational_ids_are_no_action() {
        for id in [
            "new",
            "new:",
            "sbx:sbx_a1",
            "running-none",
            "new-none",
            "bogus:x",
        ] {
            assert_eq!(TrayAction::parse(id), None, "{id}");
        }
    }
}
