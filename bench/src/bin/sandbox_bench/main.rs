//! Measures what a user of the API feels, on the namespace backend, in one run: a sandbox's
//! whole life (create → `true` → delete) next to the peers a user would otherwise use
//! (bubblewrap, podman; see `peers`), the round trip of `exec true`, many commands in flight
//! at once (see `load`), and file write/read throughput. Prints figures and ratios only (never
//! pass/fail), with the machine and the command line, so that runs can be compared.
//!
//! It starts its own `belljard` (found next to this binary) in a temporary `BELLJAR_HOME`,
//! so it never touches the user's sandboxes. Build the binaries in the same profile first:
//! `cargo build --release --bins && target/release/sandbox_bench`.

#![forbid(unsafe_code)]

mod load;
mod peers;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use belljar_api::{BackendChoice, CreateSandbox, ListSandboxesQuery, RunCommand, Sandbox};
use belljar_cli::exec::{self, ExecOptions};
use belljar_cli::launcher;
use belljar_client::{Client, Paths};
use bytes::Bytes;
use clap::Parser;

/// Sandbox latency and throughput on the namespace backend.
#[derive(Debug, Parser)]
struct Args {
    /// Interleaved rounds of create → `true` → delete, for Belljar and each peer.
    #[arg(long, default_value_t = 30)]
    rounds: usize,
    /// Sandboxes sharing the commands in flight.
    #[arg(long, default_value_t = 50)]
    sandboxes: usize,
    /// Commands in flight at once (0 skips this part).
    #[arg(long, default_value_t = 1000)]
    inflight: usize,
    /// Round trips of `exec true`.
    #[arg(long, default_value_t = 200)]
    execs: usize,
    /// Size of the file written and read, MiB.
    #[arg(long, default_value_t = 256)]
    file_mib: usize,
    /// Image of the sandboxes.
    #[arg(long, default_value = "base")]
    image: String,
    /// Warm pool of the daemon: sandboxes of the image started ahead of demand (0: none).
    #[arg(long, default_value_t = 0)]
    pool: usize,
}

/// The `p`-th percentile (nearest rank) of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "float to int saturates, which is what is wanted"
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Prints the figures of `samples` and returns their median.
fn report(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<48} p50 {:>8.2} ms   p95 {:>8.2} ms   p99 {:>8.2} ms   (n={}, min {:.2} ms, max {:.2} ms)",
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 95.0)),
        ms(percentile(&samples, 99.0)),
        samples.len(),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    );
    percentile(&samples, 50.0)
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cores} cores, {:.1} GiB RAM, Linux {}",
        mem_kib as f64 / 1048576.0,
        kernel.trim()
    )
}

struct BenchDaemon {
    home: tempfile::TempDir,
    paths: Paths,
}

impl BenchDaemon {
    async fn start(args: &Args) -> Result<(Self, Client)> {
        let home = tempfile::Builder::new()
            .prefix("belljar-bench-")
            .tempdir()?;
        let paths = Paths::under_home(home.path());
        let args = vec![
            "--home".to_string(),
            home.path().display().to_string(),
            "--port".to_string(),
            "0".to_string(),
            "--pool".to_string(),
            format!("{}={}", args.image, args.pool),
        ];
        launcher::start(&paths, &args)
            .await
            .context("starting belljard (build it in the same profile as this benchmark)")?;
        let client = Client::local(&paths);
        Ok((Self { home, paths }, client))
    }

    async fn stop(&self, client: &Client) {
        if let Ok(all) = client.all_sandboxes(&ListSandboxesQuery::default()).await {
            for s in all {
                let _ = delete(client, &s.id).await;
            }
        }
        let _ = launcher::stop(&self.paths).await;
    }
}

async fn create(client: &Client, image: &str) -> Result<Sandbox> {
    let req = CreateSandbox {
        image: Some(image.to_string()),
        backend: Some(BackendChoice::Namespace),
        ..Default::default()
    };
    Ok(client.create_sandbox(&req).await?)
}

async fn delete(client: &Client, id: &str) -> Result<()> {
    Ok(client.delete_sandbox(id).await?)
}

async fn exec_true(client: &Client, id: &str) -> Result<()> {
    let req = RunCommand {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let cmd = client.run_command(id, &req).await?;
    if cmd.exit_code != Some(0) {
        bail!("`true` exited with {:?}", cmd.exit_code);
    }
    Ok(())
}

/// `belljar` next to this binary (same profile), run against the bench's daemon.
fn cli_round(cli: &Path, home: &Path, image: &str) -> Result<Duration> {
    let t = Instant::now();
    let out = std::process::Command::new(cli)
        .args(["run", image, "--", "true"])
        .env("BELLJAR_HOME", home)
        .output()
        .context("running belljar")?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!(
            "belljar run failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(took)
}

/// A sandbox's whole life — create, run `true`, delete — through the API and through
/// `belljar run`, interleaved round by round with the peers on the image's own tree.
async fn lifecycle_rounds(args: &Args, client: &Client, home: &Path) -> Result<()> {
    let cache = belljar_client::paths::image_cache(
        std::env::var_os("BELLJAR_CACHE").as_deref().map(Path::new),
    )?;
    let rootfs = cache
        .join("images")
        .join(&args.image)
        .join("current")
        .join("rootfs");
    let (peers, missing) = peers::available(&rootfs);
    for why in missing {
        println!("peer not measured: {why}");
    }
    let cli = belljar_client::paths::beside_exe("belljar")
        .context("belljar not found beside sandbox_bench: build it in the same profile")?;
    let mut api = Vec::with_capacity(args.rounds);
    let mut first = Vec::with_capacity(args.rounds);
    let mut run = Vec::with_capacity(args.rounds);
    let mut theirs: Vec<Vec<Duration>> = peers.iter().map(|_| Vec::new()).collect();
    cli_round(&cli, home, &args.image)?;
    let (mut creates, mut execs, mut deletes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        let t = Instant::now();
        let s = create(client, &args.image).await?;
        let created = t.elapsed();
        exec_true(client, &s.id).await?;
        let ran = t.elapsed();
        delete(client, &s.id).await?;
        api.push(t.elapsed());
        first.push(ran);
        creates.push(created);
        execs.push(ran - created);
        deletes.push(t.elapsed() - ran);
        run.push(cli_round(&cli, home, &args.image)?);
        for (peer, samples) in peers.iter().zip(&mut theirs) {
            samples.push(peer.round()?);
        }
    }
    report("  of which create", creates);
    report("  of which the first `true`", execs);
    report("  of which delete", deletes);
    report("create → first command done (API)", first);
    let api = report("create → true → delete (API)", api);
    let run = report("`belljar run IMAGE -- true` (CLI process)", run);
    let mut medians = Vec::new();
    for (peer, samples) in peers.iter().zip(theirs) {
        let label = format!("{} starting `true` on the same tree", peer.name);
        medians.push((peer.name, report(&label, samples)));
    }
    for (name, median) in medians {
        let ratio = |d: Duration| d.as_secs_f64() / median.as_secs_f64();
        println!(
            "{:<48} API {:.1}x   CLI {:.1}x   (medians)",
            format!("Belljar / {name}"),
            ratio(api),
            ratio(run)
        );
    }
    println!();
    Ok(())
}

/// A deterministic buffer in which every byte value occurs.
fn payload(len: usize) -> Bytes {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    Bytes::from(data)
}

async fn files(client: &Client, id: &str, mib: usize) -> Result<(f64, f64)> {
    const CHUNK: usize = 1 << 20;
    let len = mib << 20;
    let data = payload(len);
    let path = "/workspace/bench.bin";
    let chunks: Vec<std::io::Result<Bytes>> = (0..len)
        .step_by(CHUNK)
        .map(|at| Ok(data.slice(at..(at + CHUNK).min(len))))
        .collect();
    let t = Instant::now();
    let body = belljar_client::streamed(futures::stream::iter(chunks));
    let entry = client.write_file(id, path, None, body).await?;
    let write = t.elapsed();
    if entry.size != len as u64 {
        bail!("wrote {len} bytes, the sandbox has {}", entry.size);
    }
    let t = Instant::now();
    let mut download = client.read_file(id, path).await?;
    let mut at = 0usize;
    while let Some(chunk) = download.chunk().await? {
        if at + chunk.len() > len || data[at..at + chunk.len()] != chunk[..] {
            bail!("read back different bytes at offset {at}");
        }
        at += chunk.len();
    }
    let read = t.elapsed();
    if at != len {
        bail!("read {at} of {len} bytes");
    }
    let mbps = |d: Duration| len as f64 / 1e6 / d.as_secs_f64();
    Ok((mbps(write), mbps(read)))
}

async fn run(args: &Args, client: &Client, home: &Path) -> Result<()> {
    let info = client.info().await?;
    println!(
        "daemon:  belljard {} (default backend {:?}: {})",
        info.version, info.default_backend, info.default_backend_reason
    );
    println!(
        "backend: namespace, image {}, warm pool {}\n",
        args.image, args.pool
    );

    // Warm-up: the first sandbox pays for cold caches (image pages, binaries).
    let warm = create(client, &args.image).await?;
    exec_true(client, &warm.id).await?;
    delete(client, &warm.id).await?;

    lifecycle_rounds(args, client, home).await?;

    let s = create(client, &args.image).await?;
    for _ in 0..10 {
        exec_true(client, &s.id).await?;
    }
    let mut samples = Vec::with_capacity(args.execs);
    for _ in 0..args.execs {
        let t = Instant::now();
        exec_true(client, &s.id).await?;
        samples.push(t.elapsed());
    }
    report("exec true, waited (API round trip)", samples);

    let opts = ExecOptions::new(["true"]);
    let mut samples = Vec::with_capacity(args.execs);
    for _ in 0..args.execs {
        let t = Instant::now();
        let mut sink = |_: belljar_api::Stream, _: &[u8]| Ok(());
        let cmd = exec::exec(client, &s.id, &opts, &mut sink).await?;
        if cmd.exit_code != Some(0) {
            bail!("`true` exited with {:?}", cmd.exit_code);
        }
        samples.push(t.elapsed());
    }
    report("exec true, streamed (CLI path: start+logs+wait)", samples);

    if args.inflight > 0 {
        let daemon = Paths::under_home(home).pid();
        load::report(client, daemon, &args.image, args.sandboxes, args.inflight).await?;
    }

    let (write, read) = files(client, &s.id, args.file_mib).await?;
    println!(
        "{:<48} write {write:>8.1} MB/s   read {read:>8.1} MB/s   ({} MiB to /workspace, 1 MiB chunks, verified)",
        "file throughput (API, Unix socket)", args.file_mib
    );
    delete(client, &s.id).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    println!("sandbox_bench — Belljar sandbox latency and throughput");
    println!(
        "command: {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!("machine: {}", machine());
    let (daemon, client) = BenchDaemon::start(&args).await?;
    let result = run(&args, &client, daemon.home.path()).await;
    daemon.stop(&client).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 50.0), Duration::from_millis(10));
        assert_eq!(percentile(&s, 95.0), Duration::from_millis(19));
        assert_eq!(percentile(&s[..1], 95.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn payload_is_exact_and_varied() {
        let p = payload(1000);
        assert_eq!(p.len(), 1000);
        assert!(p.iter().any(|&b| b != p[0]));
    }
}
