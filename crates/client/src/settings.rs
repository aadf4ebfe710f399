//! The settings a daemon was started with, kept in its data directory
//! (`daemon-settings.json`), so that a daemon the CLI starts by itself (any command run while
//! none is up) comes back with them. Without it, a daemon started with, say,
//! `BELLJAR_DNS_SERVERS` came back after a stop or a crash with the environment of whichever
//! command happened to start it, and quietly without its DNS servers.
//!
//! Every setting is a `BELLJAR_*` variable with its value as the daemon read it (a flag is
//! written under the variable that stands for it), so a start gives them back as
//! environment. None is a secret: the bearer token is a file of its own, and
//! `BELLJAR_BROKER_CA` names a file of public certificates. The daemon writes the file; the
//! CLI reads it with [`restored_env`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Paths;

/// The file's name in the data directory.
pub const FILE: &str = "daemon-settings.json";

/// The settings of the last daemon start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonSettings {
    /// Each setting as the variable that stands for it and its value.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be written.
    #[error("Cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the settings of the daemon of `paths` are kept.
pub fn path(paths: &Paths) -> PathBuf {
    paths.data.join(FILE)
}

impl DaemonSettings {
    /// The settings written at the last start; none when the file is missing or unreadable
    /// (a daemon of an older version wrote none).
    pub fn load(path: &Path) -> Option<Self> {
        let text = std::fs::read(path).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Writes the settings (mode 0600) beside the file and renames it into place, so that a
    /// reader never sees half of them.
    pub fn save(&self, path: &Path) -> Result<(), SettingsError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |source| SettingsError::Write {
            path: path.to_owned(),
            source,
        };
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        let text = serde_json::to_vec_pretty(self)
            .map_err(std::io::Error::other)
            .map_err(fail)?;
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&text)?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(fail)
    }

    /// The names whose values differ from `before`'s (set, changed or gone), in order.
    pub fn changed_since(&self, before: &DaemonSettings) -> Vec<String> {
        let mut names: Vec<String> = self
            .env
            .keys()
            .chain(before.env.keys())
            .filter(|k| self.env.get(*k) != before.env.get(*k))
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// The variables a start of the daemon adds to its environment: the last start's settings,
/// except those the caller's own environment sets (`caller` looks a name up there). The caller
/// wins because a variable set for this command is meant for it (`BELLJAR_DNS_SERVERS=… belljar
/// ls`, which is then the record too); one it does not set says nothing, and the last start's
/// value stands.
pub fn restored_env(
    settings: &DaemonSettings,
    caller: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    settings
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("BELLJAR_") && !caller(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> DaemonSettings {
        DaemonSettings {
            env: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_callers_variables_win_and_the_rest_is_restored() {
        let last = settings(&[
            ("BELLJAR_DNS_SERVERS", "127.0.0.1:5353"),
            ("BELLJAR_POOL", "base=2"),
            ("PATH", "/not/a/setting"),
        ]);
        let env = restored_env(&last, |k| k == "BELLJAR_POOL");
        assert_eq!(
            env,
            [(
                "BELLJAR_DNS_SERVERS".to_string(),
                "127.0.0.1:5353".to_string()
            )]
        );
    }

    #[test]
    fn saved_settings_load_back_and_changes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE);
        assert_eq!(DaemonSettings::load(&p), None);
        let a = settings(&[
            ("BELLJAR_DNS_SERVERS", "127.0.0.1:53"),
            ("BELLJAR_POOL", "base=1"),
        ]);
        a.save(&p).unwrap();
        assert_eq!(DaemonSettings::load(&p), Some(a.clone()));
        let b = settings(&[("BELLJAR_POOL", "base=2"), ("BELLJAR_CACHE", "/c")]);
        assert_eq!(
            b.changed_since(&a),
            ["BELLJAR_CACHE", "BELLJAR_DNS_SERVERS", "BELLJAR_POOL"]
        );
        assert!(a.changed_since(&a).is_empty());
        std::fs::write(&p, "{half").unwrap();
        assert_eq!(DaemonSettings::load(&p), None);
    }
}
