//! Modal's object ids for the daemon's objects, and back.
//!
//! The client picks how to talk to a sandbox from the shape of its id (`sb-` and 22 letters or
//! digits is the control-plane kind this layer serves), and checks every object's prefix
//! (`ap-`, `im-`, `st-`, `ta-`), so the daemon's ids are wrapped rather than shown as they
//! are: `sbx_k3j…` is `sb-BelljarSbxk3j…`, and its task (Modal's container) the same with `ta-`.
//! An app's id follows from its environment and name, so a lookup finds the same app after a
//! restart with nothing stored; an image's id is `im-` and the local image's name.

use sha2::{Digest, Sha256};

use super::error::{ModalError, Result};
use crate::util::is_id;

/// Makes a daemon sandbox id's 12-character tail 22 characters long.
const MARK: &str = "BelljarSbx";
const SANDBOX: &str = "sb-";
const TASK: &str = "ta-";
const APP: &str = "ap-";
const IMAGE: &str = "im-";

/// The Modal id of a daemon sandbox.
pub fn sandbox(id: &str) -> String {
    wrap(SANDBOX, id)
}

/// The Modal task id of a daemon sandbox (the one container a sandbox has here).
pub fn task(id: &str) -> String {
    wrap(TASK, id)
}

fn wrap(prefix: &str, id: &str) -> String {
    let tail = id.strip_prefix("sbx_").unwrap_or(id);
    format!("{prefix}{MARK}{tail}")
}

/// The daemon sandbox of a Modal sandbox id.
pub fn sandbox_of(modal: &str) -> Result<String> {
    unwrap(SANDBOX, modal).ok_or_else(|| ModalError::NotFound(format!("Sandbox {modal} not found")))
}

/// The daemon sandbox of a Modal task id.
pub fn sandbox_of_task(modal: &str) -> Result<String> {
    unwrap(TASK, modal).ok_or_else(|| ModalError::NotFound(format!("Task {modal} not found")))
}

fn unwrap(prefix: &str, modal: &str) -> Option<String> {
    let tail = modal.strip_prefix(prefix)?.strip_prefix(MARK)?;
    let id = format!("sbx_{tail}");
    is_id("sbx", &id).then_some(id)
}

/// The id of the app `name` in `environment`: 22 hex digits of a hash of both.
pub fn app(environment: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{environment}\n{name}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{APP}{}", &hex[..22])
}

/// Whether `id` has the shape of an app id.
pub fn is_app(id: &str) -> bool {
    id.strip_prefix(APP)
        .is_some_and(|t| t.len() == 22 && t.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The Modal id of the local image `name`.
pub fn image(name: &str) -> String {
    format!("{IMAGE}{name}")
}

/// The local image of a Modal image id.
pub fn image_of(modal: &str) -> Result<String> {
    modal
        .strip_prefix(IMAGE)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ModalError::NotFound(format!("Image {modal} not found")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_have_the_v1_shape_and_come_back() {
        let m = sandbox("sbx_abc123def456");
        assert_eq!(m, "sb-BelljarSbxabc123def456");
        assert_eq!(m.len() - 3, 22);
        assert_eq!(sandbox_of(&m).unwrap(), "sbx_abc123def456");
        assert_eq!(
            sandbox_of_task(&task("sbx_abc123def456")).unwrap(),
            "sbx_abc123def456"
        );
        for bad in ["sb-abc", "sb-BelljarSbx../x", "ta-BelljarSbxabc", ""] {
            assert!(sandbox_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn app_ids_are_stable_and_shaped_like_modals() {
        let a = app("", "hello");
        assert_eq!(a, app("", "hello"));
        assert_ne!(a, app("", "other"));
        assert!(is_app(&a));
        assert_eq!(image_of(&image("python3.13")).unwrap(), "python3.13");
    }
}
