//! The tools a user would otherwise reach for, timed on the same tree in the same run:
//! bubblewrap (namespaces, no daemon) and podman (a container engine), each starting `true` in
//! the image's root filesystem. Rounds interleave Belljar and the peers so that a busy moment
//! of the machine lands on all of them alike.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A peer that starts `true` in a root filesystem and removes what it made.
pub struct Peer {
    pub name: &'static str,
    program: PathBuf,
    args: Vec<String>,
}

impl Peer {
    /// Runs the peer once and returns how long it took.
    pub fn round(&self) -> Result<Duration> {
        let t = Instant::now();
        let status = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running {}", self.name))?;
        let took = t.elapsed();
        if !status.status.success() {
            bail!(
                "{} failed ({}): {}",
                self.name,
                status.status,
                String::from_utf8_lossy(&status.stderr).trim()
            );
        }
        Ok(took)
    }
}

/// `program` on `PATH`, if installed.
fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// bubblewrap with the namespaces a Belljar sandbox has (mount, pid, ipc, uts, network,
/// user where allowed), the tree read-only, fresh /proc and /dev.
fn bubblewrap(rootfs: &Path) -> Option<Peer> {
    let program = on_path("bwrap")?;
    let root = rootfs.display().to_string();
    let args = [
        "--ro-bind",
        &root,
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--unshare-all",
        "--die-with-parent",
        "--",
        "/bin/true",
    ];
    Some(Peer {
        name: "bubblewrap",
        program,
        args: args.iter().map(|s| s.to_string()).collect(),
    })
}

/// podman on the same tree (`--rootfs`), no network, removed afterwards.
fn podman(rootfs: &Path) -> Option<Peer> {
    let program = on_path("podman")?;
    let args = [
        "run",
        "--rm",
        "--network=none",
        "--rootfs",
        &rootfs.display().to_string(),
        "/bin/true",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Some(Peer {
        name: "podman",
        program,
        args,
    })
}

/// The peers installed here, and the names of those that are not.
pub fn available(rootfs: &Path) -> (Vec<Peer>, Vec<&'static str>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (name, peer) in [
        ("bubblewrap", bubblewrap(rootfs)),
        ("podman", podman(rootfs)),
    ] {
        match peer {
            Some(p) => found.push(p),
            None => missing.push(name),
        }
    }
    (found, missing)
}
