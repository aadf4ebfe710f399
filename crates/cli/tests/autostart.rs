//! A daemon that the CLI starts by itself (a command run while none is up) comes back with
//! the settings of its last start, not with the environment of that command; a variable the
//! command sets wins. The real `belljar` and the real `belljard` (built beside it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `belljard`, built beside `belljar` (`cargo test --workspace` builds both).
fn belljard() -> PathBuf {
    let cli = Path::new(env!("CARGO_BIN_EXE_belljar"));
    let daemon = cli.with_file_name("belljard");
    assert!(
        daemon.is_file(),
        "{} is missing: build it with `cargo build -p belljard`",
        daemon.display()
    );
    daemon
}

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn belljar(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_belljar"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("BELLJAR_HOME", self.dir.path())
            .env("BELLJAR_CACHE", self.dir.path().join("cache"))
            .env("BELLJARD", belljard())
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "belljar {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// The environment of the running daemon, as its process has it.
    fn daemon_env(&self, name: &str) -> Option<String> {
        let pid = std::fs::read_to_string(self.dir.path().join("run/belljard.pid")).unwrap();
        let environ = std::fs::read(format!("/proc/{}/environ", pid.trim())).unwrap();
        let prefix = format!("{name}=");
        environ
            .split(|b| *b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix(&prefix).map(str::to_owned))
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_belljar"))
            .args(["daemon", "stop"])
            .env("BELLJAR_HOME", self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn an_autostarted_daemon_has_the_settings_of_its_last_start() {
    let home = Home {
        dir: tempfile::tempdir().unwrap(),
    };
    // Started by hand with settings: a flag's variable and one the network reads.
    home.belljar(
        &["daemon", "start", "--port", "0"],
        &[
            ("BELLJAR_DNS_SERVERS", "127.0.0.1:5353"),
            ("BELLJAR_HEADER_READ_TIMEOUT", "7s"),
        ],
    );
    assert_eq!(
        home.daemon_env("BELLJAR_DNS_SERVERS").as_deref(),
        Some("127.0.0.1:5353")
    );
    home.belljar(&["daemon", "stop"], &[]);
    // Any command with none of them set brings the daemon back with them.
    home.belljar(&["ls"], &[]);
    assert_eq!(
        home.daemon_env("BELLJAR_DNS_SERVERS").as_deref(),
        Some("127.0.0.1:5353")
    );
    assert_eq!(
        home.daemon_env("BELLJAR_HEADER_READ_TIMEOUT").as_deref(),
        Some("7s")
    );
    // A variable the command sets is what it means: it wins, and is the record from then on.
    home.belljar(&["daemon", "stop"], &[]);
    home.belljar(&["ls"], &[("BELLJAR_DNS_SERVERS", "127.0.0.2:53")]);
    assert_eq!(
        home.daemon_env("BELLJAR_DNS_SERVERS").as_deref(),
        Some("127.0.0.2:53")
    );
    let record =
        std::fs::read_to_string(home.dir.path().join("data/daemon-settings.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["env"]["BELLJAR_DNS_SERVERS"], "127.0.0.2:53");
    assert_eq!(record["env"]["BELLJAR_HEADER_READ_TIMEOUT"], "7s");
    assert!(record["env"].get("BELLJAR_HOME").is_none(), "{record}");
}
