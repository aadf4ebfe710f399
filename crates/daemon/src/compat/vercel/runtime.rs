//! The environment Vercel documents inside a sandbox, made real in the daemon's images:
//! runtimes map to images, commands run as `vercel-sandbox` (with passwordless sudo) in
//! `/vercel/sandbox`, and relative paths resolve there.
//!
//! The images do not ship that user, so [`SETUP`] creates it when a sandbox starts, as root,
//! through the daemon's command service: a real passwd entry, home, sudoers rule and working
//! directory, which a snapshot of the sandbox then carries along.

use super::error::{Result, VercelError};
use crate::images::Images;

/// The working directory of every command and the base of relative paths.
pub const CWD: &str = "/vercel/sandbox";

/// The user commands run as when they do not ask for sudo.
pub const USER: &str = "vercel-sandbox";

/// The runtimes Vercel offers, which are Belljar image names too.
pub const RUNTIMES: [&str; 3] = ["node24", "node22", "python3.13"];

/// The runtime reported for a sandbox on `image` (an image outside Vercel's list keeps its
/// own name).
pub fn of_image(image: &str) -> &str {
    image
}

/// The image for a requested runtime (or 3.x `image`). Without one, Vercel's default
/// (`node24`) when this machine has built it, else the first runtime it has, else `base`;
/// the answer's `runtime` says which.
pub fn image_for(
    images: &Images,
    runtime: Option<&str>,
    image: Option<&str>,
) -> Result<Option<String>> {
    match (runtime, image) {
        (Some(_), Some(_)) => Err(VercelError::BadRequest(
            "runtime and image: give one of them".into(),
        )),
        (Some(r), None) if RUNTIMES.contains(&r) => Ok(Some(r.to_owned())),
        (Some(r), None) => Err(VercelError::BadRequest(format!(
            "runtime: {r:?} is not one of {}",
            RUNTIMES.join(", ")
        ))),
        (None, Some(i)) => Ok(Some(i.to_owned())),
        (None, None) => Ok(RUNTIMES
            .iter()
            .find(|r| images.resolve(r).is_ok())
            .map(|r| (*r).to_owned())),
    }
}

/// Run as root when a sandbox starts: the user with its home and passwordless sudo, and the
/// working directory it owns. `$1` is `copy-workspace` when a git source was cloned into the
/// daemon's `/workspace`, which Vercel puts in the working directory instead. Idempotent, so
/// a sandbox made from a snapshot of one that ran it runs it again harmlessly.
pub const SETUP: &str = r#"set -eu
user=vercel-sandbox
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash --user-group "$user"
fi
install -d -m 0755 /etc/sudoers.d
printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\n' "$user" > /etc/sudoers.d/vercel-sandbox
chmod 0440 /etc/sudoers.d/vercel-sandbox
install -d -m 0755 /vercel
install -d -m 0755 -o "$user" -g "$user" /vercel/sandbox
if [ "${1:-}" = copy-workspace ] && [ -d /workspace ]; then
  cp -a /workspace/. /vercel/sandbox/
  chown -R "$user:$user" /vercel/sandbox
fi
"#;

/// `path` made absolute against `cwd` (default [`CWD`]) and normalised (`.` and `..`
/// resolved lexically, never above `/`), as the SDK resolves the paths it tars.
pub fn resolve(path: &str, cwd: Option<&str>) -> Result<String> {
    if path.is_empty() {
        return Err(VercelError::BadRequest("path: must not be empty".into()));
    }
    if path.contains('\0') {
        return Err(VercelError::BadRequest("path: must not contain NUL".into()));
    }
    let base = cwd.filter(|c| !c.is_empty()).unwrap_or(CWD);
    if !base.starts_with('/') {
        return Err(VercelError::BadRequest("cwd: must be absolute".into()));
    }
    Ok(crate::compat::normalise(base, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_working_directory() {
        assert_eq!(resolve("a.txt", None).unwrap(), "/vercel/sandbox/a.txt");
        assert_eq!(resolve("/etc/hosts", None).unwrap(), "/etc/hosts");
        assert_eq!(resolve("x/../y", Some("/tmp")).unwrap(), "/tmp/y");
        assert_eq!(resolve("../../../../etc", None).unwrap(), "/etc");
        assert!(resolve("", None).is_err());
        assert!(resolve("a", Some("rel")).is_err());
        assert!(resolve("a\0b", None).is_err());
    }
}
