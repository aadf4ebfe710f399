//! Directory snapshots of a running microVM (Modal's `snapshot_directory`). The guest's
//! filesystem is put together read-only on the host the way its agent stacks it at boot: a
//! copy of the writable layer's disk (taken while the VM is paused) over the snapshot layers'
//! disks and the image's. The directory is copied out of that view into a layer like the
//! namespace backend's (its root is the directory, owners as the guest sees them), so it
//! mounts in sandboxes of either backend.

use std::path::{Path, PathBuf};

use crate::sandbox::backend::{BackendError, CapturedLayer};
use crate::sandbox::microvm::layers::{DiskCopy, Error, ReadOnlyMount};

/// Copies directory `path` of the paused microVM in `state_dir` into `layers_dir/<digest>`.
pub fn capture_dir(
    state_dir: &Path,
    path: &str,
    layers_dir: &Path,
) -> Result<CapturedLayer, BackendError> {
    let failed = BackendError::MicrovmCapture;
    let config = crate::sandbox::microvm::vmm::read_config(state_dir)
        .map_err(|e| failed(Error::Config(e)))?;
    let disk = |id: &str| config.disks.iter().find(|d| d.id == id).map(|d| &d.path);
    let root = disk("root").ok_or(failed(Error::NoRootDisk))?;
    // Topmost first, as the daemon lists them (`lower0`, `lower1`, ...).
    let lower_disks: Vec<&PathBuf> = (0..).map_while(|i| disk(&format!("lower{i}"))).collect();

    let copy = DiskCopy::take(state_dir)?;
    let writes = copy.mount().map_err(failed)?;
    let mut lowers = vec![writes.path().join("upper")];
    let mut held = Vec::new();
    for (i, disk) in lower_disks.iter().enumerate() {
        // Shared with running microVMs and never written: no journal to replay.
        let m = ReadOnlyMount::ext4(disk, &copy.dir().join(format!("lower{i}")), ",noload")
            .map_err(failed)?;
        lowers.push(m.path().into());
        held.push(m);
    }
    let image = ReadOnlyMount::ext4(root, &copy.dir().join("image"), ",noload").map_err(failed)?;
    lowers.push(image.path().into());
    // The agent reads overlayfs's marks from `user.*` attributes when it stacks layers.
    let merged = ReadOnlyMount::overlay(&lowers, !lower_disks.is_empty(), &copy.dir().join("view"))
        .map_err(failed)?;
    let c = belljar_namespace::layer::capture_dir_of_tree(merged.path(), path, layers_dir)
        .map_err(BackendError::Directory)?;
    Ok(CapturedLayer {
        digest: c.digest,
        size_bytes: c.size_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use belljar_vmm_api::config::{DiskConfig, VmConfig};

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The guest's view from real ext4 disks, without a VM: the image, a snapshot layer that
    /// adds a file and deletes one (a whiteout), and the writable layer that replaces one and
    /// adds one. Needs root (loop mounts) and e2fsprogs; under CI=true their absence fails.
    #[test]
    fn a_directory_is_captured_from_the_layers_as_the_guest_stacks_them() {
        let ok = nix::unistd::geteuid().is_root()
            && std::process::Command::new("mkfs.ext4")
                .arg("-V")
                .output()
                .is_ok();
        assert!(
            ok || std::env::var_os("CI").is_none(),
            "CI=true: this test needs root and e2fsprogs"
        );
        if !ok {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        write(&t.join("image/srv/d/a"), "from the image\n");
        write(&t.join("image/srv/d/gone"), "deleted by the layer\n");
        write(&t.join("image/etc/os"), "elsewhere\n");
        write(&t.join("lower/srv/d/b"), "from the layer\n");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            t.join("lower/srv/d/gone"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        write(&t.join("writable/upper/srv/d/a"), "written in the guest\n");
        write(&t.join("writable/upper/srv/d/c"), "new in the guest\n");
        std::fs::create_dir_all(t.join("writable/work")).unwrap();
        let state = t.join("state");
        std::fs::create_dir_all(&state).unwrap();
        for (dir, disk) in [
            ("image", t.join("rootfs.ext4")),
            ("lower", t.join("lower0.ext4")),
            ("writable", state.join("layer.ext4")),
        ] {
            crate::sandbox::microvm::layers::make_disk(&t.join(dir), &disk).unwrap();
        }
        let disk = |id: &str, path: PathBuf, read_only| DiskConfig {
            path,
            read_only,
            id: id.into(),
        };
        let config = VmConfig {
            disks: vec![
                disk("root", t.join("rootfs.ext4"), true),
                disk("layer", state.join("layer.ext4"), false),
                disk("lower0", t.join("lower0.ext4"), true),
            ],
            ..Default::default()
        };
        std::fs::write(state.join("vm.json"), config.to_json()).unwrap();

        let layers = t.join("layers");
        std::fs::create_dir_all(&layers).unwrap();
        let c = capture_dir(&state, "/srv/d", &layers).unwrap();
        let got = layers.join(&c.digest);
        let read = |name: &str| std::fs::read_to_string(got.join(name)).ok();
        assert_eq!(read("a").as_deref(), Some("written in the guest\n"));
        assert_eq!(read("b").as_deref(), Some("from the layer\n"));
        assert_eq!(read("c").as_deref(), Some("new in the guest\n"));
        assert!(!got.join("gone").exists(), "the layer's deletion holds");
        assert!(!got.join("os").exists() && !got.join("srv").exists());
        // Nothing stays mounted; a missing directory is the user's error.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(state.to_str().unwrap()), "{mounts}");
        assert!(matches!(
            capture_dir(&state, "/srv/nothing", &layers),
            Err(BackendError::Directory(
                belljar_namespace::layer::DirError::NotFound(_)
            ))
        ));
    }
}
