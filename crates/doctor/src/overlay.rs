//! The overlayfs check, done for real: a throwaway user and mount namespace mounts an overlay
//! over a scratch directory and writes through it, which is what a namespace sandbox's root
//! filesystem needs. Kernel version numbers and sysctls only hint at the answer; the mount is
//! the answer.
//!
//! `unshare(CLONE_NEWUSER)` refuses multithreaded processes and the CLI runs tokio, so the
//! parent ([`probe`]) re-runs the current binary (`belljar` or `belljard`) with
//! [`crate::PROBE_ENV`] set, and the child ([`child`], through [`crate::run_probe_if_asked`])
//! runs before any runtime starts. The namespaces die with the child.

use std::fs;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{Gid, Uid};

/// Why the probe failed, as the child reports it on stderr.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    /// No user and mount namespace for this user.
    #[error("Cannot create a user namespace: {0}")]
    Unshare(#[source] nix::Error),
    /// The id maps could not be written.
    #[error("Cannot write the id maps of the user namespace: {0}")]
    IdMap(#[source] std::io::Error),
    /// The kernel refused the mount.
    #[error("Cannot mount {what}: {source}")]
    Mount {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    /// The mount succeeded but did not behave as an overlay.
    #[error("The overlay does not work: {0}")]
    Broken(String),
}

/// Runs the probe in a child (`exe` with `BELLJAR_DOCTOR_PROBE=overlay:<scratch>`); `Err`
/// carries its reason.
pub fn probe(exe: &Path) -> Result<(), crate::ProbeError> {
    let scratch = std::env::temp_dir().join(format!("belljar-doctor-{}", std::process::id()));
    let result = (|| {
        let failed = |path: std::path::PathBuf| {
            move |e: std::io::Error| crate::ProbeError::Scratch {
                path,
                kind: e.kind(),
            }
        };
        for d in ["lower", "upper", "work", "merged"] {
            fs::create_dir_all(scratch.join(d)).map_err(failed(scratch.join(d)))?;
        }
        let file = scratch.join("lower/from-lower");
        fs::write(&file, "lower").map_err(failed(file.clone()))?;
        let mut arg = std::ffi::OsString::from(crate::PROBE_OVERLAY);
        arg.push(&scratch);
        crate::run_probe_child(exe, arg)
    })();
    let _ = fs::remove_dir_all(&scratch);
    result
}

/// The child's side: enter new namespaces, mount, write through the overlay, clean up.
pub fn child(scratch: &Path) -> Result<(), OverlayError> {
    let (uid, gid) = (Uid::current(), Gid::current());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(OverlayError::Unshare)?;
    crate::map_self_to_root(uid, gid).map_err(OverlayError::IdMap)?;
    // Nothing mounted here may show up in the host's mount namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|source| OverlayError::Mount {
        what: "/ private",
        source,
    })?;
    let merged = scratch.join("merged");
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        scratch.join("lower").display(),
        scratch.join("upper").display(),
        scratch.join("work").display()
    );
    mount(
        Some("overlay"),
        &merged,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(|source| OverlayError::Mount {
        what: "an overlay",
        source,
    })?;
    let checked = check(scratch);
    let _ = umount2(&merged, MntFlags::MNT_DETACH);
    // The kernel's `work/work` has mode 000: remove it while this namespace's root may.
    let _ = fs::remove_dir_all(scratch.join("work"));
    checked
}

/// The lower file is visible through the overlay and a write lands in the upper directory.
fn check(scratch: &Path) -> Result<(), OverlayError> {
    let merged = scratch.join("merged");
    let lower = fs::read_to_string(merged.join("from-lower"))
        .map_err(|e| OverlayError::Broken(format!("the lower file is not visible: {e}")))?;
    if lower != "lower" {
        return Err(OverlayError::Broken("the lower file reads wrong".into()));
    }
    fs::write(merged.join("written"), "upper")
        .map_err(|e| OverlayError::Broken(format!("cannot write through it: {e}")))?;
    if !scratch.join("upper/written").exists() {
        return Err(OverlayError::Broken(
            "a write did not reach the upper directory".into(),
        ));
    }
    Ok(())
}
