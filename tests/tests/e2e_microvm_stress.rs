//! The microVM under load: many create → exec → file round trip → delete cycles at once, and
//! many vsock connections per VM moving data both ways. Ignored by default, as the other
//! microVM tests: `scripts/test-microvm.sh` runs a short version in CI, and
//! `scripts/test-microvm.sh --stress` the long one (200 cycles, 4 in flight).
//!
//! Settings: `BELLJAR_STRESS_CYCLES` (default 6), `BELLJAR_STRESS_INFLIGHT` (default 2),
//! `BELLJAR_STRESS_MIB` (the file each cycle writes and reads back, default 32) and
//! `BELLJAR_STRESS_CONNECTIONS` (agent connections each VM gets besides the daemon's,
//! default 20). Every failure counts: nothing is retried.

use std::time::{Duration, Instant};

use belljar_agent_proto::client::{AgentClient, body_from_bytes};
use belljar_api::CreateSandbox;
use belljar_client::Client;
use belljar_e2e::microvm::{console, create_vm};
use belljar_e2e::{Daemon, run};
use futures::{StreamExt, TryStreamExt};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// Bytes that differ per cycle and per connection, so a mixed-up stream cannot pass.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    data
}

/// One connection of its own to the VM's agent, through the VMM's hybrid vsock socket (as
/// the daemon's is made): a file written through it and read back through it.
async fn side_connection(socket: std::path::PathBuf, cycle: usize, n: usize) -> Result<(), String> {
    let agent = AgentClient::connect_hybrid_vsock(&socket, belljar_agent_proto::AGENT_VSOCK_PORT)
        .await
        .map_err(|e| format!("connection {n}: connect: {e}"))?;
    let data = pattern((cycle * 1000 + n) as u64, 1 << 20);
    let path = format!("/tmp/side-{n}.bin");
    agent
        .write_file(&path, None, None, body_from_bytes(data.clone()))
        .await
        .map_err(|e| format!("connection {n}: write: {e}"))?;
    let (_, stream) = agent
        .read_file(&path)
        .await
        .map_err(|e| format!("connection {n}: read: {e}"))?;
    let back: Vec<u8> = stream
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
        .map_err(|e| format!("connection {n}: read body: {e}"))?;
    if back != data {
        return Err(format!(
            "connection {n}: read back {} bytes, not the {} written",
            back.len(),
            data.len()
        ));
    }
    Ok(())
}

/// One cycle: create, `true`, the file round trip through the daemon while the side
/// connections move their own data, delete. Returns what went wrong, with the consoles.
async fn cycle(d: &Daemon, c: &Client, i: usize, mib: usize, connections: usize) -> Duration {
    let t = Instant::now();
    let s = create_vm(
        d,
        c,
        CreateSandbox {
            memory_mib: Some(256),
            ..Default::default()
        },
    )
    .await;
    let fail = |what: String| -> ! {
        panic!(
            "cycle {i} ({}): {what}\nconsoles:\n{}\ndaemon log:\n{}",
            s.id,
            console(d, &s.id),
            d.log()
        )
    };
    let (code, out) = run(c, &s.id, &["true"], false).await;
    if code != 0 {
        fail(format!("`true` exited {code}: {out}"));
    }
    let socket = d
        .paths
        .data
        .join("sandboxes")
        .join(&s.id)
        .join("microvm/vsock.sock");
    let side =
        futures::future::join_all((0..connections).map(|n| side_connection(socket.clone(), i, n)));
    let data = pattern(i as u64, mib << 20);
    let main = async {
        c.write_file(
            &s.id,
            "/workspace/big.bin",
            None,
            belljar_client::full(data.clone()),
        )
        .await
        .map_err(|e| format!("upload: {e}"))?;
        let back = c
            .read_file_bytes(&s.id, "/workspace/big.bin")
            .await
            .map_err(|e| format!("download: {e}"))?;
        if back[..] != data[..] {
            return Err(format!(
                "downloaded {} bytes differ from the upload",
                back.len()
            ));
        }
        Ok::<(), String>(())
    };
    let (side, main) = tokio::join!(side, main);
    if let Err(e) = main {
        fail(e);
    }
    let broken: Vec<String> = side.into_iter().filter_map(Result::err).collect();
    if !broken.is_empty() {
        fail(broken.join("\n"));
    }
    if let Err(e) = c.delete_sandbox(&s.id).await {
        fail(format!("delete: {e}"));
    }
    t.elapsed()
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn cycles_and_side_connections_under_load() {
    let cycles = setting("BELLJAR_STRESS_CYCLES", 6);
    let inflight = setting("BELLJAR_STRESS_INFLIGHT", 2).max(1);
    let mib = setting("BELLJAR_STRESS_MIB", 32);
    let connections = setting("BELLJAR_STRESS_CONNECTIONS", 20);
    let d = Daemon::start_via_cli();
    let c = d.unix();
    let t = Instant::now();
    let mut took = belljar_e2e::block_on(async {
        futures::stream::iter(0..cycles)
            .map(|i| cycle(&d, &c, i, mib, connections))
            .buffer_unordered(inflight)
            .collect::<Vec<Duration>>()
            .await
    });
    took.sort();
    let left = belljar_e2e::block_on(async { c.list_sandboxes(&Default::default()).await });
    assert!(
        left.as_ref().is_ok_and(|l| l.sandboxes.is_empty()),
        "sandboxes left: {left:?}"
    );
    eprintln!(
        "stress: {cycles} cycles ({inflight} in flight, {mib} MiB round trip, {connections} side connections each) in {:?}; per cycle p50 {:?}, max {:?}",
        t.elapsed(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
}
