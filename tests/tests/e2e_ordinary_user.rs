//! Belljar as an ordinary user on this host, the way README's set-up leaves one: a real
//! account made by `useradd -m` (which gives it a subordinate id range, as Debian's `adduser`
//! does), not in the `kvm` group, running the CLI, which starts the daemon, from its own home.
//! The user creates a namespace sandbox and runs a command in it through the CLI, asks for the
//! web UI's address and finds it answering, and reads the sandbox's limits: on cgroup v1 (this
//! build machine) none can be enforced without root, and each says so with the reason, while
//! the create still succeeds; nor is there a freezer, so `belljar pause` answers 501
//! `not_supported` with the reason and the sandbox runs on. The rootless L1 suite (`tests/microvm/rootless.sh`) covers
//! delegated cgroup v2; this covers the host CI runs on.
//!
//! The test needs root to make and remove the account. The built binaries and the image cache
//! usually sit under `/root`, which the user cannot enter, so each command of the user runs in
//! a private mount namespace where both are bind-mounted into a directory it can reach (the
//! daemon lives on in the namespace of the command that started it). The account, its home
//! (the rootless copy of `base`, the daemon's data) and its processes are removed at the end,
//! also when the test fails.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use belljar_client::{Client, Paths};
use belljar_e2e::{bin_dir, block_on, cache_dir, require_image};
use http::Method;
use procfs_core::FromRead;
use serde_json::Value;

/// Accounts of this test are named `bje2e<pid of the test>`, so that one left by a killed run
/// is found and removed by the next.
const PREFIX: &str = "bje2e";

/// The test's account; dropping it ends its processes and removes it with its home.
struct User {
    name: String,
    uid: u32,
    home: PathBuf,
    /// Where the binaries and the image cache are bind-mounted for the user.
    stage: tempfile::TempDir,
}

impl User {
    fn create() -> Self {
        remove_stale_accounts();
        let name = format!("{PREFIX}{}", std::process::id());
        run_ok(Command::new("useradd").args(["-m", "-s", "/bin/sh", &name]));
        let uid = id_of(&name, "-u");
        let passwd = run_ok(Command::new("getent").args(["passwd", &name]));
        let home = PathBuf::from(passwd.trim().split(':').nth(5).expect("a home directory"));
        let rootless = home.join(".cache/belljar-rootless");
        std::fs::create_dir_all(&rootless).unwrap();
        run_ok(
            Command::new("chown")
                .arg("-R")
                .arg(&name)
                .arg(home.join(".cache")),
        );
        let stage = tempfile::Builder::new()
            .prefix("belljar-e2e-user-")
            .tempdir_in("/tmp")
            .expect("staging directory");
        std::fs::set_permissions(stage.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for dir in ["bin", "cache/images"] {
            std::fs::create_dir_all(stage.path().join(dir)).unwrap();
        }
        Self {
            name,
            uid,
            home,
            stage,
        }
    }

    /// Runs `belljar args` as the user, in a clean environment of its own.
    fn belljar(&self, args: &[&str]) -> Output {
        let stage = self.stage.path();
        // The user's copy of `base` goes to a tmpfs that lives as long as the daemon's mount
        // namespace: written there it takes seconds even on a busy disk, and removing the
        // account does not have to delete its ~20,000 files.
        let script = "set -e; mount --bind \"$1\" \"$2\"; mount --bind \"$3\" \"$4\"; \
                      u=$5; mount -t tmpfs -o mode=0700,uid=$(id -u \"$u\"),gid=$(id -g \"$u\") \
                      belljar-rootless \"$6\"; \
                      shift 6; exec setpriv --reuid=\"$u\" --regid=\"$u\" --init-groups \"$@\"";
        let cache = stage.join("cache");
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(bin_dir())
            .arg(stage.join("bin"))
            .arg(cache_dir().join("images"))
            .arg(cache.join("images"))
            .arg(&self.name)
            .arg(self.home.join(".cache/belljar-rootless"))
            .arg("env")
            .arg("-i")
            .arg(format!("HOME={}", self.home.display()))
            .arg(format!("USER={}", self.name))
            .arg(format!("LOGNAME={}", self.name))
            .arg("PATH=/usr/local/bin:/usr/bin:/bin")
            .arg(format!("BELLJAR_CACHE={}", cache.display()))
            // Any free port: a root daemon of the host may hold the default one.
            .arg("BELLJAR_PORT=0")
            .arg(stage.join("bin/belljar"))
            .args(args)
            .current_dir("/")
            .output()
            .expect("unshare, setpriv (util-linux)")
    }

    fn belljar_ok(&self, args: &[&str]) -> String {
        let out = self.belljar(args);
        assert!(
            out.status.success(),
            "belljar {args:?} as {}: {}{}\ndaemon log:\n{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.daemon_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Where the user's daemon keeps its socket and files: the XDG directories under its home
    /// (its clean environment has no `XDG_RUNTIME_DIR`, so the socket is in the data
    /// directory). Root reaches them from outside the daemon's mount namespace: the home is
    /// the same in both.
    fn paths(&self) -> Paths {
        let data = self.home.join(".local/share/belljar");
        Paths {
            home: None,
            config: self.home.join(".config/belljar"),
            runtime: data.join("run"),
            data,
        }
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.paths().log_file()).unwrap_or_default()
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // Sandboxes first (their state holds files of subordinate ids), then the daemon.
        let listed = self.belljar(&["ls", "--json"]);
        let ids: Vec<String> = serde_json::from_slice::<Value>(&listed.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s["id"].as_str().map(str::to_owned))
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["rm"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.belljar(&args);
        }
        let _ = self.belljar(&["daemon", "stop"]);
        remove_account(&self.name, self.uid);
    }
}

/// The numeric id (`-u`) or group (`-g`) of an account.
fn id_of(name: &str, which: &str) -> u32 {
    let out = run_ok(Command::new("id").args([which, name]));
    out.trim().parse().expect("a numeric id")
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Ends every process of `uid` (all started by this test) and deletes the account, its home
/// and its subordinate ids.
fn remove_account(name: &str, uid: u32) {
    for _ in 0..50 {
        let pids = processes_of(uid);
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("userdel").args(["-r", "-f", name]).output();
}

fn processes_of(uid: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            // A zombie has ended already; where PID 1 does not reap orphans (this build
            // machine's), the daemon's stays a zombie of the user for good.
            let stat = procfs_core::process::Stat::from_file(e.path().join("stat")).ok()?;
            (e.metadata().ok()?.uid() == uid && stat.state != 'Z').then_some(pid)
        })
        .collect()
}

/// Accounts of earlier runs whose test process is gone.
fn remove_stale_accounts() {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    for line in passwd.lines() {
        let mut fields = line.split(':');
        let (Some(name), Some(_), Some(uid)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_account(name, uid.parse().unwrap_or(u32::MAX));
        }
    }
}

/// The start of `name`'s range in `/etc/subuid` (or `/etc/subgid`).
fn subordinate_start(file: &str, name: &str) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.lines().find_map(|l| {
        l.strip_prefix(&format!("{name}:"))?
            .split(':')
            .next()?
            .parse()
            .ok()
    })
}

/// Whether `/sys/fs/cgroup` is the legacy (v1 or hybrid) layout: a tmpfs of per-controller
/// mounts rather than the unified cgroup2 file system.
fn cgroup_v1() -> bool {
    !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

#[test]
fn an_ordinary_user_runs_belljar_from_its_home() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "this test makes an account (useradd) and runs Belljar as it: run it as root"
    );
    require_image("base");
    let user = User::create();
    let subuid = subordinate_start("/etc/subuid", &user.name)
        .expect("useradd gives a new account a subordinate uid range (SUB_UID_* in login.defs)");

    // Not a member of `kvm`: sandboxes use namespaces, and say why.
    let doctor: Value = serde_json::from_str(&user.belljar_ok(&["doctor", "--json"])).unwrap();
    let finding = |check: &str| -> Value {
        doctor["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == check)
            .unwrap_or_else(|| panic!("no {check} finding: {doctor:#}"))
            .clone()
    };
    assert_eq!(finding("subids")["status"], "ok", "{doctor:#}");
    if cgroup_v1() {
        let cgroup = finding("cgroup");
        assert_eq!(cgroup["status"], "warning", "{cgroup:#}");
        assert!(
            cgroup["found"]
                .as_str()
                .unwrap()
                .contains("limits are not enforced"),
            "{cgroup:#}"
        );
    }

    // The first command starts the daemon as the user (the CLI does it), from the user's
    // own directories.
    let id = user.belljar_ok(&["create"]).trim().to_owned();
    assert!(id.starts_with("sbx_"), "{id:?}");
    let pid = user.paths().pid().expect("the daemon's pid file");
    let daemon_uid = std::fs::metadata(format!("/proc/{pid}")).unwrap().uid();
    assert_eq!(daemon_uid, user.uid, "belljard runs as the user");

    // Inside, the command runs as the image's `belljar` user (1000), which is the user's
    // subordinate id subuid + 999 on the host: the sandbox's root is the user itself.
    let out = user.belljar_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "id -u; cat /proc/self/uid_map; echo made > /tmp/f; cat /tmp/f",
    ]);
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["1000"], "{out}");
    assert_eq!(lines[1], ["0", &user.uid.to_string(), "1"], "{out}");
    assert_eq!(lines[2], ["1", &subuid.to_string(), "65535"], "{out}");
    assert_eq!(lines[3], ["made"], "{out}");

    let info: Value = serde_json::from_str(&user.belljar_ok(&["info", "--json", &id])).unwrap();
    assert_eq!(info["backend"], "namespace", "{info:#}");
    for limit in ["memory", "cpu", "pids", "disk"] {
        let l = &info["limits"][limit];
        if !l["enforced"].as_bool().unwrap() {
            assert!(!l["detail"].as_str().unwrap().is_empty(), "{limit}: {l}");
        }
    }
    if cgroup_v1() {
        for limit in ["memory", "cpu", "pids"] {
            let l = &info["limits"][limit];
            assert_eq!(l["enforced"], false, "{limit}: {l}");
            assert!(
                l["detail"].as_str().unwrap().contains("cgroup v1"),
                "{limit}: {l}"
            );
        }
    }
    // The disk limit needs a loop mount, which only root may make.
    assert_eq!(info["limits"]["disk"]["enforced"], false, "{info:#}");

    // Nor is there a freezer without root on cgroup v1: pause is refused, saying why (501
    // `not_supported` from the API, that code from the CLI), and the sandbox runs on.
    if cgroup_v1() {
        let out = user.belljar(&["pause", &id]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("(not_supported)") && err.contains("freezing needs cgroup v2"),
            "{err}"
        );
        let refused = block_on(Client::local(&user.paths()).pause_sandbox(&id))
            .expect_err("pause without a freezer");
        assert_eq!(refused.status(), Some(501), "{refused}");
        assert_eq!(refused.code(), "not_supported", "{refused}");
        let info: Value = serde_json::from_str(&user.belljar_ok(&["info", "--json", &id])).unwrap();
        assert_eq!(info["status"], "running", "{info:#}");
        assert_eq!(user.belljar_ok(&["exec", &id, "--", "echo", "on"]), "on\n");
    }

    // The web UI's one-time address answers: the token is exchanged for a session cookie.
    let url = user.belljar_ok(&["ui", "--no-open"]);
    assert_eq!(ui_status(url.trim()), 303, "{url}");

    // Only root builds images (debootstrap, chroot): the user's daemon refuses at once and
    // names the command that builds one into the user's own cache with sudo.
    let out = user.belljar(&["images", "build", "base"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let sudo = format!(
        "sudo env BELLJAR_CACHE={} ",
        user.stage.path().join("cache").display()
    );
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("(forbidden)") && err.contains(&sudo) && err.contains("build-image.sh base`"),
        "{err}"
    );
}

/// The status of a GET of the UI's one-time address `url` (`http://127.0.0.1:PORT/ui?token=...`),
/// sent as a browser opening it would: without the bearer token.
fn ui_status(url: &str) -> u16 {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (addr, path) = rest.split_at(rest.find('/').expect("a path"));
    let client = Client::tcp(addr.parse().expect("IP:PORT"), None);
    let req = client
        .builder(Method::GET, path)
        .body(belljar_client::empty())
        .unwrap();
    let resp =
        block_on(async { tokio::time::timeout(Duration::from_secs(10), client.send(req)).await })
            .expect("the daemon answers within 10 s")
            .expect("the daemon answers");
    resp.status().as_u16()
}
