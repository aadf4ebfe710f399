//! Many commands at once: `inflight` runs of `true`, spread over `sandboxes` sandboxes and
//! all started together, as an agent fleet or a test runner would. Reports the rate at which
//! they complete and the latency each one saw, and the CPU time each command cost the daemon,
//! the agents and the commands themselves: on a machine shared with other work the rate moves
//! with the load, the CPU time per command much less. Its peer is the same number of `true`
//! processes started at once by one process on the host, no sandbox: the floor.

use std::time::{Duration, Instant};

use anyhow::Result;
use belljar_client::Client;
use tokio::task::JoinSet;

use crate::{create, delete, exec_true};

/// Clock ticks per second in `/proc` (USER_HZ, 100 on every Linux architecture).
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time so far, in clock ticks.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    daemon: u64,
    /// The sandboxes' PID 1s (the agents) themselves.
    agents: u64,
    /// Their reaped children: the commands.
    commands: u64,
    /// The whole machine: busy and all ticks (summed over cores).
    machine_busy: u64,
    machine_all: u64,
}

/// The sandboxes' processes are found by their ids in `/proc/<pid>/cgroup`, so other
/// sandboxes on the machine are not counted. Between commands only the agents live there, and
/// the commands they reaped count in their children's time.
fn sample(daemon: Option<i32>, ids: &[String]) -> Cpu {
    use procfs_core::FromRead;
    let stat = |pid: i32| procfs_core::process::Stat::from_file(format!("/proc/{pid}/stat")).ok();
    let mut cpu = Cpu::default();
    if let Some(s) = daemon.and_then(stat) {
        cpu.daemon = s.utime + s.stime;
    }
    let pids = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok());
    for pid in pids {
        let Ok(groups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        // Sandbox ids are random: one in the cgroup path (spelt with `-` for `_` there, as
        // the namespace backend names its groups) is one of ours.
        let ours = ids.iter().any(|id| groups.contains(&id.replace('_', "-")));
        if let Some(s) = stat(pid).filter(|_| ours) {
            cpu.agents += s.utime + s.stime;
            cpu.commands += (s.cutime + s.cstime).max(0) as u64;
        }
    }
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    if let Some(line) = machine.lines().find(|l| l.starts_with("cpu ")) {
        // user nice system idle iowait irq softirq steal ...
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        cpu.machine_all = f.iter().take(8).sum();
        cpu.machine_busy =
            cpu.machine_all - f.get(3).copied().unwrap_or(0) - f.get(4).copied().unwrap_or(0);
    }
    cpu
}

fn print_cpu(before: Cpu, after: Cpu, execs: usize) {
    let per =
        |a: u64, b: u64| (b.saturating_sub(a)) as f64 / TICKS_PER_SECOND * 1000.0 / execs as f64;
    let (daemon, agents, commands) = (
        per(before.daemon, after.daemon),
        per(before.agents, after.agents),
        per(before.commands, after.commands),
    );
    println!(
        "{:<48} daemon {daemon:.2} ms   agents {agents:.2} ms   commands {commands:.2} ms   total {:.2} ms",
        "  CPU per exec",
        daemon + agents + commands
    );
    let all = after.machine_all.saturating_sub(before.machine_all).max(1);
    let busy = after.machine_busy.saturating_sub(before.machine_busy);
    let ours = (after.daemon + after.agents + after.commands)
        .saturating_sub(before.daemon + before.agents + before.commands);
    println!(
        "{:<48} {:.0} % busy, of which this run {:.0} % and everything else {:.0} %",
        "  machine during the run",
        busy as f64 * 100.0 / all as f64,
        ours as f64 * 100.0 / all as f64,
        busy.saturating_sub(ours) as f64 * 100.0 / all as f64,
    );
}

pub async fn report(
    client: &Client,
    daemon: Option<i32>,
    image: &str,
    sandboxes: usize,
    inflight: usize,
) -> Result<()> {
    let mut ids = Vec::with_capacity(sandboxes);
    for _ in 0..sandboxes.max(1) {
        ids.push(create(client, image).await?.id);
    }
    let before = sample(daemon, &ids);
    let result = in_flight(client, &ids, inflight).await;
    let after = sample(daemon, &ids);
    for id in &ids {
        delete(client, id).await?;
    }
    let (took, latencies) = result?;
    let rate = inflight as f64 / took.as_secs_f64();
    crate::report(
        &format!(
            "{inflight} × exec true in flight over {} sandboxes",
            ids.len()
        ),
        latencies,
    );
    println!(
        "{:<48} {rate:>8.0} execs/s   (all done in {:.2} s)",
        "  throughput",
        took.as_secs_f64()
    );
    print_cpu(before, after, inflight);

    let own = |s: &procfs_core::process::Stat| (s.utime + s.stime, (s.cutime + s.cstime).max(0));
    let before = own_stat().map(|s| own(&s)).unwrap_or_default();
    let (took, latencies) = bare_spawns(inflight).await?;
    let after = own_stat().map(|s| own(&s)).unwrap_or_default();
    crate::report(
        &format!("{inflight} × `true` spawned at once, no sandbox"),
        latencies,
    );
    let bare = inflight as f64 / took.as_secs_f64();
    let per =
        |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_SECOND * 1000.0 / inflight as f64;
    println!(
        "{:<48} {bare:>8.0} execs/s   Belljar / this {:.1}x the time   CPU per `true`: spawner {:.2} ms, `true` {:.2} ms",
        "  throughput",
        bare / rate,
        per(before.0, after.0),
        per(before.1 as u64, after.1 as u64),
    );
    Ok(())
}

fn own_stat() -> Option<procfs_core::process::Stat> {
    use procfs_core::FromRead;
    procfs_core::process::Stat::from_file("/proc/self/stat").ok()
}

/// The peer of the in-flight row, and its floor: the same number of `true` processes started
/// at once on the host by this one process (std's spawn, `posix_spawn`), with no sandbox, API
/// or record: what starting and ending the program itself costs on this machine now.
async fn bare_spawns(n: usize) -> Result<(Duration, Vec<Duration>)> {
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        tasks.spawn(async move {
            let t = Instant::now();
            let status = tokio::process::Command::new("true")
                .stdin(std::process::Stdio::null())
                .status()
                .await?;
            anyhow::ensure!(status.success(), "`true` exited with {status}");
            Ok::<_, anyhow::Error>(t.elapsed())
        });
    }
    let mut latencies = Vec::with_capacity(n);
    while let Some(done) = tasks.join_next().await {
        latencies.push(done??);
    }
    Ok((start.elapsed(), latencies))
}

async fn in_flight(
    client: &Client,
    ids: &[String],
    inflight: usize,
) -> Result<(Duration, Vec<Duration>)> {
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for i in 0..inflight {
        let client = client.clone();
        let id = ids[i % ids.len()].clone();
        tasks.spawn(async move {
            let t = Instant::now();
            exec_true(&client, &id).await.map(|()| t.elapsed())
        });
    }
    let mut latencies = Vec::with_capacity(inflight);
    while let Some(done) = tasks.join_next().await {
        latencies.push(done??);
    }
    Ok((start.elapsed(), latencies))
}
