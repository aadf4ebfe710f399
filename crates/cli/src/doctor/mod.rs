//! `belljar doctor`: what this host offers Belljar and what is missing, each finding with the
//! one command that fixes it. It must work with no daemon running (that is when people need
//! it most), so it looks at the host itself, reusing the daemon's own probe code
//! (`belljar_vmm_api::host` for KVM, `belljar_namespace` for cgroups and subordinate ids), and
//! asks the daemon only whether it answers.
//!
//! Gathering the facts ([`gather`]) and judging them ([`checks`]) are apart so that the
//! judgement is tested on fixture inputs rather than on whatever host runs the tests.

pub mod checks;
pub mod net;
pub mod overlay;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use belljar_client::{Client, Paths};
use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Belljar works, with less: no microVMs, limits not enforced.
    Warning,
    /// Sandboxes cannot be created (or images not stored) until it is fixed.
    Problem,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Stable name of the check: `kvm`, `cgroup`, `subids`, `overlayfs`, `network`, `disk`,
    /// `daemon`.
    pub check: &'static str,
    pub status: Status,
    /// What was found, one sentence for people.
    pub found: String,
    /// The one command that fixes it, when there is one.
    pub fix: Option<String>,
    /// The same findings as data, for scripts.
    pub facts: serde_json::Value,
}

/// All findings, in a fixed order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// No finding is a [`Status::Problem`].
    pub ok: bool,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(findings: Vec<Finding>) -> Self {
        let ok = findings.iter().all(|f| f.status != Status::Problem);
        Self { ok, findings }
    }

    /// The table people read: status, check, what was found, and the fix under it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let status = match f.status {
                Status::Ok => "ok",
                Status::Warning => "warning",
                Status::Problem => "PROBLEM",
            };
            let _ = writeln!(out, "{status:<8} {:<10} {}", f.check, f.found);
            if let Some(fix) = &f.fix {
                let _ = writeln!(out, "{:<19}fix: {fix}", "");
            }
        }
        out
    }
}

/// Runs every check on this host. `exe` is the `belljar` binary, re-run for the overlayfs
/// probe (a user namespace needs a single-threaded process).
pub async fn gather(paths: &Paths, exe: &Path) -> Report {
    let rootless = !nix::unistd::Uid::effective().is_root();
    let kvm = checks::kvm(&belljar_vmm_api::host::HostFacts::gather());
    let hierarchies = belljar_namespace::cgroup::Hierarchies::discover();
    let subtree_writable = hierarchies
        .v2
        .as_ref()
        .is_some_and(|(dir, _)| writable(&dir.join("cgroup.subtree_control")));
    let cgroup = checks::cgroup(&hierarchies, subtree_writable, rootless);
    let subids = checks::subids(&checks::SubidFacts::gather(Path::new("/"), rootless));
    let overlay = tokio::task::spawn_blocking({
        let exe = exe.to_path_buf();
        move || overlay::probe(&exe)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    let overlay = checks::overlayfs(&overlay, &checks::Sysctls::gather(Path::new("/")));
    let network = tokio::task::spawn_blocking({
        let exe = exe.to_path_buf();
        move || net::NetFacts::gather(&exe)
    })
    .await
    .unwrap_or_else(|e| net::NetFacts {
        tun_present: false,
        tun_openable: false,
        tap_in_netns: Err(e.to_string()),
    });
    let network = checks::network(&network);
    let disk = checks::disk(&disk_dirs(paths));
    let client = Client::local(paths);
    let answers = client.answers().await;
    let daemon = checks::daemon(answers, &paths.socket());
    Report::new(vec![kvm, cgroup, subids, overlay, network, disk, daemon])
}

/// The directories images and sandboxes are stored in, with their free space.
fn disk_dirs(paths: &Paths) -> Vec<checks::DiskFacts> {
    let cache = std::env::var_os("BELLJAR_CACHE").map(PathBuf::from);
    let mut dirs = vec![("data", paths.data.clone())];
    if let Ok(c) = belljar_client::paths::image_cache(cache.as_deref()) {
        dirs.push(("image cache", c));
    }
    dirs.into_iter()
        .map(|(what, dir)| checks::DiskFacts::gather(what, &dir))
        .collect()
}

/// Whether this process may write `path` (the kernel's answer, including for root).
fn writable(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_ok()
}
