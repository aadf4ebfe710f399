//! Measures sandboxes through time on the namespace backend, in one run, for a sandbox with a
//! small and a large amount of changed data: a snapshot that stops the sandbox and a live one,
//! create-from-snapshot and fork each to their first finished command, and pause/resume. The
//! baselines are what a user could do instead: `cp -a` of the sandbox's changed tree (what a
//! snapshot copies), `cp -a` of its whole tree (the image's and the changes: a copy without
//! layers) and `podman commit` of a container with the same changes. Prints figures
//! only (never pass/fail), with the machine and the command line.
//!
//! Like `sandbox_bench` it starts its own `belljard` (next to this binary) in a temporary home:
//! `cargo build --release --bins && target/release/snapshot_bench`.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use belljar_api::{
    BackendChoice, CreateSandbox, CreateSnapshot, ForkSandbox, ListSandboxesQuery, RunCommand,
    Sandbox, Source,
};
use belljar_cli::launcher;
use belljar_client::{Client, Paths};
use clap::Parser;

/// Snapshot, fork and pause latency on the namespace backend.
#[derive(Debug, Parser)]
struct Args {
    /// Image of the sandboxes.
    #[arg(long, default_value = "python3.13")]
    image: String,
    /// Changed data in the sandbox, MiB (one run each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,500")]
    sizes: Vec<u64>,
    /// Rounds of each measurement per size.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints the median and range of `samples`.
fn report(name: &str, mut samples: Vec<Duration>) {
    if samples.is_empty() {
        return;
    }
    samples.sort();
    println!(
        "  {name:<40} p50 {:>9.2} ms   (n={}, min {:.2}, max {:.2})",
        ms(samples[(samples.len() - 1) / 2]),
        samples.len(),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    );
}

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Runs a host command; fails with its output when it fails.
fn host(program: &str, args: &[&str]) -> Result<Duration> {
    let t = Instant::now();
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(took)
}

/// The shell script that writes `mib` MiB of changes in 1 MiB files.
fn changes(mib: u64) -> String {
    format!(
        "mkdir -p /workspace/data && i=0; while [ $i -lt {mib} ]; do \
         head -c 1048576 /dev/urandom > /workspace/data/f$i; i=$((i+1)); done"
    )
}

async fn create(c: &Client, image: &str, source: Option<Source>) -> Result<Sandbox> {
    Ok(c.create_sandbox(&CreateSandbox {
        image: Some(image.into()),
        backend: Some(BackendChoice::Namespace),
        source,
        timeout_ms: Some(3_600_000),
        ..Default::default()
    })
    .await?)
}

async fn sh(c: &Client, id: &str, script: &str) -> Result<()> {
    let cmd = c
        .run_command(
            id,
            &RunCommand {
                argv: vec!["sh".into(), "-c".into(), script.into()],
                sudo: true,
                ..Default::default()
            },
        )
        .await?;
    if cmd.exit_code != Some(0) {
        bail!("{script:?} exited with {:?}", cmd.exit_code);
    }
    Ok(())
}

async fn first_command(c: &Client, id: &str) -> Result<()> {
    let cmd = c
        .run_command(
            id,
            &RunCommand {
                argv: vec!["true".into()],
                ..Default::default()
            },
        )
        .await?;
    if cmd.exit_code != Some(0) {
        bail!("`true` exited with {:?}", cmd.exit_code);
    }
    Ok(())
}

/// Every measurement for one amount of changes.
async fn one_size(args: &Args, c: &Client, home: &Path, mib: u64) -> Result<()> {
    println!("{mib} MiB changed ({} image):", args.image);
    let src = create(c, &args.image, None).await?;
    sh(c, &src.id, &changes(mib)).await?;
    let live = CreateSnapshot {
        keep_running: Some(true),
        ..Default::default()
    };
    let (mut snap_live, mut frozen, mut from_snap, mut fork) = (vec![], vec![], vec![], vec![]);
    let (mut pause, mut resume) = (vec![], vec![]);
    for _ in 0..args.rounds {
        let t = Instant::now();
        let snap = c.snapshot_sandbox(&src.id, &live).await?;
        snap_live.push(t.elapsed());
        frozen.push(Duration::from_millis(snap.frozen_ms.unwrap_or(0)));

        let t = Instant::now();
        let s = create(
            c,
            &args.image,
            Some(Source::Snapshot {
                snapshot_id: snap.id.clone(),
            }),
        )
        .await?;
        first_command(c, &s.id).await?;
        from_snap.push(t.elapsed());
        c.delete_sandbox(&s.id).await?;

        let t = Instant::now();
        let f = c.fork_sandbox(&src.id, &ForkSandbox::default()).await?;
        first_command(c, &f.id).await?;
        fork.push(t.elapsed());
        c.delete_sandbox(&f.id).await?;

        let t = Instant::now();
        c.pause_sandbox(&src.id).await?;
        pause.push(t.elapsed());
        let t = Instant::now();
        c.resume_sandbox(&src.id).await?;
        resume.push(t.elapsed());
        c.delete_snapshot(&snap.id).await?;
    }
    report("snapshot, live (keep_running)", snap_live);
    report("  of which frozen", frozen);
    report("create from snapshot → first command", from_snap);
    report("fork → first command", fork);
    report("pause", pause);
    report("resume", resume);

    // Baseline: copying the changed tree as a snapshot does, with `cp -a`.
    let upper = home
        .join("data/sandboxes")
        .join(&src.id)
        .join("namespace/fs/upper");
    let mut cp = Vec::new();
    if upper.is_dir() {
        for _ in 0..args.rounds.min(3) {
            let dst = home.join("cp-baseline");
            cp.push(host(
                "cp",
                &[
                    "-a",
                    &upper.display().to_string(),
                    &dst.display().to_string(),
                ],
            )?);
            std::fs::remove_dir_all(&dst)?;
        }
    } else {
        println!("  (cp -a baseline skipped: {} not found)", upper.display());
    }
    report("baseline: cp -a of the changed tree", cp);
    report(
        "baseline: cp -a of image + changes",
        whole_tree_copies(args, &upper, home)?,
    );

    // The snapshot that stops the sandbox, once (it ends the sandbox).
    let t = Instant::now();
    let snap = c
        .snapshot_sandbox(&src.id, &CreateSnapshot::default())
        .await?;
    report("snapshot, stopping the sandbox", vec![t.elapsed()]);
    c.delete_sandbox(&src.id).await?;
    c.delete_snapshot(&snap.id).await?;
    podman_commit(args, mib)?;
    Ok(())
}

/// Baseline: what a user without layers scripts to keep a sandbox's state, a full copy of its
/// tree: the image's tree, then the changed tree over it (whiteouts aside, which only a
/// layered copy keeps). Grows with the image, where a snapshot grows only with the changes.
fn whole_tree_copies(args: &Args, upper: &Path, home: &Path) -> Result<Vec<Duration>> {
    let rootfs = image_tree(args)?;
    if !rootfs.is_dir() || !upper.is_dir() {
        println!("  (whole-tree cp -a baseline skipped: no image tree or changed tree)");
        return Ok(Vec::new());
    }
    let dst = home.join("cp-whole");
    let mut samples = Vec::new();
    for _ in 0..args.rounds.min(3) {
        let t = Instant::now();
        host(
            "cp",
            &[
                "-a",
                &rootfs.display().to_string(),
                &dst.display().to_string(),
            ],
        )?;
        host(
            "cp",
            &[
                "-a",
                &format!("{}/.", upper.display()),
                &dst.display().to_string(),
            ],
        )?;
        samples.push(t.elapsed());
        std::fs::remove_dir_all(&dst)?;
    }
    Ok(samples)
}

/// The unpacked tree of the benchmark's image in the image cache.
fn image_tree(args: &Args) -> Result<PathBuf> {
    let cache = belljar_client::paths::image_cache(
        std::env::var_os("BELLJAR_CACHE").as_deref().map(Path::new),
    )?;
    Ok(cache
        .join("images")
        .join(&args.image)
        .join("current/rootfs"))
}

/// The podman image made from the sandbox image's tree for the baseline.
fn podman_image(args: &Args) -> String {
    format!("localhost/belljar-bench-{}", args.image.replace('.', "-"))
}

/// Baseline: `podman commit` of an exited container holding the same changes, on the image's
/// tree imported once as a podman image (runc: crun refuses this machine's hybrid cgroups).
fn podman_commit(args: &Args, mib: u64) -> Result<()> {
    if on_path("podman").is_none() {
        println!("  (podman commit baseline skipped: podman not installed)");
        return Ok(());
    }
    let image = podman_image(args);
    if host("podman", &["image", "exists", &image]).is_err() {
        let rootfs = image_tree(args)?;
        let tar = Command::new("tar")
            .args(["-C", &rootfs.display().to_string(), "-c", "."])
            .stdout(Stdio::piped())
            .spawn()?;
        let status = Command::new("podman")
            .args(["import", "-q", "-", &image])
            .stdin(tar.stdout.context("tar's output")?)
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("podman import failed");
        }
    }
    let mut samples = Vec::new();
    for round in 0..args.rounds.min(3) {
        let name = format!("belljar-bench-{mib}-{round}");
        let script = changes(mib);
        let run = [
            "--runtime",
            "runc",
            "run",
            "--name",
            &name,
            "--network=none",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=1024:1024",
            &image,
            "sh",
            "-c",
            &script,
        ];
        host("podman", &run)?;
        let committed = format!("{image}-commit");
        samples.push(host("podman", &["commit", "-q", &name, &committed])?);
        host("podman", &["rm", &name])?;
        host("podman", &["rmi", &committed])?;
    }
    report("baseline: podman commit (runc)", samples);
    Ok(())
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{model}, {cores} cores, load {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    println!("snapshot_bench — snapshots, forks and pause on the namespace backend");
    println!(
        "command: {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!("machine: {}", machine());
    let home = tempfile::Builder::new()
        .prefix("belljar-snapbench-")
        .tempdir()?;
    let paths = Paths::under_home(home.path());
    let daemon_args = [
        "--home".to_string(),
        home.path().display().to_string(),
        "--port".to_string(),
        "0".to_string(),
    ];
    launcher::start(&paths, &daemon_args)
        .await
        .context("starting belljard (build it in the same profile as this benchmark)")?;
    let client = Client::local(&paths);
    let mut result = Ok(());
    for &mib in &args.sizes {
        result = one_size(&args, &client, home.path(), mib).await;
        if result.is_err() {
            break;
        }
    }
    if let Ok(all) = client.all_sandboxes(&ListSandboxesQuery::default()).await {
        for s in all {
            let _ = client.delete_sandbox(&s.id).await;
        }
    }
    let _ = launcher::stop(&paths).await;
    // The imported tree is as big as the image: it is not kept between runs.
    if on_path("podman").is_some() {
        let _ = host("podman", &["rmi", "--ignore", &podman_image(&args)]);
    }
    result
}
