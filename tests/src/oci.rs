//! Images made for the OCI tests (e2e_oci, e2e_build) by buildah, from busybox-static and
//! files the tests write: real images, made the way users make theirs.

use std::path::Path;
use std::process::Command;

/// Runs the bash `script` with `$B` set to buildah on storage of its own under `work` (vfs, so
/// that it needs no overlay mount) and `$BUSYBOX` to busybox-static's path; panics with
/// buildah's error when the script fails.
pub fn buildah(work: &Path, script: &str) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("busybox-static is not installed (scripts/setup.sh installs it)");
    let storage = format!(
        "buildah --root {w}/storage --runroot {w}/run --storage-driver vfs",
        w = work.display()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .env("B", storage)
        .env("BUSYBOX", busybox)
        .output()
        .expect("run bash for buildah");
    assert!(
        out.status.success(),
        "buildah: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
