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

/// podman on the same tree (`--rootfs`), no network, removed afterwards, with its default
/// OCI runtime or the one named. Resource limits are set below any hard limit, so that the
/// runtime needs no privilege to apply them.
fn podman(rootfs: &Path, runtime: Option<&str>) -> Option<Peer> {
    let program = on_path("podman")?;
    let mut args: Vec<String> = Vec::new();
    if let Some(runtime) = runtime {
        args.extend(["--runtime".into(), runtime.into()]);
    }
    args.extend(
        [
            "run",
            "--rm",
            "--network=none",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=1024:1024",
            "--rootfs",
            &rootfs.display().to_string(),
            "/bin/true",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    Some(Peer {
        name: if runtime.is_some() {
            "podman (runc)"
        } else {
            "podman"
        },
        program,
        args,
    })
}

/// The peers that work here, each run once; for the others, why not.
pub fn available(rootfs: &Path) -> (Vec<Peer>, Vec<String>) {
    let rootfs = rootfs
        .canonicalize()
        .unwrap_or_else(|_| rootfs.to_path_buf());
    let mut found = Vec::new();
    let mut missing = Vec::new();
    let mut try_peer = |name: &str, peer: Option<Peer>| match peer {
        None => {
            missing.push(format!("{name}: not installed"));
            false
        }
        Some(p) => match p.round() {
            Ok(_) => {
                found.push(p);
                true
            }
            Err(e) => {
                missing.push(format!("{name}: {e:#}"));
                false
            }
        },
    };
    try_peer("bubblewrap", bubblewrap(&rootfs));
    // crun, podman's default runtime, refuses hosts with cgroup v1 and v2 mounted at once;
    // runc runs there.
    if !try_peer("podman", podman(&rootfs, None)) && on_path("runc").is_some() {
        try_peer("podman (runc)", podman(&rootfs, Some("runc")));
    }
    (found, missing)
}
