//! The command line of `belljar`, parsed by clap.

use clap::{Args, Parser, Subcommand};

/// Local, disposable Linux sandboxes.
#[derive(Debug, Parser)]
#[command(name = "belljar", version, about, propagate_version = true)]
pub struct Cli {
    /// Print the API's JSON instead of tables (read commands).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// List sandboxes.
    Ls(LsArgs),
    /// Show one sandbox.
    Info {
        /// Sandbox id or name.
        id: String,
    },
    /// Show what a running or paused sandbox uses now: memory, CPU time, processes.
    Usage {
        /// Sandbox id or name.
        id: String,
    },
    /// Run a command in a sandbox; exits with the command's exit status.
    Exec(ExecArgs),
    /// Create a sandbox, run one command in it, then delete it.
    Run(RunArgs),
    /// Open an interactive shell in a sandbox.
    Sh {
        /// Sandbox id or name.
        id: String,
        /// Working directory of the shell.
        #[arg(long)]
        cwd: Option<String>,
        /// Run the shell as root.
        #[arg(long)]
        sudo: bool,
    },
    /// Copy files or directories; either side may be ID:/path.
    Cp {
        src: String,
        dst: String,
        /// Do not show a progress bar.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Print the output of a sandbox's commands (all of them, or CMD_ID).
    Logs {
        /// Sandbox id or name.
        id: String,
        /// One command; default: every command, oldest first.
        cmd_id: Option<String>,
        /// Keep printing output until the (last) command exits.
        #[arg(short, long)]
        follow: bool,
    },
    /// Add time to a sandbox's timeout (e.g. 10m, 90s, 1h; a bare number is seconds).
    Extend {
        /// Sandbox id or name.
        id: String,
        /// How much time to add: a bare number is seconds; or 250ms, 90s, 10m, 1h30m, 2d.
        duration: String,
    },
    /// Stop a sandbox (its record, logs and files stay until `rm`).
    Stop {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Delete sandboxes, stopping them first.
    Rm {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Pause sandboxes: their processes stay in memory, frozen, until `resume`.
    Pause {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Resume paused sandboxes.
    Resume {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Start stopped persistent sandboxes again, each from its latest snapshot.
    Start {
        /// Sandbox ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Start a new sandbox from a running one's current files (it keeps running), with its
    /// configuration; prints the new sandbox's id.
    Fork(ForkArgs),
    /// Snapshot a sandbox's files; by default the sandbox stops (use --keep-running).
    Snapshot {
        /// Sandbox id or name.
        id: String,
        /// Keep the sandbox running (its processes are frozen while the files are copied).
        #[arg(long)]
        keep_running: bool,
        /// How long the snapshot lives after its last use, e.g. 14d; `none` never expires
        /// (default: the sandbox's setting, else 30 days).
        #[arg(long)]
        expiration: Option<String>,
        /// Snapshot only this directory (the sandbox keeps running); mount the snapshot into
        /// other sandboxes with `create --mount SNAPSHOT:PATH`.
        #[arg(long, value_name = "DIR", conflicts_with = "keep_running")]
        path: Option<String>,
    },
    /// Mount a directory snapshot at a path of a running sandbox (copy-on-write); without a
    /// snapshot, list the sandbox's mounts.
    Mount {
        /// Sandbox id or name.
        id: String,
        /// A directory snapshot (`snapshot ID --path DIR`).
        #[arg(requires = "path")]
        snapshot: Option<String>,
        /// Absolute path in the sandbox; made when missing, hidden while mounted.
        path: Option<String>,
    },
    /// Unmount the snapshot mounted at a path; the sandbox's writes under it are discarded.
    Unmount {
        /// Sandbox id or name.
        id: String,
        /// The exact path it was mounted at.
        path: String,
    },
    /// List or delete snapshots (default: list).
    Snapshots {
        #[command(subcommand)]
        action: Option<SnapshotsCmd>,
    },
    /// Named volumes: files that outlive sandboxes, mounted with `-v NAME:PATH`.
    Volumes {
        #[command(subcommand)]
        action: VolumesCmd,
    },
    /// Templates: an image plus the defaults of the sandboxes made from it (limits, env,
    /// network policy, timeout) and a warm pool; `belljar create --template NAME`.
    Templates {
        #[command(subcommand)]
        action: TemplatesCmd,
    },
    /// List images, or build one.
    Images {
        #[command(subcommand)]
        action: Option<ImagesCmd>,
    },
    /// Check what this host offers Belljar and print what is missing, with the fix.
    Doctor,
    /// Start, stop or inspect the daemon.
    Daemon {
        #[command(subcommand)]
        action: DaemonCmd,
    },
    /// Open the web UI in a browser (prints its one-time URL).
    Ui {
        /// Only print the URL.
        #[arg(long)]
        no_open: bool,
    },
    /// Show or replace a sandbox's firewall, or read its flows.
    Network {
        #[command(subcommand)]
        action: NetworkCmd,
    },
    /// Expose a sandbox's TCP ports on 127.0.0.1, list or remove them.
    Port {
        #[command(subcommand)]
        action: PortCmd,
    },
    /// Print a shell completion script.
    Completions { shell: clap_complete::Shell },
    /// Serve the Model Context Protocol on stdin/stdout, for agents (starts the daemon if
    /// needed).
    Mcp,
    /// Run a program with Vercel's Sandbox SDK (`@vercel/sandbox`) pointed at this daemon:
    /// `belljar vercel -- node app.mjs`; `belljar vercel env` prints the variables instead.
    #[command(args_conflicts_with_subcommands = true)]
    Vercel {
        #[command(subcommand)]
        action: Option<VercelCmd>,
        /// The program and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Run a program with Sandbox0's SDK (`sandbox0`) pointed at this daemon:
    /// `belljar sandbox0 -- python3 app.py`; `belljar sandbox0 env` prints the variables.
    #[command(args_conflicts_with_subcommands = true)]
    Sandbox0 {
        #[command(subcommand)]
        action: Option<Sandbox0Cmd>,
        /// The program and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Run a program with Modal's Python client (`modal`) pointed at this daemon:
    /// `belljar modal -- python3 app.py`; `belljar modal env` prints the variables instead.
    #[command(args_conflicts_with_subcommands = true)]
    Modal {
        #[command(subcommand)]
        action: Option<ModalCmd>,
        /// The program and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Run a program with E2B's SDKs (`e2b` on PyPI and npm) pointed at this daemon:
    /// `belljar e2b -- python3 app.py`; `belljar e2b env` prints the variables instead.
    #[command(args_conflicts_with_subcommands = true)]
    E2b {
        #[command(subcommand)]
        action: Option<E2bCmd>,
        /// The program and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum Sandbox0Cmd {
    /// Print `SANDBOX0_BASE_URL` and `SANDBOX0_TOKEN` as shell `export` lines
    /// (`eval "$(belljar sandbox0 env)"`).
    Env,
}

#[derive(Debug, Subcommand)]
pub enum NetworkCmd {
    /// The policy (brokered values redacted), ports and byte totals.
    Show { id: String },
    /// Replace the policy; open flows it denies are cut.
    Set {
        id: String,
        #[command(flatten)]
        policy: PolicyOpts,
    },
    /// The flows (the last 1000); -f follows new ones.
    Flows {
        id: String,
        #[arg(short = 'f', long)]
        follow: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PortCmd {
    /// Expose the sandbox's PORT on 127.0.0.1 (a free host port unless --host-port).
    Add {
        id: String,
        port: u32,
        #[arg(long)]
        host_port: Option<u32>,
    },
    Ls {
        id: String,
    },
    Rm {
        id: String,
        port: u16,
    },
}

/// A NetworkPolicy from flags: a mode, or allow/deny lists and brokered headers.
#[derive(Debug, Args, Clone, Default)]
pub struct PolicyOpts {
    /// allow-all (default) or deny-all.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// Allow a domain (TLS SNI, HTTP Host, DNS): example.com, *.example.com, www.*.com.
    #[arg(long, value_name = "DOMAIN")]
    pub allow_domain: Vec<String>,
    /// Allow an address range, whatever the protocol.
    #[arg(long, value_name = "CIDR")]
    pub allow_cidr: Vec<String>,
    /// Deny an address range (wins over every allow).
    #[arg(long, value_name = "CIDR")]
    pub deny_cidr: Vec<String>,
    /// Set a header on HTTPS requests to a domain, in the daemon (the secret never enters the
    /// sandbox): 'api.example.com:Authorization=Bearer ...'.
    #[arg(long, value_name = "DOMAIN:Header=value")]
    pub broker: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ModalCmd {
    /// Print the variables as shell `export` lines (`eval "$(belljar modal env)"`).
    Env,
}

#[derive(Debug, Subcommand)]
pub enum E2bCmd {
    /// Print the variables as shell `export` lines (`eval "$(belljar e2b env)"`).
    Env,
}

#[derive(Debug, Subcommand)]
pub enum VercelCmd {
    /// Print the variables as shell `export` lines (`eval "$(belljar vercel env)"`). The
    /// credential among them is good for an hour: programs started after that need new ones
    /// (a program that runs longer keeps its own renewed).
    Env,
}

#[derive(Debug, Args, Clone, Default)]
pub struct SandboxOpts {
    /// Number of vCPUs (default 2).
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Memory in MiB (default 1024).
    #[arg(long, value_name = "MiB")]
    pub memory: Option<u64>,
    /// Size of the writable disk layer in MiB (default 4096).
    #[arg(long, value_name = "MiB")]
    pub disk: Option<u64>,
    /// Environment of every command, K=V; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Time until the sandbox stops by itself, e.g. 10m (default 5m); a bare number is
    /// seconds.
    #[arg(long)]
    pub timeout: Option<String>,
    /// A tag k=v; repeatable.
    #[arg(long = "tag", value_name = "k=v")]
    pub tags: Vec<String>,
    #[arg(long)]
    pub name: Option<String>,
    /// A directory or tarball unpacked into /workspace, or a git URL cloned there.
    #[arg(long, value_name = "PATH|GIT_URL")]
    pub source: Option<String>,
    /// auto (default), microvm or namespace.
    #[arg(long)]
    pub backend: Option<String>,
    /// Start from a snapshot (its files, on its image).
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "source")]
    pub from: Option<String>,
    #[command(flatten)]
    pub policy: PolicyOpts,
    /// Expose this sandbox TCP port on 127.0.0.1; repeatable.
    #[arg(long = "port", value_name = "PORT")]
    pub ports: Vec<u32>,
    /// Mount a directory snapshot at a path (copy-on-write), e.g. snap_abc:/work; repeatable.
    #[arg(long = "mount", value_name = "SNAPSHOT:PATH")]
    pub mounts: Vec<String>,
    /// Mount a host folder (a path starting with /, . or ~) or a named volume at a path of
    /// the sandbox, two-way and live, e.g. -v .:/workspace or -v cache:/cache:ro;
    /// repeatable (namespace backend).
    #[arg(long = "volume", short = 'v', value_name = "SOURCE:PATH[:ro]")]
    pub volumes: Vec<String>,
    /// Snapshot the sandbox whenever it stops; `belljar start` resumes it from there.
    #[arg(long)]
    pub persistent: bool,
    /// Pause the sandbox after this long unused, e.g. 10m; a bare number is seconds.
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<String>,
    /// Delete the sandbox this long after its creation, whatever its state, e.g. 1d.
    #[arg(long, value_name = "DURATION")]
    pub hard_ttl: Option<String>,
    /// Keep a paused sandbox paused when it is used (by default any use resumes it).
    #[arg(long)]
    pub no_auto_resume: bool,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// base (default), python3.13, node24 or node22.
    #[arg(long)]
    pub image: Option<String>,
    /// A template (`belljar templates create`): its defaults apply to what the other flags
    /// leave out, and its pool serves the create when it can.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    #[command(flatten)]
    pub opts: SandboxOpts,
}

/// `belljar fork`: what the new sandbox changes of its source's configuration (the API's
/// `ForkSandbox`).
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// Sandbox id or name.
    pub id: String,
    /// The new sandbox's name.
    #[arg(long)]
    pub name: Option<String>,
    /// Environment of every command, K=V; repeatable. Given, it replaces the source's.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// A tag k=v; repeatable. Given, they replace the source's tags.
    #[arg(long = "tag", value_name = "k=v")]
    pub tags: Vec<String>,
    /// Time until the new sandbox stops by itself, e.g. 10m (default: the source's timeout);
    /// a bare number is seconds.
    #[arg(long)]
    pub timeout: Option<String>,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only sandboxes in this status (running, stopped, ...).
    #[arg(long)]
    pub status: Option<String>,
    /// Only sandboxes with this tag, k=v.
    #[arg(long)]
    pub tag: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Working directory (default /workspace).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment, K=V; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Run as root.
    #[arg(long)]
    pub sudo: bool,
    /// Start the command and print its id without waiting.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// Run on a pseudo-terminal (raw local terminal, resized with it).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Forward local stdin to the command.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Sandbox id or name.
    pub id: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub opts: SandboxOpts,
    /// Working directory (default /workspace).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run as root.
    #[arg(long)]
    pub sudo: bool,
    /// Run on a pseudo-terminal.
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Forward local stdin to the command.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Keep the sandbox instead of deleting it afterwards.
    #[arg(long)]
    pub keep: bool,
    /// The image: base, python3.13, node24, node22, or a pulled or imported one (pulled
    /// first when it names a registry and is not here yet).
    pub image: String,
    /// The command and its arguments; without one, a pulled or imported image's own
    /// (`Entrypoint` and `Cmd`).
    #[arg(last = true)]
    pub argv: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum TemplatesCmd {
    /// Create a template and print its name; its pool starts filling in the background.
    Create(Box<TemplateCreateArgs>),
    /// Replace a template's image and defaults with these (what is not given goes back to
    /// the daemon's default); its pool is made again, sandboxes made from it stay.
    Update(Box<TemplateCreateArgs>),
    /// List templates, with their pools (ready/target).
    Ls,
    /// Delete templates and their pooled sandboxes (sandboxes made from them stay).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Show one template.
    Inspect { name: String },
}

/// `belljar templates create`: the API's `CreateTemplate`.
#[derive(Debug, Args)]
pub struct TemplateCreateArgs {
    /// 1 to 64 characters of [a-z0-9_.-], starting with a letter or digit.
    pub name: String,
    /// Any image the daemon has: base, python3.13, node24, node22, or a pulled, imported or
    /// built one.
    #[arg(long)]
    pub image: String,
    /// Number of vCPUs (default: the daemon's, 2).
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Memory in MiB (default: the daemon's, 1024).
    #[arg(long, value_name = "MiB")]
    pub memory: Option<u64>,
    /// Size of the writable disk layer in MiB (default: the daemon's, 4096).
    #[arg(long, value_name = "MiB")]
    pub disk: Option<u64>,
    /// Environment of every command, K=V; repeatable.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Time until a sandbox of the template stops by itself, e.g. 10m; a bare number is
    /// seconds.
    #[arg(long)]
    pub timeout: Option<String>,
    /// auto (default), microvm or namespace.
    #[arg(long)]
    pub backend: Option<String>,
    #[command(flatten)]
    pub policy: PolicyOpts,
    /// Sandboxes kept started ahead of demand, refilled in the background (default 0).
    #[arg(long, value_name = "N")]
    pub pool: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum VolumesCmd {
    /// Create a named volume and print its name.
    Create {
        name: String,
        /// Cap what it holds, in MiB (the kernel's ENOSPC past it); default: no cap.
        #[arg(long, value_name = "MIB")]
        size: Option<u64>,
    },
    /// List volumes.
    Ls,
    /// Delete volumes and their files (refused while a sandbox mounts one).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Show one volume and the sandboxes that mount it.
    Inspect { name: String },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotsCmd {
    /// List snapshots, newest first.
    Ls {
        /// Only snapshots of this sandbox (id).
        #[arg(long)]
        sandbox: Option<String>,
    },
    /// Delete snapshots (their files stay while sandboxes still use them).
    Rm {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// What changed from snapshot A to B (a later snapshot, or a sandbox id or name for its
    /// current files); without B, what A changed on top of its parent.
    Diff {
        /// Snapshot id.
        a: String,
        /// Snapshot id, or sandbox id or name.
        b: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImagesCmd {
    /// Build an image from a Dockerfile (`-t NAME DIR`), or (re)build one of Belljar's own
    /// images (`NAME`); prints progress.
    Build {
        /// The context directory with `-t`; else the name of one of Belljar's images.
        target: String,
        /// Build DIR's Dockerfile and name the image so (`[registry/]repository[:tag]`).
        #[arg(short = 't', long = "tag")]
        tag: Option<String>,
        /// The Dockerfile, inside the context (default DIR/Dockerfile).
        #[arg(short = 'f', long = "file", requires = "tag")]
        file: Option<std::path::PathBuf>,
        /// A build argument `KEY=VALUE` (repeatable).
        #[arg(long = "build-arg", value_name = "KEY=VALUE", requires = "tag")]
        build_arg: Vec<String>,
        /// Run every step again instead of taking it from the step cache.
        #[arg(long, requires = "tag")]
        no_cache: bool,
    },
    /// Pull an image from a registry (`[registry/]repository[:tag][@sha256:…]`).
    Pull {
        reference: String,
        /// Speak plain HTTP to the registry although it is not on loopback.
        #[arg(long)]
        insecure_registry: bool,
    },
    /// Import a `docker save` / `podman save` archive or an OCI layout (directory or tar).
    Import {
        path: std::path::PathBuf,
        /// Also name the image so (`[registry/]repository[:tag]`).
        #[arg(long)]
        tag: Option<String>,
    },
    /// Remove pulled or imported images (by name or id); an image goes with its last name.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove the images nothing stands on (no sandbox, snapshot or template): unnamed ones
    /// (a name pulled, imported or built again moved off them), and as asked more.
    /// Write a pulled, imported or built image as an OCI archive (`podman load`, `docker load`
    /// and `belljar images import` read it).
    Export {
        /// The image's name or id.
        image: String,
        /// The archive to write (`-` for standard output).
        #[arg(short, long, value_name = "FILE")]
        output: String,
    },
    Prune {
        /// Also every named image of yours that nothing stands on.
        #[arg(short, long)]
        all: bool,
        /// Also the Dockerfile step cache.
        #[arg(long)]
        build_cache: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DaemonCmd {
    /// Start the daemon in the background.
    Start {
        /// TCP port on 127.0.0.1 (0 picks a free one).
        #[arg(long)]
        port: Option<u16>,
    },
    /// Stop the daemon; running sandboxes keep running.
    Stop,
    /// Whether the daemon runs, and how it is set up.
    Status,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_command_after_double_dash() {
        let cli = Cli::try_parse_from([
            "belljar", "exec", "-t", "--env", "A=1", "sbx_1", "--", "ls", "-la",
        ])
        .unwrap();
        let Cmd::Exec(e) = cli.command else {
            panic!("not exec")
        };
        assert!(e.tty);
        assert_eq!(e.id, "sbx_1");
        assert_eq!(e.argv, ["ls", "-la"]);
        assert_eq!(e.env, ["A=1"]);
    }

    #[test]
    fn fork_takes_the_apis_overrides() {
        let cli = Cli::try_parse_from([
            "belljar",
            "fork",
            "sbx_1",
            "--name",
            "b",
            "-e",
            "A=1",
            "--tag",
            "t=2",
            "--timeout",
            "10m",
        ])
        .unwrap();
        let Cmd::Fork(f) = cli.command else {
            panic!("not fork")
        };
        assert_eq!(
            (f.id.as_str(), f.name.as_deref(), f.timeout.as_deref()),
            ("sbx_1", Some("b"), Some("10m"))
        );
        assert_eq!((f.env, f.tags), (vec!["A=1".into()], vec!["t=2".into()]));
    }

    #[test]
    fn json_is_global_and_run_takes_image() {
        let cli = Cli::try_parse_from(["belljar", "ls", "--json"]).unwrap();
        assert!(cli.json);
        let cli = Cli::try_parse_from([
            "belljar",
            "run",
            "--timeout",
            "1m",
            "base",
            "--",
            "echo",
            "hi",
        ])
        .unwrap();
        let Cmd::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.image, "base");
        assert_eq!(r.opts.timeout.as_deref(), Some("1m"));
    }

    #[test]
    fn snapshot_commands_parse() {
        let cli = Cli::try_parse_from(["belljar", "snapshot", "sbx_1", "--keep-running"]).unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Snapshot { keep_running: true, ref id, .. } if id == "sbx_1"
        ));
        let cli = Cli::try_parse_from(["belljar", "snapshots", "rm", "snap_a"]).unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Snapshots { action: Some(SnapshotsCmd::Rm { ref ids }) } if ids == &["snap_a"]
        ));
        let cli = Cli::try_parse_from(["belljar", "create", "--from", "snap_a"]).unwrap();
        let Cmd::Create(c) = cli.command else {
            panic!("not create")
        };
        assert_eq!(c.opts.from.as_deref(), Some("snap_a"));
        let cli = Cli::try_parse_from(["belljar", "snapshot", "sbx_1", "--path", "/w"]).unwrap();
        assert!(matches!(cli.command, Cmd::Snapshot { path: Some(ref p), .. } if p == "/w"));
        let cli = Cli::try_parse_from(["belljar", "mount", "box", "snap_a", "/w"]).unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Mount { ref id, snapshot: Some(ref s), path: Some(ref p) }
                if id == "box" && s == "snap_a" && p == "/w"
        ));
        assert!(Cli::try_parse_from(["belljar", "mount", "box", "snap_a"]).is_err());
        let cli = Cli::try_parse_from(["belljar", "create", "--mount", "snap_a:/w"]).unwrap();
        let Cmd::Create(c) = cli.command else {
            panic!("not create")
        };
        assert_eq!(c.opts.mounts, ["snap_a:/w"]);
        assert!(
            Cli::try_parse_from(["belljar", "create", "--from", "snap_a", "--source", "."])
                .is_err()
        );
    }

    #[test]
    fn usage_errors_are_exit_status_2() {
        let err = Cli::try_parse_from(["belljar", "exec", "sbx_1"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
