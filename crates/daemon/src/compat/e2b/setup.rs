//! The environment E2B documents inside a sandbox, made real in the daemon's images: commands
//! and file operations run as `user` (passwordless sudo, home `/home/user`) unless they name
//! another user, in that user's home, and relative paths resolve there. The images do not
//! ship that user, so [`SETUP`] creates it, as root, when a sandbox is created.

use super::error::{E2bError, Result};

/// The user E2B's templates run as.
pub const USER: &str = "user";

/// Creates [`USER`] with its home and passwordless sudo; idempotent.
pub const SETUP: &str = r#"set -eu
if ! id -u user >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash --user-group user
fi
install -d -m 0755 /etc/sudoers.d
printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/e2b-user
chmod 0440 /etc/sudoers.d/e2b-user
"#;

/// The user of a request (default [`USER`]).
pub fn user(requested: Option<&str>) -> String {
    requested
        .filter(|u| !u.is_empty())
        .unwrap_or(USER)
        .to_owned()
}

/// A user's home, where its commands start and its relative paths resolve.
pub fn home(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// `path` made absolute against `base` and normalised (`.` and `..` resolved lexically,
/// never above `/`).
pub fn resolve(path: &str, base: &str) -> Result<String> {
    if path.is_empty() {
        return Err(E2bError::BadRequest("path: must not be empty".into()));
    }
    if path.contains('\0') {
        return Err(E2bError::BadRequest("path: must not contain NUL".into()));
    }
    Ok(crate::compat::normalise(base, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_users_home() {
        assert_eq!(resolve("a.txt", &home(USER)).unwrap(), "/home/user/a.txt");
        assert_eq!(resolve("/etc/hosts", "/root").unwrap(), "/etc/hosts");
        assert_eq!(resolve("../../../x", "/root").unwrap(), "/x");
        assert!(resolve("", "/").is_err());
        assert_eq!(home("root"), "/root");
        assert_eq!(user(None), "user");
    }
}
