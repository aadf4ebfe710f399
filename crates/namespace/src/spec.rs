//! Checks a `SandboxSpec` before anything is created for it: names, paths (absolute, and
//! free of the characters mount options and socket paths cannot carry), environment.

use std::os::unix::ffi::OsStrExt;

use crate::lifecycle::Error;
use crate::{AGENT_SOCKET, SandboxSpec};

/// Refuses a spec the launch could not carry out safely.
pub(crate) fn validate(spec: &SandboxSpec) -> Result<(), Error> {
    let bad = |m: String| Err(Error::Spec(m));
    let id_ok = !spec.id.is_empty()
        && spec.id.len() <= 63
        && spec
            .id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !id_ok {
        return bad(format!(
            "id {:?} must be 1-63 characters of [a-z0-9-]",
            spec.id
        ));
    }
    let host_ok = !spec.hostname.is_empty()
        && spec.hostname.len() <= 64
        && spec
            .hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !host_ok {
        return bad(format!(
            "hostname {:?} is not a valid host name",
            spec.hostname
        ));
    }
    for (what, p) in [
        ("state_dir", &spec.state_dir),
        ("rootfs", &spec.rootfs),
        ("agent", &spec.agent),
    ] {
        let bytes = p.as_os_str().as_bytes();
        if !p.is_absolute() || bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\' | 0)) {
            return bad(format!(
                "{what} {} must be absolute, without , : \\",
                p.display()
            ));
        }
    }
    for layer in &spec.layers {
        let bytes = layer.as_os_str().as_bytes();
        if !layer.is_absolute() || bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\' | 0)) {
            return bad(format!(
                "layer {} must be absolute, without , : \\",
                layer.display()
            ));
        }
        if !layer.is_dir() {
            return bad(format!("layer {} is not a directory", layer.display()));
        }
    }
    // Overlayfs stacks at most 500 lower layers, the image included.
    if spec.layers.len() >= 500 {
        return bad(format!("{} layers are too many", spec.layers.len()));
    }
    crate::snapshot_mounts::validate(&spec.mounts, &spec.rootfs, &spec.layers)?;
    for b in &spec.binds {
        crate::host_mounts::check_path(&b.path)
            .map_err(crate::snapshot_mounts::MountError::from)?;
    }
    if spec.state_dir.join(AGENT_SOCKET).as_os_str().len() >= 108 {
        return bad(format!(
            "state_dir {} is too long for a Unix socket path",
            spec.state_dir.display()
        ));
    }
    if !spec.rootfs.is_dir() {
        return bad(format!(
            "rootfs {} is not a directory",
            spec.rootfs.display()
        ));
    }
    if !spec.agent.is_file() {
        return bad(format!("agent {} is not a file", spec.agent.display()));
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return bad(format!("bad environment variable {k:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let spec = SandboxSpec {
            id: "Bad_Id".into(),
            rootfs: "/".into(),
            layers: Vec::new(),
            state_dir: "/tmp/x".into(),
            agent: "/bin/sh".into(),
            hostname: "h".into(),
            limits: Default::default(),
            env: vec![],
            mounts: vec![],
            binds: vec![],
            durable: false,
        };
        assert!(matches!(validate(&spec), Err(Error::Spec(_))));
        let ok = SandboxSpec {
            id: "ok-1".into(),
            ..spec.clone()
        };
        validate(&ok).unwrap();
        let comma = SandboxSpec {
            state_dir: "/tmp/a,b".into(),
            ..ok
        };
        assert!(matches!(validate(&comma), Err(Error::Spec(_))));
    }
}
