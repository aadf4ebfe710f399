//! `belljar doctor` and `GET /v1/doctor` (the app's settings show the latter): what this host
//! offers Belljar and what is missing, each finding with the one command that fixes it. The
//! CLI must work with no daemon running (that is when people need it most), so the checks look
//! at the host itself, reusing the daemon's own probe code (`belljar_vmm_api::host` for KVM,
//! `belljar_namespace` for cgroups and subordinate ids), and ask the daemon only whether it
//! answers. The report's wire types are `belljar_api::doctor`.
//!
//! Gathering the facts ([`gather`]) and judging them ([`checks`]) are apart so that the
//! judgement is tested on fixture inputs rather than on whatever host runs the tests.

pub mod checks;
pub mod net;
pub mod overlay;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use belljar_api::{DoctorFinding as Finding, DoctorReport as Report, DoctorStatus as Status};
use belljar_client::{Client, Paths};

/// The environment variable that makes a Belljar binary run one probe child and exit (see
/// [`run_probe_if_asked`]): `net`, or `overlay:<scratch dir>`.
pub const PROBE_ENV: &str = "BELLJAR_DOCTOR_PROBE";
const PROBE_NET: &str = "net";
const PROBE_OVERLAY: &str = "overlay:";

/// Call first thing in `main`, before any runtime or thread starts: when this process was
/// started as a doctor probe child, runs the probe and returns the exit status (0 when the
/// probe passed; its reason on stderr otherwise). `None` for an ordinary start.
pub fn run_probe_if_asked() -> Option<i32> {
    let probe = std::env::var_os(PROBE_ENV)?;
    let probe = probe.to_string_lossy();
    let result = if probe == PROBE_NET {
        net::child().map_err(|e| e.to_string())
    } else if let Some(scratch) = probe.strip_prefix(PROBE_OVERLAY) {
        overlay::child(Path::new(scratch)).map_err(|e| e.to_string())
    } else {
        Err(format!("unknown {PROBE_ENV} value {probe:?}"))
    };
    Some(match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    })
}

/// Why a probe could not show that something works.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The probe child could not be run.
    #[error("cannot run {}: {kind}", exe.display())]
    Spawn {
        exe: std::path::PathBuf,
        kind: std::io::ErrorKind,
    },
    /// The probe's task ended without an answer.
    #[error("the probe did not answer: {0}")]
    Lost(String),
    /// The probe's scratch files could not be made.
    #[error("cannot prepare {}: {kind}", path.display())]
    Scratch {
        path: std::path::PathBuf,
        kind: std::io::ErrorKind,
    },
    /// What the probe needs is not there.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// The child's answer: why what it tried failed (its `error:` line).
    #[error("{0}")]
    Refused(String),
}

/// The parent's side of a probe: re-runs `exe` with [`PROBE_ENV`] set to `probe` and waits;
/// a failure carries the child's reason (its stderr, which [`run_probe_if_asked`] writes).
fn run_probe_child(exe: &Path, probe: impl AsRef<std::ffi::OsStr>) -> Result<(), ProbeError> {
    let out = std::process::Command::new(exe)
        .env(PROBE_ENV, probe)
        .output()
        .map_err(|e| ProbeError::Spawn {
            exe: exe.to_owned(),
            kind: e.kind(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(ProbeError::Refused(
            err.trim().trim_start_matches("error: ").to_owned(),
        ))
    }
}

/// In a probe child just after `unshare(CLONE_NEWUSER)`: maps this user (and group) to root of
/// the new user namespace, the one mapping an unprivileged process may write itself.
fn map_self_to_root(uid: nix::unistd::Uid, gid: nix::unistd::Gid) -> std::io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("0 {gid} 1"))
}

/// The table people read: status, check, what was found, and the fix under it.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.findings {
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

/// Runs every check on this host. `exe` is the running binary (`belljar` or `belljard`, whose
/// `main` calls [`run_probe_if_asked`]), re-run for the overlayfs and network probes (a user
/// namespace needs a single-threaded process).
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
    .unwrap_or_else(|e| Err(ProbeError::Lost(e.to_string())));
    let overlay = checks::overlayfs(&overlay, &checks::Sysctls::gather(Path::new("/")));
    let network = tokio::task::spawn_blocking({
        let exe = exe.to_path_buf();
        move || net::NetFacts::gather(&exe)
    })
    .await
    .unwrap_or_else(|e| net::NetFacts {
        tun_present: false,
        tun_openable: false,
        tap_in_netns: Err(ProbeError::Lost(e.to_string())),
    });
    let network = checks::network(&network);
    let disk = checks::disk(&disk_dirs(paths), rootless);
    let client = Client::local(paths);
    let answers = client.answers().await;
    let launch = belljar_client::scope::decide(&belljar_client::scope::Facts::gather());
    let daemon = checks::daemon(answers, &paths.socket(), &launch);
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
