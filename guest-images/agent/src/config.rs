//! The agent's configuration, from its command line and from `BELLJAR_*` environment
//! variables (the kernel hands `KEY=value` parameters of its command line to init as
//! environment), so one binary serves a microVM, a namespace sandbox and the tests.

use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, ValueEnum};

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path (namespace backend, tests).
    Unix(PathBuf),
    /// An AF_VSOCK port on any CID (inside a microVM).
    Vsock(u32),
    /// A Unix socket already bound and listening, inherited as this descriptor (the namespace
    /// backend binds it on the host, in a directory the sandbox cannot reach, so the guest can
    /// never swap the socket the daemon connects to).
    Fd(i32),
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The listen address has none of the `unix:`, `vsock:` or `fd:` prefixes.
    #[error("Listen address must be unix:PATH, vsock:PORT or fd:N, not {0}")]
    BadListen(String),
    /// No listen address for a mode that has no default.
    #[error("--listen (BELLJAR_LISTEN) is required in {0:?} mode")]
    NoListen(Mode),
}

impl FromStr for ListenAddr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.is_empty() {
                return Ok(ListenAddr::Unix(PathBuf::from(path)));
            }
        } else if let Some(Ok(port)) = s.strip_prefix("vsock:").map(str::parse) {
            return Ok(ListenAddr::Vsock(port));
        } else if let Some(Ok(fd)) = s.strip_prefix("fd:").map(str::parse::<i32>)
            && fd > 2
        {
            return Ok(ListenAddr::Fd(fd));
        }
        Err(ConfigError::BadListen(s.to_owned()))
    }
}

/// What the agent is running inside, which decides its mount plan and PID 1 duties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// PID 1 of a microVM: mounts everything, the overlay, pivots into it, powers off.
    Microvm,
    /// PID 1 of a namespace sandbox whose root is already set up.
    Namespace,
    /// An ordinary process (tests): no mounts, no PID 1 duties.
    Plain,
}

/// The agent inside a Belljar sandbox.
#[derive(Debug, Clone, Parser)]
#[command(name = "belljar-agent", version)]
pub struct Config {
    /// unix:PATH or vsock:PORT (vsock:1024 by default in microvm mode).
    #[arg(long, env = "BELLJAR_LISTEN")]
    pub listen: Option<String>,
    /// microvm, namespace or plain (microvm when PID 1, else plain).
    #[arg(long, env = "BELLJAR_MODE", value_enum)]
    pub mode: Option<Mode>,
    /// Where detached command output is kept (/run/belljar, or a temp dir in plain mode).
    #[arg(long, env = "BELLJAR_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Where uploads in progress are written down, so that the temporary files of those a
    /// dead agent did not finish are removed at its next start (`files::pending`); default
    /// `/var/lib/.belljar-uploads` on the sandbox's own disk, `<state dir>/uploads` in plain
    /// mode. It exists only while an upload is in progress.
    #[arg(long, env = "BELLJAR_UPLOAD_JOURNAL")]
    pub upload_journal: Option<PathBuf>,
    /// The sandbox's hostname (set in microvm and namespace modes).
    #[arg(long, env = "BELLJAR_HOSTNAME")]
    pub hostname: Option<String>,
    /// Mount, run one command, print BELLJAR-SELFCHECK-OK or -FAILED, power off.
    #[arg(long, env = "BELLJAR_SELFCHECK", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub selfcheck: bool,
    /// Bytes of output kept per command; the rest is dropped and counted.
    #[arg(long, env = "BELLJAR_OUTPUT_LIMIT", default_value_t = 64 << 20)]
    pub output_limit: u64,
    /// The block device holding the sandbox's writable layer (microvm mode); a tmpfs layer is
    /// used when it does not exist.
    #[arg(long, env = "BELLJAR_LAYER_DEVICE", default_value = "/dev/vdb")]
    pub layer_device: PathBuf,
    /// Read-only block devices of snapshot layers (microvm mode), topmost first: each is
    /// mounted and stacked between the writable layer and the image.
    #[arg(long, env = "BELLJAR_LOWER_DEVICES", value_delimiter = ',')]
    pub lower_devices: Vec<PathBuf>,
    /// Unix milliseconds to set the clock to at boot (microvm mode), when the VMM knows better
    /// than the RTC.
    #[arg(long, env = "BELLJAR_CLOCK_MS")]
    pub clock_ms: Option<i64>,
    /// The sandbox's network (`eth0` and `/etc/resolv.conf`), as the daemon sets it
    /// (`belljar_agent_proto::net`); without it the sandbox has only loopback.
    #[arg(long, env = belljar_agent_proto::net::NET_ENV)]
    pub net: Option<belljar_agent_proto::net::NetSetup>,
    /// The broker CA's certificate (PEM) to install before serving (`belljar_agent_proto::
    /// net::CA_ENV`, see `ca`); in microvm and namespace modes only.
    #[arg(long, env = belljar_agent_proto::net::CA_ENV)]
    pub ca_pem: Option<String>,
    /// Directory snapshots to mount at boot (microvm mode), as the daemon sets them
    /// (`belljar_agent_proto::mounts`).
    #[arg(long, env = belljar_agent_proto::mounts::MOUNTS_ENV)]
    pub mounts: Option<belljar_agent_proto::mounts::GuestMounts>,
}

impl Config {
    /// Parses the command line; as PID 1, arguments the kernel passed through that the agent
    /// does not know are ignored and only the environment counts.
    pub fn load() -> Result<Self, clap::Error> {
        match Config::try_parse() {
            Ok(config) => Ok(config),
            Err(e) if std::process::id() == 1 && e.use_stderr() => {
                eprintln!("belljar-agent: ignoring the command line: {e}");
                Config::try_parse_from(["belljar-agent"])
            }
            Err(e) => Err(e),
        }
    }

    /// The mode, defaulting on whether the agent is PID 1.
    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(if std::process::id() == 1 {
            Mode::Microvm
        } else {
            Mode::Plain
        })
    }

    /// The listen address, defaulting to vsock in microvm mode.
    pub fn listen_addr(&self) -> Result<ListenAddr, ConfigError> {
        match (&self.listen, self.mode()) {
            (Some(addr), _) => addr.parse(),
            (None, Mode::Microvm) => Ok(ListenAddr::Vsock(belljar_agent_proto::AGENT_VSOCK_PORT)),
            (None, mode) => Err(ConfigError::NoListen(mode)),
        }
    }

    /// The journal of uploads in progress. Not in the state directory, which is a tmpfs in a
    /// sandbox and so forgets what it held at a restart, when the temporary files it names are
    /// still on the sandbox's disk.
    pub fn upload_journal(&self) -> PathBuf {
        match (&self.upload_journal, self.mode()) {
            (Some(dir), _) => dir.clone(),
            (None, Mode::Plain) => self.state_dir().join("uploads"),
            (None, _) => PathBuf::from("/var/lib/.belljar-uploads"),
        }
    }

    /// Where state (command output) lives.
    pub fn state_dir(&self) -> PathBuf {
        match (&self.state_dir, self.mode()) {
            (Some(dir), _) => dir.clone(),
            (None, Mode::Plain) => {
                std::env::temp_dir().join(format!("belljar-agent-{}", std::process::id()))
            }
            (None, _) => PathBuf::from("/run/belljar"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_addresses() {
        assert_eq!(
            "unix:/tmp/a.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/tmp/a.sock".into())
        );
        assert_eq!(
            "vsock:1024".parse::<ListenAddr>().unwrap(),
            ListenAddr::Vsock(1024)
        );
        assert_eq!("fd:3".parse::<ListenAddr>().unwrap(), ListenAddr::Fd(3));
        assert!("fd:1".parse::<ListenAddr>().is_err());
        assert!("fd:-4".parse::<ListenAddr>().is_err());
        assert!("tcp:1".parse::<ListenAddr>().is_err());
        assert!("vsock:x".parse::<ListenAddr>().is_err());
        assert!("unix:".parse::<ListenAddr>().is_err());
    }

    #[test]
    fn flags_parse() {
        let c = Config::try_parse_from([
            "belljar-agent",
            "--mode",
            "plain",
            "--listen",
            "unix:/x",
            "--selfcheck",
        ])
        .unwrap();
        assert_eq!(c.mode(), Mode::Plain);
        assert!(c.selfcheck);
        assert_eq!(c.output_limit, 64 << 20);
        let c = Config::try_parse_from(["belljar-agent"]).unwrap();
        assert!(!c.selfcheck);
    }
}
