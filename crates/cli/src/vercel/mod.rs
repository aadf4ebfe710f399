//! `belljar vercel`: runs a program with Vercel's Sandbox SDK pointed at the local daemon, or
//! prints the environment that does it (`belljar vercel env`).
//!
//! Three variables make the unchanged SDK work here: `NODE_OPTIONS` gains `--import` of a
//! preload (shipped inside this binary, written to the cache directory under a name that
//! hashes its content) that sends the SDK's requests for Vercel's API to
//! `BELLJAR_VERCEL_URL`, the daemon's Vercel layer on 127.0.0.1; and `VERCEL_OIDC_TOKEN` is a
//! JWT the daemon signed under its own token, which the SDK accepts as its credential and the
//! daemon accepts as its token. No account and no network are involved.

use std::collections::hash_map::DefaultHasher;
use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use belljar_client::{Client, ClientError, Paths};
use serde::Deserialize;

/// The preload's source.
pub const PRELOAD: &str = include_str!("preload.mjs");

/// Where the daemon serves Vercel's API.
pub const PREFIX: &str = "/compat/vercel";

#[derive(Debug, thiserror::Error)]
pub enum VercelError {
    /// The daemon did not hand out a credential.
    #[error("Cannot get the Vercel credential from the daemon")]
    Credentials(#[source] ClientError),
    /// The daemon's TCP port is not known (it writes it at start).
    #[error("The daemon's TCP port is not known; is it listening on 127.0.0.1?")]
    NoPort,
    /// The preload could not be written to the cache directory.
    #[error("Cannot write the Node preload to {path}")]
    Preload {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The cache directory is unknown.
    #[error(transparent)]
    Paths(#[from] belljar_client::PathsError),
}

impl VercelError {
    /// The stable code printed after the message.
    pub fn code(&self) -> &str {
        match self {
            Self::Credentials(e) => e.code(),
            Self::NoPort => "daemon_not_listening",
            Self::Preload { .. } | Self::Paths(_) => "io",
        }
    }
}

#[derive(Deserialize)]
struct Credentials {
    token: String,
}

/// The variables to add to a program's environment, in order.
pub async fn environment(
    client: &Client,
    paths: &Paths,
) -> Result<Vec<(String, OsString)>, VercelError> {
    let creds: Credentials = client
        .get(&format!("{PREFIX}/belljar/credentials"))
        .await
        .map_err(VercelError::Credentials)?;
    let port = paths.port().ok_or(VercelError::NoPort)?;
    let preload = write_preload(&belljar_client::paths::image_cache(
        std::env::var_os("BELLJAR_CACHE").as_deref().map(Path::new),
    )?)?;
    let import = format!("--import={}", node_quote(&preload.to_string_lossy()));
    let node_options = match std::env::var("NODE_OPTIONS") {
        Ok(old) if old.contains(&import) => old,
        Ok(old) if !old.trim().is_empty() => format!("{old} {import}"),
        _ => import,
    };
    Ok(vec![
        ("NODE_OPTIONS".into(), node_options.into()),
        (
            "BELLJAR_VERCEL_URL".into(),
            format!("http://127.0.0.1:{port}{PREFIX}").into(),
        ),
        ("VERCEL_OIDC_TOKEN".into(), creds.token.into()),
    ])
}

/// Writes the preload to `<cache>/vercel-preload-<hash>.mjs` unless it is there already.
pub fn write_preload(cache: &Path) -> Result<PathBuf, VercelError> {
    let mut h = DefaultHasher::new();
    PRELOAD.hash(&mut h);
    let path = cache.join(format!("vercel-preload-{:016x}.mjs", h.finish()));
    let err = |source| VercelError::Preload {
        path: path.clone(),
        source,
    };
    if std::fs::read_to_string(&path).is_ok_and(|s| s == PRELOAD) {
        return Ok(path);
    }
    std::fs::create_dir_all(cache).map_err(err)?;
    // Written aside and renamed, so that a concurrent run never loads half a file.
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, PRELOAD).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(path)
}

/// A value as `NODE_OPTIONS` reads it: quoted when it has a space or a quote.
fn node_quote(s: &str) -> String {
    if s.chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        let escaped = s.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_shells_and_node() {
        // A shell reads the exported values back as they were.
        let odd = "a'b c \"$HOME\" `x` \\ \n!";
        let env = [("ODD".to_owned(), OsString::from(odd))];
        let script = format!("{}printf %s \"$ODD\"", crate::compat::export_lines(&env));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), odd);
        assert_eq!(node_quote("/plain/path.mjs"), "/plain/path.mjs");
        assert_eq!(node_quote("/with space/p.mjs"), "\"/with space/p.mjs\"");
    }

    #[test]
    fn the_preload_is_written_once_under_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let a = write_preload(dir.path()).unwrap();
        let b = write_preload(dir.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(std::fs::read_to_string(&a).unwrap(), PRELOAD);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
