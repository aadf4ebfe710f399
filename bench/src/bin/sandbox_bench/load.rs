//! Many commands at once: `inflight` runs of `true`, spread over `sandboxes` sandboxes and
//! all started together, as an agent fleet or a test runner would. Reports the rate at which
//! they complete and the latency each one saw.

use std::time::{Duration, Instant};

use anyhow::Result;
use belljar_client::Client;
use tokio::task::JoinSet;

use crate::{create, delete, exec_true};

pub async fn report(client: &Client, image: &str, sandboxes: usize, inflight: usize) -> Result<()> {
    let mut ids = Vec::with_capacity(sandboxes);
    for _ in 0..sandboxes.max(1) {
        ids.push(create(client, image).await?.id);
    }
    let result = in_flight(client, &ids, inflight).await;
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
    Ok(())
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
