//! Opens a web address in the user's browser. The app's webview follows no `target=_blank`
//! link (WebKitGTK opens no new window unless the shell makes one), so the UI's links to a
//! forwarded port come here, and the desktop's `xdg-open` hands the address to whichever
//! browser the user chose. Only `http` and `https` addresses are opened: anything else
//! (`file:`, a custom scheme) would start some other handler on the user's machine.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long `xdg-open` gets to fail before the address counts as handed over. It usually
/// returns at once; with some desktops it stays as the browser's parent for as long as that
/// runs, so it is not waited for beyond this.
const FAIL_WITHIN: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// The address is not one the app opens.
    #[error("Only http:// and https:// addresses are opened, not {0:?}")]
    NotWeb(String),
    /// There is no `xdg-open` to hand the address to.
    #[error("Cannot run xdg-open (Debian's xdg-utils) to open {url}: {source}")]
    NoOpener {
        url: String,
        #[source]
        source: std::io::Error,
    },
    /// `xdg-open` ran and failed (no browser configured, for one); what it said is on the
    /// app's standard error.
    #[error("xdg-open could not open {url} ({status})")]
    Failed {
        url: String,
        status: std::process::ExitStatus,
    },
}

/// Checks that `url` is an `http`/`https` address with a host and no whitespace or control
/// characters (which no link the UI makes has).
pub fn check(url: &str) -> Result<(), BrowserError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let host_ok = rest.is_some_and(|r| !r.is_empty() && !r.starts_with(['/', '?', '#']));
    if !host_ok || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(BrowserError::NotWeb(url.to_owned()));
    }
    Ok(())
}

/// Hands `url` to `opener` (`xdg-open` in the app). Fails if the opener cannot start or ends
/// with an error within `FAIL_WITHIN`; the opener is reaped in the background otherwise. Its
/// standard error is the app's (a browser it starts inherits it and may write to it later).
pub fn open_with(opener: &str, url: &str) -> Result<(), BrowserError> {
    check(url)?;
    let mut child = Command::new(opener)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|source| BrowserError::NoOpener {
            url: url.to_owned(),
            source,
        })?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(FAIL_WITHIN) {
        Ok(Ok(status)) if !status.success() => Err(BrowserError::Failed {
            url: url.to_owned(),
            status,
        }),
        _ => Ok(()),
    }
}

/// Opens `url` in the user's browser through `xdg-open`.
pub fn open(url: &str) -> Result<(), BrowserError> {
    open_with("xdg-open", url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_web_addresses_pass() {
        for ok in [
            "http://127.0.0.1:43123/",
            "http://127.0.0.1:8000",
            "https://example.test/a?b=c#d",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "http://",
            "http:///path",
            "ftp://127.0.0.1/",
            "HTTP://127.0.0.1/",
            "http://127.0.0.1/ x",
            "http://127.0.0.1/\n",
            "-http://127.0.0.1/",
            "",
        ] {
            assert!(
                matches!(check(bad), Err(BrowserError::NotWeb(_))),
                "{bad:?}"
            );
        }
    }

    /// Held by each test that writes a script and runs it: a fork by another test's spawn
    /// while the script is still open for writing keeps a copy of that descriptor until the
    /// child execs, and running the script then fails with ETXTBSY ("Text file busy").
    static SCRIPTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A script standing in for `xdg-open`: records its arguments, then exits with `code`.
    fn opener(dir: &std::path::Path, code: i32) -> (String, std::path::PathBuf) {
        let script = dir.join(format!("opener-{code}"));
        let record = dir.join(format!("opened-{code}"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\nexit {code}\n",
                record.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (script.to_string_lossy().into_owned(), record)
    }

    #[test]
    fn the_opener_gets_the_address_as_its_one_argument() {
        let _one_at_a_time = SCRIPTS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let (script, record) = opener(dir.path(), 0);
        open_with(&script, "http://127.0.0.1:8000/a b").unwrap_err();
        assert!(!record.exists(), "a refused address reaches no opener");
        open_with(&script, "http://127.0.0.1:8000/?q=1").unwrap();
        assert_eq!(
            std::fs::read_to_string(&record).unwrap(),
            "http://127.0.0.1:8000/?q=1\n"
        );
    }

    #[test]
    fn a_failing_or_missing_opener_is_an_error() {
        let _one_at_a_time = SCRIPTS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let (script, _) = opener(dir.path(), 3);
        let err = open_with(&script, "http://127.0.0.1:1/").unwrap_err();
        assert!(
            matches!(&err, BrowserError::Failed { status, .. } if status.code() == Some(3)),
            "{err}"
        );
        let missing = dir.path().join("no-such-opener");
        let err = open_with(missing.to_str().unwrap(), "http://127.0.0.1:1/").unwrap_err();
        assert!(matches!(err, BrowserError::NoOpener { .. }), "{err}");
    }
}
