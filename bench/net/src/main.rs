//! Network figures for a sandbox's userspace stack against the peers a user would otherwise
//! use for rootless networking, in one run on the same set-up (printed, never pass/fail):
//!
//! - TCP throughput sandbox → server and server → sandbox;
//! - connection set-up time (`connect()` returning in the sandbox) and a 1-byte round trip on
//!   an open connection;
//! - DNS lookup time: a question to the resolver address the stack gives the sandbox
//!   (Belljar's DNS on the gateway; pasta's and slirp4netns's forwarders, which pass it to the
//!   host namespace's resolver), answered by a name server in the test internet;
//! - the memory one idle sandbox's stack costs (the process's RSS growth over many stacks).
//!
//! Every peer gets a fresh "sandbox" network namespace whose only way out is its own
//! userspace stack, run from the same "host" namespace: Belljar's (`crates/network` on a tap
//! `eth0`, as the namespace backend sets it up), `pasta` (passt) and `slirp4netns`. The host
//! namespace reaches the server through a veth into a third namespace (203.0.113.0/24); the
//! bench makes all three and deletes them, so no traffic leaves them. The host namespace's
//! `/etc/resolv.conf` (through `/etc/netns/`, as `ip netns exec` mounts it) names the test
//! internet's name server. Needs root, `ip`, and
//! the Debian packages `passt` and `slirp4netns` (a missing peer is reported and skipped).
//!
//! Usage: `cargo build --release -p belljar-net-bench &&
//!         sudo target/release/net_bench [--rounds 3] [--mib 256] [--connects 200] [--idle 50]`

mod dns;
mod world;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use belljar_network::config::{GATEWAY_V4, GUEST_V4, NetConfig, PREFIX_V4, TAP_MTU};
use belljar_network::{DnsUpstream, Network, NetworkPolicy, Options, TapDevice, tap};
use clap::Parser;

use world::{Netns, World};

/// The host namespace's address on the bench's private link.
const HOST_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The server's address.
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// Reads everything, then answers one byte (so the sender knows it all arrived).
const SINK_PORT: u16 = 9;
/// Writes `--mib` MiB, then closes.
const SOURCE_PORT: u16 = 10;
/// Echoes.
const ECHO_PORT: u16 = 7;
/// Where pasta forwards DNS from (to the host's resolver), as Podman sets it.
const PASTA_DNS: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// slirp4netns's DNS forwarder.
const SLIRP_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// How long a transfer may go without progress before its round counts as failed.
const STALL: Duration = Duration::from_secs(30);
/// How long a peer may take to bring its interface up.
const READY_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(about = "Sandbox network figures: Belljar's stack vs pasta and slirp4netns")]
struct Args {
    /// Rounds; each runs every peer once, interleaved, and the median is printed.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// MiB moved per throughput run.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Connections per latency run.
    #[arg(long, default_value_t = 200)]
    connects: usize,
    /// Idle stacks started for the memory figure.
    #[arg(long, default_value_t = 50)]
    idle: usize,
    /// The stacks to measure (belljar, pasta, slirp4netns).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "belljar,pasta,slirp4netns"
    )]
    peers: Vec<String>,
}

/// One peer's sandbox namespace, with its stack running.
struct Sandbox {
    ns: Netns,
    /// What keeps the stack alive: Belljar's in-process network, or the peer's process.
    _stack: Stack,
    mtu: u32,
    /// The DNS server the stack gives the sandbox.
    resolver: SocketAddr,
}

enum Stack {
    Belljar(#[allow(dead_code)] Network),
    Process(Child),
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Stack::Process(child) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A tap `eth0` configured as the agent configures it, with Belljar's stack on it, run from
/// the host namespace on `rt`.
fn belljar(world: &World, rt: &tokio::runtime::Runtime) -> Result<Sandbox> {
    let ns = Netns::new("b")?;
    let fd: OwnedFd = ns.run(|| tap::create("eth0"))??;
    ns.ip(&[
        "addr",
        "add",
        &format!("{GUEST_V4}/{PREFIX_V4}"),
        "dev",
        "eth0",
    ])?;
    // As the namespace backend sets it (the agent, from the daemon's network setup).
    ns.ip(&["link", "set", "eth0", "mtu", &TAP_MTU.to_string()])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&["route", "add", "default", "via", &GATEWAY_V4.to_string()])?;
    let handle = rt.handle().clone();
    let net = world.host.run(move || {
        let _in = handle.enter();
        Network::spawn(
            TapDevice::new(fd)?,
            Options {
                config: NetConfig {
                    mtu: TAP_MTU,
                    ..NetConfig::default()
                },
                policy: NetworkPolicy::AllowAll,
                dns: DnsUpstream::Servers(vec![SocketAddr::from((SERVER_IP, 53))]),
                ..Options::default()
            },
        )
        .map_err(anyhow::Error::from)
    })??;
    Ok(Sandbox {
        ns,
        _stack: Stack::Belljar(net),
        mtu: u32::try_from(TAP_MTU)?,
        resolver: SocketAddr::from((GATEWAY_V4, 53)),
    })
}

/// `pasta` joined to a fresh namespace from the host namespace, copying its addresses.
fn pasta(world: &World) -> Result<Sandbox> {
    let ns = Netns::new("p")?;
    let child = world
        .host
        .command("pasta")
        .args([
            "-q",
            "-f",
            "--config-net",
            "--netns-only",
            "-4",
            "-I",
            "eth0",
            // Root stays root: as nobody, pasta cannot join a namespace that root owns.
            "--runas",
            "0:0",
            // The server is the host's default gateway: not pasta's alias for the host.
            "--no-map-gw",
            "--dns-forward",
            &PASTA_DNS.to_string(),
        ])
        .args([
            "-t",
            "none",
            "-u",
            "none",
            "-T",
            "none",
            "-U",
            "none",
            "--netns",
            &ns.path(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start pasta (Debian package passt)")?;
    let mut sandbox = Sandbox {
        mtu: 0,
        resolver: SocketAddr::from((PASTA_DNS, 53)),
        ns,
        _stack: Stack::Process(child),
    };
    ready(&mut sandbox, "eth0")?;
    sandbox.mtu = mtu_of(&sandbox.ns, "eth0");
    Ok(sandbox)
}

/// `slirp4netns` on a fresh namespace from the host namespace, with the MTU its users set.
fn slirp4netns(world: &World) -> Result<Sandbox> {
    let ns = Netns::new("l")?;
    let child = world
        .host
        .command("slirp4netns")
        .args([
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            "--netns-type=path",
            &ns.path(),
            "tap0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start slirp4netns")?;
    let mut sandbox = Sandbox {
        mtu: 65520,
        resolver: SocketAddr::from((SLIRP_DNS, 53)),
        ns,
        _stack: Stack::Process(child),
    };
    ready(&mut sandbox, "tap0")?;
    Ok(sandbox)
}

/// Waits until the peer has configured `dev` (neither tells us otherwise when joined by path);
/// a peer that ended first (not installed: `ip netns exec` found no such program) is named.
fn ready(s: &mut Sandbox, dev: &str) -> Result<()> {
    let end = Instant::now() + READY_DEADLINE;
    while !s.ns.has_v4(dev) {
        if let Stack::Process(child) = &mut s._stack
            && let Some(status) = child.try_wait()?
        {
            bail!("it ended ({status}) before configuring {dev}: is it installed?");
        }
        if Instant::now() > end {
            bail!(
                "{dev} in {} got no address in {READY_DEADLINE:?}",
                s.ns.name
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `dev`'s MTU as the namespace sees it. Not from `/sys/class/net` in a thread that joined
/// the namespace: sysfs shows the namespace of whoever mounted it (the host's `eth0`, which
/// the README once reported as pasta's 1400).
fn mtu_of(ns: &Netns, dev: &str) -> u32 {
    Command::new("ip")
        .args(["-n", &ns.name, "-o", "link", "show", "dev", dev])
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let mut words = text.split_whitespace();
            words.find(|w| *w == "mtu")?;
            words.next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// Figures of one run.
struct Figures {
    up_mbit: f64,
    down_mbit: f64,
    connect: Vec<Duration>,
    rtt: Vec<Duration>,
    /// Empty when the peer's DNS did not answer (reported once).
    dns: Vec<Duration>,
}

fn measure(s: &Sandbox, mib: usize, connects: usize) -> Result<Figures> {
    let resolver = s.resolver;
    let tag = s.ns.name.replace('-', "");
    let (up, down, connect, rtt, dns) = s.ns.run(move || -> std::io::Result<_> {
        let server = |port| SocketAddr::from((SERVER_IP, port));
        // A stalled transfer fails its round instead of hanging the run.
        let open = |port| {
            let c = TcpStream::connect(server(port))?;
            c.set_read_timeout(Some(STALL))?;
            c.set_write_timeout(Some(STALL))?;
            Ok::<_, std::io::Error>(c)
        };
        // Sandbox → server.
        let mut c = open(SINK_PORT)?;
        let buf = vec![0x5a; 1 << 20];
        let t = Instant::now();
        for _ in 0..mib {
            c.write_all(&buf)?;
        }
        c.shutdown(Shutdown::Write)?;
        c.read_exact(&mut [0; 1])?;
        let up = t.elapsed();
        // Server → sandbox.
        let t = Instant::now();
        let mut c = open(SOURCE_PORT)?;
        let got = std::io::copy(&mut c, &mut std::io::sink())?;
        let down = t.elapsed();
        if got != (mib as u64) << 20 {
            return Err(std::io::Error::other(format!(
                "got {got} bytes from the server"
            )));
        }
        // Connection set-up, then a 1-byte round trip on it.
        let mut connect = Vec::with_capacity(connects);
        let mut rtt = Vec::with_capacity(connects);
        for _ in 0..connects {
            let t = Instant::now();
            let mut c = TcpStream::connect(server(ECHO_PORT))?;
            connect.push(t.elapsed());
            c.set_nodelay(true)?;
            let t = Instant::now();
            c.write_all(b"x")?;
            c.read_exact(&mut [0; 1])?;
            rtt.push(t.elapsed());
        }
        let dns = dns::lookups(resolver, &tag, connects, SERVER_IP).map_err(|e| e.to_string());
        Ok((up, down, connect, rtt, dns))
    })??;
    let dns = dns.unwrap_or_else(|e| {
        println!("{}: DNS through {resolver} failed: {e}", s.ns.name);
        Vec::new()
    });
    let mbit = |d: Duration| (mib as f64 * 8.0 * 1.048_576) / d.as_secs_f64();
    Ok(Figures {
        up_mbit: mbit(up),
        down_mbit: mbit(down),
        connect,
        rtt,
        dns,
    })
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "float to int saturates, which is what is wanted"
    )]
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

/// A percentile as printed: `-` when there is none.
fn pct_text(v: &mut [Duration], p: f64) -> String {
    if v.is_empty() {
        return "-".into();
    }
    format!("{:?}", pct(v, p))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The process's resident memory, from /proc/self/status.
fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/self/status")
}

/// RSS growth per idle stack over `n` stacks (each with its tap, nothing flowing), after one
/// warm-up stack so the runtime's own first allocations are not counted.
fn idle_memory(world: &World, rt: &tokio::runtime::Runtime, n: usize) -> Result<f64> {
    let _warm = belljar(world, rt)?;
    let before = rss_kib()?;
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(belljar(world, rt)?);
    }
    // Let every stack reach its idle wait (router solicitations, the first poll).
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib()?;
    Ok((after.saturating_sub(before)) as f64 / n as f64)
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        nix::unistd::geteuid().is_root(),
        "net_bench makes network namespaces: run it as root"
    );
    let world = World::new(args.mib)?;
    let rt = world.host.run(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    })??;
    type Make<'a> = Box<dyn Fn() -> Result<Sandbox> + 'a>;
    let mut peers: Vec<(&str, Make)> = vec![
        ("belljar", Box::new(|| belljar(&world, &rt))),
        ("pasta", Box::new(|| pasta(&world))),
        ("slirp4netns", Box::new(|| slirp4netns(&world))),
    ];
    peers.retain(|(name, _)| args.peers.iter().any(|p| p == name));
    let mut runs: Vec<(String, u32, Vec<Figures>)> = Vec::new();
    for round in 0..args.rounds {
        for (name, make) in &peers {
            let s = match make() {
                Ok(s) => s,
                Err(e) => {
                    if round == 0 {
                        println!("{name}: skipped: {e:#}");
                    }
                    continue;
                }
            };
            // A peer that fails a round (passt 2023-03-09 sometimes resets the bench's
            // connection) is reported and measured again in the next round, not the end of
            // the run.
            let f = match measure(&s, args.mib, args.connects) {
                Ok(f) => f,
                Err(e) => {
                    println!("round {}: {name:<12} failed: {e:#}", round + 1);
                    continue;
                }
            };
            // Each round's throughput too: the spread shows whether a median is a fluke.
            println!(
                "round {}: {name:<12} up {:>6.0} down {:>6.0} Mbit/s",
                round + 1,
                f.up_mbit,
                f.down_mbit
            );
            match runs.iter_mut().find(|r| r.0 == *name) {
                Some(r) => r.2.push(f),
                None => runs.push((name.to_string(), s.mtu, vec![f])),
            }
        }
    }
    println!(
        "{} rounds, {} MiB each way, {} connections; server 203.0.113.2 behind a veth from the host namespace",
        args.rounds, args.mib, args.connects
    );
    println!(
        "{:<12} {:>5} {:>11} {:>11} {:>12} {:>12} {:>11} {:>11} {:>11}",
        "stack",
        "MTU",
        "up Mbit/s",
        "down Mbit/s",
        "connect p50",
        "connect p95",
        "RTT p50",
        "DNS p50",
        "DNS p95"
    );
    for (name, mtu, figs) in &mut runs {
        let mut up: Vec<f64> = figs.iter().map(|f| f.up_mbit).collect();
        let mut down: Vec<f64> = figs.iter().map(|f| f.down_mbit).collect();
        let mut connect: Vec<Duration> = figs.iter().flat_map(|f| f.connect.clone()).collect();
        let mut rtt: Vec<Duration> = figs.iter().flat_map(|f| f.rtt.clone()).collect();
        let mut dns: Vec<Duration> = figs.iter().flat_map(|f| f.dns.clone()).collect();
        println!(
            "{:<12} {:>5} {:>11.0} {:>11.0} {:>12} {:>12} {:>11} {:>11} {:>11}",
            name,
            mtu,
            median(&mut up),
            median(&mut down),
            pct_text(&mut connect, 0.5),
            pct_text(&mut connect, 0.95),
            pct_text(&mut rtt, 0.5),
            pct_text(&mut dns, 0.5),
            pct_text(&mut dns, 0.95),
        );
    }
    let per = idle_memory(&world, &rt, args.idle)?;
    println!(
        "belljar stack memory per idle sandbox: {per:.0} KiB (RSS growth over {} idle stacks)",
        args.idle
    );
    Ok(())
}
