//! `belljar-ns`: drive namespace sandboxes by hand, measure launch latency, and stand in for
//! the daemon in tests (`launch --hold` keeps the launching process alive to be killed).
//!
//! ```text
//! belljar-ns probe
//! belljar-ns launch ID ROOTFS STATE_DIR AGENT [--memory BYTES] [--pids N] [--cpu CPUS] [--disk BYTES] [--hold]
//! belljar-ns adopt STATE_DIR | stop STATE_DIR | destroy STATE_DIR | usage STATE_DIR
//! belljar-ns bench N ROOTFS AGENT WORK_DIR     # launch → socket connectable, N times
//! belljar-ns sh STATE_DIR COMMAND              # through the test stand-in agent only
//! belljar-ns user-tree IMAGE_DIR CACHE_DIR     # the image tree this user's sandboxes use
//! belljar-ns fixtures                          # builds the test fixtures, prints their directory
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use belljar_namespace::{Limits, SandboxSpec};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .with_context(|| format!("missing argument {i}"))
    };
    let flag = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    match args.first().map(String::as_str) {
        Some("probe") => println!(
            "{}",
            serde_json::to_string_pretty(&belljar_namespace::probe())?
        ),
        Some("launch") => {
            let limits = Limits {
                memory_bytes: flag("--memory").map(|v| v.parse()).transpose()?,
                pids: flag("--pids").map(|v| v.parse()).transpose()?,
                cpu: flag("--cpu").map(|v| v.parse()).transpose()?,
                disk_bytes: flag("--disk").map(|v| v.parse()).transpose()?,
            };
            let spec = SandboxSpec {
                id: arg(1)?,
                rootfs: arg(2)?.into(),
                layers: Vec::new(),
                state_dir: arg(3)?.into(),
                agent: arg(4)?.into(),
                hostname: arg(1)?,
                limits,
                env: vec![],
                mounts: vec![],
                binds: vec![],
                durable: true,
            };
            let running = belljar_namespace::launch(&spec)?;
            println!("{}", serde_json::to_string(&running)?);
            if args.iter().any(|a| a == "--hold") {
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
        }
        Some("adopt") => {
            let running = belljar_namespace::adopt(&PathBuf::from(arg(1)?))?;
            println!("{}", serde_json::to_string(&running)?);
        }
        Some("stop") => belljar_namespace::stop(&PathBuf::from(arg(1)?), Duration::from_secs(5))?,
        Some("destroy") => belljar_namespace::destroy(&PathBuf::from(arg(1)?))?,
        Some("usage") => {
            let usage = belljar_namespace::usage(&PathBuf::from(arg(1)?))?;
            println!("{}", serde_json::to_string(&usage)?);
        }
        Some("sh") => {
            let socket = PathBuf::from(arg(1)?).join(belljar_namespace::AGENT_SOCKET);
            let out =
                belljar_namespace::testing::shell(&socket, &arg(2)?, Duration::from_secs(60))?;
            print!("{}", out.text);
            std::process::exit(out.code);
        }
        Some("user-tree") => {
            let started = Instant::now();
            let tree = belljar_namespace::usertree::user_tree(
                &PathBuf::from(arg(1)?),
                &PathBuf::from(arg(2)?),
            )?;
            println!("{}", tree.display());
            eprintln!("user-tree: {:.1?}", started.elapsed());
        }
        Some("fixtures") => {
            belljar_namespace::testing::fixtures()?;
            println!("{}", belljar_namespace::testing::fixture_dir().display());
        }
        Some("bench") => bench(
            arg(1)?.parse()?,
            arg(2)?.into(),
            arg(3)?.into(),
            arg(4)?.into(),
        )?,
        _ => bail!(
            "usage: belljar-ns probe|launch|adopt|stop|destroy|usage|user-tree|fixtures|bench ... (see --help in the source)"
        ),
    }
    Ok(())
}

/// Launch → agent socket connectable, `n` times, one sandbox at a time; prints each and p50.
fn bench(n: usize, rootfs: PathBuf, agent: PathBuf, work: PathBuf) -> Result<()> {
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let spec = SandboxSpec {
            id: format!("bench-{i}"),
            rootfs: rootfs.clone(),
            layers: Vec::new(),
            state_dir: work.join(format!("bench-{i}")),
            agent: agent.clone(),
            hostname: format!("bench-{i}"),
            limits: Limits {
                memory_bytes: Some(512 << 20),
                pids: Some(1024),
                cpu: Some(1.0),
                disk_bytes: Some(1 << 30),
            },
            env: vec![],
            mounts: vec![],
            binds: vec![],
            durable: false,
        };
        let start = Instant::now();
        let running = belljar_namespace::launch(&spec)?;
        let launched = start.elapsed();
        belljar_namespace::wait_ready(&running.socket, Duration::from_secs(10))?;
        let ready = start.elapsed();
        println!(
            "run {i}: launch() {:.1} ms, socket connectable {:.1} ms",
            ms(launched),
            ms(ready)
        );
        times.push(ready);
        belljar_namespace::destroy(&spec.state_dir)?;
    }
    times.sort();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "float to int saturates, which is what is wanted"
    )]
    let p = |q: f64| ms(times[((times.len() - 1) as f64 * q).round() as usize]);
    println!(
        "launch → connectable over {n}: p50 {:.1} ms, p90 {:.1} ms, min {:.1} ms, max {:.1} ms",
        p(0.5),
        p(0.9),
        p(0.0),
        p(1.0)
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
