//! The daemon's configuration: command-line flags, each also readable from a `BELLJAR_*`
//! environment variable, and the record of them ([`Config::load`]) that a later start by the
//! CLI gives back (`belljar_client::settings`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use belljar_client::settings::DaemonSettings;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};

/// Settings read from the environment outside the flags (by the sandboxes' network and the
/// log), recorded with the flags' so that they come back too.
const OTHER_SETTINGS: &[&str] = &[
    "BELLJAR_DNS_SERVERS",
    "BELLJAR_BROKER_CA",
    "BELLJAR_TAP_VIA_CHILD",
    "BELLJAR_LOG",
];

/// belljard: the Belljar daemon. It owns every sandbox and serves the API on a Unix socket
/// (`<runtime>/belljard.sock`) and on 127.0.0.1.
#[derive(Debug, Clone, Parser)]
#[command(name = "belljard", version)]
pub struct Config {
    /// Root of data, config and runtime directories (tests use a temporary one); without it
    /// the user's XDG directories are used.
    #[arg(long, env = "BELLJAR_HOME")]
    pub home: Option<PathBuf>,
    /// The image cache, shared across homes; default `${XDG_CACHE_HOME:-~/.cache}/belljar`.
    #[arg(long, env = "BELLJAR_CACHE")]
    pub cache: Option<PathBuf>,
    /// TCP port on 127.0.0.1; 0 picks a free one. Without it the daemon takes 7423, or a free
    /// port when another program (another daemon's home) holds 7423; a port asked for here
    /// that is taken is an error. The port is written to `<runtime>/port`, where clients read it.
    #[arg(long, env = "BELLJAR_PORT")]
    pub port: Option<u16>,
    /// The built web UI; default `<repo>/ui/dist`.
    #[arg(long, env = "BELLJAR_UI_DIR")]
    pub ui_dir: Option<PathBuf>,
    /// The `guest-images/` directory with `build-image.sh`; default `<repo>/guest-images`.
    #[arg(long, env = "BELLJAR_GUEST_IMAGES")]
    pub guest_images: Option<PathBuf>,
    /// The `belljar-agent` binary for namespace sandboxes; default `belljar-agent` next to
    /// this executable, else the image's own `/sbin/belljar-agent`.
    #[arg(long, env = "BELLJAR_AGENT")]
    pub agent: Option<PathBuf>,
    /// The `belljar-vmm` binary; default `belljar-vmm` next to this executable.
    #[arg(long, env = "BELLJAR_VMM")]
    pub vmm: Option<PathBuf>,
    /// The guest kernel of microVMs; default the newest `<cache>/kernel/*/vmlinux`.
    #[arg(long, env = "BELLJAR_KERNEL")]
    pub kernel: Option<PathBuf>,
    /// The longest timeout a sandbox may have, e.g. `24h`. Like every duration here, a bare
    /// number is seconds (`300` is five minutes); units: ms, s, m, h, d.
    #[arg(long, env = "BELLJAR_MAX_TIMEOUT", default_value = "24h", value_parser = parse_duration)]
    pub max_timeout: i64,
    /// The default sandbox timeout, e.g. `5m`; a bare number is seconds.
    #[arg(long, env = "BELLJAR_DEFAULT_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub default_timeout: i64,
    /// How long a new sandbox's agent gets to answer, e.g. `20s`; a bare number is seconds.
    /// Microvm sandboxes on nested
    /// KVM (the test harness, `scripts/test-microvm.sh`) boot in tens of seconds.
    #[arg(long, env = "BELLJAR_READY_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub ready_timeout: i64,
    /// Host memory (MiB) never given to sandboxes.
    #[arg(long, env = "BELLJAR_MEMORY_RESERVE_MIB", default_value_t = 512)]
    pub memory_reserve_mib: u64,
    /// How far sandboxes' memory limits may add up past the host's RAM: the sum of the limits
    /// of live sandboxes stays within this many times `MemTotal`. Limits are caps, and a new
    /// sandbox is admitted by what the others use; this bounds the case of all of them
    /// growing to their caps at once. A ratio over 0, at most 1000.
    #[arg(long, env = "BELLJAR_MEMORY_OVERCOMMIT",
          default_value_t = crate::sandbox::admission::DEFAULT_OVERCOMMIT,
          value_parser = parse_overcommit)]
    pub memory_overcommit: f64,
    /// Testing only (the nested-KVM harness, `scripts/test-microvm.sh`): accept explicit
    /// `--backend microvm` requests on KVM that the speed probe rejects as too slow. `auto`
    /// still follows the probe.
    #[arg(long, env = "BELLJAR_TESTING_FORCE_MICROVM", hide = true,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub testing_force_microvm: bool,
    /// Testing only: how long the Vercel layer's JWTs live (an hour), so that a test sees one
    /// renewed and one expire in seconds.
    #[arg(long, env = "BELLJAR_TESTING_VERCEL_TOKEN_LIFETIME", hide = true, default_value = "1h",
          value_parser = parse_duration)]
    pub testing_vercel_token_lifetime: i64,
    /// Output bytes a sandbox keeps per command; the agent's own default (64 MiB) when unset. Bytes over it are dropped and reported as
    /// `output_truncated_bytes`.
    #[arg(long, env = "BELLJAR_COMMAND_OUTPUT_LIMIT", value_parser = clap::value_parser!(u64).range(1..))]
    pub command_output_limit: Option<u64>,
    /// Snapshot chains deeper than this many layers are squashed into one in the background
    /// (snapshot ids and files stay); 2..=128.
    #[arg(long, env = "BELLJAR_SQUASH_DEPTH", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(2..=128))]
    pub squash_depth: u16,
    /// The warm pool: sandboxes started ahead of demand per image, e.g. `base=2`
    /// (comma-separated `IMAGE=N`, N ≤ 64), on the default backend with the default limits.
    /// Off by default: each pooled sandbox holds its processes (a booted VM on the microVM
    /// backend) while it waits. A create with files, a source, ports or other limits
    /// is launched as usual.
    #[arg(long, env = "BELLJAR_POOL", default_value = "")]
    pub pool: crate::sandbox::PoolSizes,
    /// Blank disks of the default size kept formatted and mounted ahead of the namespace
    /// sandboxes' starts that the warm pool does not serve (forks, sandboxes from snapshots),
    /// 0..=16. Root only; each holds a loop device and ~2 MiB in the data directory.
    #[arg(long, env = "BELLJAR_DISK_POOL", default_value_t = 2,
          value_parser = clap::value_parser!(u8).range(0..=16))]
    pub disk_pool: u8,
    /// How long a client of the TCP port may take to send a request's headers before its
    /// connection is closed, e.g. `10s`; a bare number is seconds. The Unix socket has no such
    /// bound.
    #[arg(long, env = "BELLJAR_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: i64,
    /// How many connections to the TCP port may be open that have not yet sent the token or a
    /// session cookie; a new one over this is closed at once. 1..=65535.
    #[arg(long, env = "BELLJAR_MAX_UNAUTHENTICATED_CONNECTIONS", default_value_t = 256,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_unauthenticated_connections: u16,
    /// A host folder under which TCP callers (the browser UI, SDKs) may mount folders into
    /// sandboxes; repeatable, none by default. Unix-socket callers (the CLI) may mount what
    /// their own user may read, wherever it is.
    #[arg(
        long = "allow-mount-root",
        env = "BELLJAR_ALLOW_MOUNT_ROOTS",
        value_delimiter = ','
    )]
    pub allow_mount_roots: Vec<PathBuf>,
    /// Extra browser origins allowed to call the daemon (e.g. a UI dev server), comma-separated.
    #[arg(long, env = "BELLJAR_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// The settings this start was given, as [`Config::load`] found them.
    #[arg(skip)]
    pub settings: DaemonSettings,
}

/// A positive duration in milliseconds, read by the API's one rule (a bare number is seconds).
fn parse_duration(text: &str) -> Result<i64, String> {
    match belljar_api::duration::parse_ms(text) {
        Ok(ms) if ms > 0 => Ok(ms),
        Ok(_) => Err(format!("{text:?}: must be longer than zero")),
        Err(e) => Err(e.to_string()),
    }
}

/// A ratio of memory limits to host RAM: finite, over 0, at most 1000.
fn parse_overcommit(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if ratio > 0.0 && ratio <= 1000.0 => Ok(ratio),
        Ok(_) => Err(format!("{text:?}: must be over 0 and at most 1000")),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

impl Config {
    /// Parses the command line and the environment, and records what was given: each flag
    /// given on the command line or by its variable, under that variable, with its text as
    /// given (not defaults, which a later start has anyway), and the [`OTHER_SETTINGS`] that
    /// are set. Left out: `BELLJAR_HOME`, which says where the record is, and the hidden
    /// testing flags, which a later start by the CLI must not inherit.
    pub fn load() -> Self {
        Self::load_from(std::env::args_os(), |name| std::env::var(name).ok())
    }

    fn load_from(
        args: impl IntoIterator<Item = std::ffi::OsString>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let command = Self::command();
        let matches = command.clone().get_matches_from(args);
        let mut config = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let mut settings = BTreeMap::new();
        for arg in command.get_arguments() {
            let (Some(name), id) = (arg.get_env(), arg.get_id().as_str()) else {
                continue;
            };
            let given = matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
            if !given || arg.is_hide_set() || name == "BELLJAR_HOME" {
                continue;
            }
            let Some(raw) = matches.get_raw(id) else {
                continue;
            };
            let values: Vec<&str> = raw.filter_map(|v| v.to_str()).collect();
            settings.insert(name.to_string_lossy().into_owned(), values.join(","));
        }
        for name in OTHER_SETTINGS {
            if let Some(value) = env(name) {
                settings.insert((*name).to_owned(), value);
            }
        }
        config.settings = DaemonSettings { env: settings };
        config
    }

    /// The repository root this daemon was built from: the default UI and image paths of a
    /// daemon run from its build tree (an installed one uses its package's copies).
    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The web UI: the flag, else the installed package's (`<prefix>/lib/belljar/ui`), else
    /// the build tree's `ui/dist`.
    pub fn ui_dir(&self) -> PathBuf {
        self.ui_dir
            .clone()
            .or_else(|| belljar_client::paths::installed_data("ui"))
            .unwrap_or_else(|| Self::repo().join("ui/dist"))
    }

    /// The image build script and recipes: the flag, else the installed package's
    /// (`<prefix>/lib/belljar/guest-images`, with the guest agent beside the script), else the
    /// build tree's `guest-images`.
    pub fn guest_images(&self) -> PathBuf {
        self.guest_images
            .clone()
            .or_else(|| belljar_client::paths::installed_data("guest-images"))
            .unwrap_or_else(|| Self::repo().join("guest-images"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flags and variables given are recorded under their variables, defaults, the home and
    /// testing flags are not.
    #[test]
    fn the_settings_given_are_recorded() {
        let args = [
            "belljard",
            "--home",
            "/tmp/h",
            "--pool",
            "base=2",
            "--allowed-origins",
            "http://a,http://b",
            "--testing-force-microvm",
        ]
        .map(std::ffi::OsString::from);
        let env = |name: &str| (name == "BELLJAR_DNS_SERVERS").then(|| "127.0.0.1:5353".to_owned());
        let c = Config::load_from(args, env);
        assert_eq!(c.pool.0, [("base".to_owned(), 2)]);
        // Among the names this test is about (the environment of a CI run may set others).
        let about = [
            "BELLJAR_ALLOWED_ORIGINS",
            "BELLJAR_DNS_SERVERS",
            "BELLJAR_POOL",
            "BELLJAR_HOME",
            "BELLJAR_TESTING_FORCE_MICROVM",
            "BELLJAR_MAX_TIMEOUT",
        ];
        let recorded: Vec<(&str, &str)> = c
            .settings
            .env
            .iter()
            .filter(|(k, _)| about.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            recorded,
            [
                ("BELLJAR_ALLOWED_ORIGINS", "http://a,http://b"),
                ("BELLJAR_DNS_SERVERS", "127.0.0.1:5353"),
                ("BELLJAR_POOL", "base=2"),
            ]
        );
    }

    #[test]
    fn flags_parse_with_defaults() {
        let c = Config::try_parse_from(["belljard", "--home", "/tmp/h", "--port", "0"]).unwrap();
        assert_eq!(c.port, Some(0));
        assert_eq!(Config::try_parse_from(["belljard"]).unwrap().port, None);
        assert_eq!(c.max_timeout, 86_400_000);
        assert_eq!(c.default_timeout, 300_000);
        assert_eq!(c.ready_timeout, 20_000);
        assert!(!c.testing_force_microvm);
        let c = Config::try_parse_from(["belljard", "--testing-force-microvm"]).unwrap();
        assert!(c.testing_force_microvm);
        assert!(c.ui_dir().ends_with("ui/dist"));
        assert!(Config::try_parse_from(["belljard", "--max-timeout", "-5m"]).is_err());
        assert!(Config::try_parse_from(["belljard", "--max-timeout", "0"]).is_err());
        assert_eq!(c.memory_overcommit, 10.0);
        let c = Config::try_parse_from(["belljard", "--memory-overcommit", "1.5"]).unwrap();
        assert_eq!(c.memory_overcommit, 1.5);
        for bad in ["0", "-1", "nan", "inf", "1001", "x"] {
            let parsed = Config::try_parse_from(["belljard", "--memory-overcommit", bad]);
            assert!(parsed.is_err(), "{bad}");
        }
    }

    /// A bare number is seconds, as in the CLI: `300` is five minutes, not 0.3 s (the daemon
    /// used to read it as milliseconds).
    #[test]
    fn a_bare_number_is_seconds() {
        let c = Config::try_parse_from([
            "belljard",
            "--default-timeout",
            "300",
            "--max-timeout",
            "86400",
            "--ready-timeout",
            "1m30s",
        ])
        .unwrap();
        assert_eq!(c.default_timeout, 300_000);
        assert_eq!(c.max_timeout, 86_400_000);
        assert_eq!(c.ready_timeout, 90_000);
    }
}
