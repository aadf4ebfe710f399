//! Whether an ordinary user's `belljard` starts in a delegated systemd scope.
//!
//! A rootless daemon enforces sandbox limits only in a cgroup v2 subtree delegated to it (see
//! `belljar_namespace::cgroup`). On a systemd desktop every process of the user already sits
//! in a group the user owns (`user@UID.service/app.slice/...`), but those groups belong to the
//! user's systemd manager: a daemon that made its sandboxes' groups there would write into a
//! tree another program manages. The manager hands out a tree of one's own on request:
//! `systemd-run --user --scope -p Delegate=yes belljard ...` puts the daemon alone in a new
//! scope that is its to divide. So the CLI's `belljar daemon start` and the app's sidecar
//! start go through it when the user's manager runs and the launcher is not already in a
//! delegated group; elsewhere (root, cgroup v1, no systemd, an administrator's delegation)
//! the daemon starts as it is. `belljar doctor` reports which, and why.
//!
//! The facts are gathered apart from the decision ([`Facts::gather`], [`decide`]) so that
//! the decision is tested on every kind of host without needing one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `0` starts the daemon directly even where a scope would be used; `1` asks for the scope
/// even when the facts say it is not needed (a user manager must still run).
pub const ENV: &str = "BELLJAR_SYSTEMD_SCOPE";

/// The extended attribute systemd puts on a group it delegated (`trusted.` by the system
/// manager, `user.` by a user's manager, which may not write `trusted.`).
const DELEGATE_XATTRS: [&str; 2] = ["trusted.delegate", "user.delegate"];

/// What the decision looks at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Facts {
    /// The effective user id of the launcher (the daemon's, too).
    pub uid: u32,
    /// `/sys/fs/cgroup` is the unified (v2) hierarchy.
    pub unified: bool,
    /// The launcher's own group (the one the daemon would inherit) is marked delegated by
    /// systemd.
    pub own_group_delegated: bool,
    /// The user's systemd manager runs: its private socket exists.
    pub user_manager: bool,
    /// `systemd-run` on `PATH`.
    pub systemd_run: Option<PathBuf>,
    /// The value of [`ENV`], if set.
    pub setting: Option<String>,
}

/// How the daemon is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// As it is; `reason` says why no scope, for `belljar doctor`.
    Direct { reason: String },
    /// Through `systemd-run --user --scope -p Delegate=yes`.
    Scope { systemd_run: PathBuf },
}

impl Facts {
    /// The facts of this process and host.
    pub fn gather() -> Self {
        let uid = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap_or(0);
        let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let own_group_delegated = own_v2_group()
            .map(|g| Path::new("/sys/fs/cgroup").join(g.trim_start_matches('/')))
            .is_some_and(|dir| marked_delegated(&dir));
        let runtime = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("/run/user/{uid}")));
        Self {
            uid,
            unified,
            own_group_delegated,
            user_manager: runtime.join("systemd/private").exists(),
            systemd_run: on_path("systemd-run"),
            setting: std::env::var(ENV).ok(),
        }
    }
}

/// Decides how to start the daemon from `facts`.
pub fn decide(facts: &Facts) -> Launch {
    let direct = |reason: &str| Launch::Direct {
        reason: reason.to_owned(),
    };
    let forced = facts.setting.as_deref() == Some("1");
    if facts.setting.as_deref() == Some("0") {
        return direct(&format!("{ENV}=0"));
    }
    if facts.uid == 0 && !forced {
        return direct("root: every cgroup is the daemon's to write");
    }
    if !facts.unified && !forced {
        return direct("not on the unified cgroup v2 hierarchy, where a scope would help");
    }
    if facts.own_group_delegated && !forced {
        return direct("already in a group systemd delegated");
    }
    if !facts.user_manager {
        return direct("no systemd user manager runs for this user");
    }
    match &facts.systemd_run {
        Some(path) => Launch::Scope {
            systemd_run: path.clone(),
        },
        None => direct("systemd-run is not on PATH"),
    }
}

impl Launch {
    /// The program and arguments that start `daemon` with `args` this way. The scope's unit
    /// name is left to systemd (a unique `run-*.scope`): a second daemon (another
    /// `BELLJAR_HOME`) must not collide with the first.
    pub fn command(&self, daemon: &Path, args: &[String]) -> (PathBuf, Vec<OsString>) {
        match self {
            Self::Direct { .. } => (daemon.to_owned(), args.iter().map(OsString::from).collect()),
            Self::Scope { systemd_run } => {
                let mut argv: Vec<OsString> = [
                    "--user",
                    "--scope",
                    "--quiet",
                    "--collect",
                    "-p",
                    "Delegate=yes",
                    "--description=Belljar daemon",
                    "--",
                ]
                .iter()
                .map(OsString::from)
                .collect();
                argv.push(daemon.as_os_str().to_owned());
                argv.extend(args.iter().map(OsString::from));
                (systemd_run.clone(), argv)
            }
        }
    }

    /// One line for `belljar doctor`.
    pub fn describe(&self) -> String {
        match self {
            Self::Direct { reason } => format!("started directly ({reason})"),
            Self::Scope { .. } => {
                "started in a delegated systemd scope (systemd-run --user --scope -p Delegate=yes)"
                    .to_owned()
            }
        }
    }
}

/// The launcher's group in the unified hierarchy (`0::/path` of `/proc/self/cgroup`).
fn own_v2_group() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// Whether systemd marked `dir` delegated.
fn marked_delegated(dir: &Path) -> bool {
    DELEGATE_XATTRS.iter().any(|name| {
        let mut value = [0u8; 8];
        rustix::fs::getxattr(dir, *name, &mut value[..]).is_ok_and(|n| value[..n] == *b"1")
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ordinary user on a systemd desktop: the case the scope is for.
    fn desktop() -> Facts {
        Facts {
            uid: 1000,
            unified: true,
            own_group_delegated: false,
            user_manager: true,
            systemd_run: Some(PathBuf::from("/usr/bin/systemd-run")),
            setting: None,
        }
    }

    fn is_direct(l: &Launch, why: &str) -> bool {
        matches!(l, Launch::Direct { reason } if reason.contains(why))
    }

    #[test]
    fn a_desktop_user_gets_a_delegated_scope() {
        let launch = decide(&desktop());
        assert_eq!(
            launch,
            Launch::Scope {
                systemd_run: "/usr/bin/systemd-run".into()
            }
        );
        let (program, argv) = launch.command(Path::new("/opt/bj/belljard"), &["--port".into()]);
        assert_eq!(program, Path::new("/usr/bin/systemd-run"));
        let argv: Vec<&str> = argv.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            argv,
            [
                "--user",
                "--scope",
                "--quiet",
                "--collect",
                "-p",
                "Delegate=yes",
                "--description=Belljar daemon",
                "--",
                "/opt/bj/belljard",
                "--port"
            ]
        );
    }

    #[test]
    fn each_missing_piece_starts_it_directly_and_says_why() {
        /// What the finding must say, and the change to a desktop's facts that causes it.
        type Case = (&'static str, fn(&mut Facts));
        let cases: [Case; 6] = [
            ("root", |f| f.uid = 0),
            ("unified", |f| f.unified = false),
            ("already in a group systemd delegated", |f| {
                f.own_group_delegated = true
            }),
            ("no systemd user manager", |f| f.user_manager = false),
            ("systemd-run is not on PATH", |f| f.systemd_run = None),
            ("BELLJAR_SYSTEMD_SCOPE=0", |f| f.setting = Some("0".into())),
        ];
        for (why, change) in cases {
            let mut facts = desktop();
            change(&mut facts);
            let launch = decide(&facts);
            assert!(is_direct(&launch, why), "{why}: {launch:?}");
            let (program, argv) = launch.command(Path::new("/opt/bj/belljard"), &[]);
            assert_eq!(program, Path::new("/opt/bj/belljard"));
            assert!(argv.is_empty());
            assert!(launch.describe().contains(why), "{}", launch.describe());
        }
    }

    #[test]
    fn forcing_the_scope_still_needs_a_user_manager() {
        let mut facts = desktop();
        facts.uid = 0;
        facts.unified = false;
        facts.own_group_delegated = true;
        facts.setting = Some("1".into());
        assert!(matches!(decide(&facts), Launch::Scope { .. }));
        facts.user_manager = false;
        assert!(is_direct(&decide(&facts), "no systemd user manager"));
    }

    /// This host's facts are read without failing, whatever the host (CI runs as root on
    /// cgroup v1 with no user manager; the rootless L1 host has no systemd either).
    #[test]
    fn gathering_this_hosts_facts_decides_something() {
        let facts = Facts::gather();
        let launch = decide(&facts);
        if !facts.user_manager {
            assert!(matches!(launch, Launch::Direct { .. }), "{facts:?}");
        }
    }
}
