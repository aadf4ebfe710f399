//! The agent at size: a 1 GiB file streamed both ways in constant memory, a command
//! printing 100 MB, and 100 commands at once, with the agent's peak RSS checked each time.

mod common;

use std::time::{Duration, Instant};

use belljar_agent_proto::client::body_from_stream;
use belljar_agent_proto::{CommandStatus, OutputLine};
use bytes::Bytes;
use common::{Agent, argv};
use futures::{StreamExt, TryStreamExt};

/// The agent's peak RSS must stay below this whatever it moves.
const RSS_BOUND_KIB: u64 = 96 * 1024;

/// Deterministic, non-repeating-looking content: byte i of the file is a function of i.
fn pattern(offset: u64, len: usize) -> Bytes {
    (0..len as u64)
        .map(|i| {
            let x = offset + i;
            (x ^ (x >> 8) ^ (x >> 17)).to_le_bytes()[0]
        })
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn streams_a_1_gib_file_both_ways_in_constant_memory() {
    const SIZE: u64 = 1 << 30;
    const CHUNK: usize = 1 << 20;
    let agent = Agent::start().await;
    let path = agent.path("big/file.bin");
    let t = Instant::now();
    let upload = futures::stream::iter(
        (0..SIZE / CHUNK as u64).map(|i| Ok(pattern(i * CHUNK as u64, CHUNK))),
    );
    let entry = agent
        .client
        .write_file(&path, None, None, body_from_stream(upload))
        .await
        .unwrap();
    assert_eq!(entry.size, SIZE);
    let up = t.elapsed();

    let t = Instant::now();
    let (len, body) = agent.client.read_file(&path).await.unwrap();
    assert_eq!(len, Some(SIZE));
    let mut offset = 0u64;
    let mut body = body;
    while let Some(chunk) = body.try_next().await.unwrap() {
        assert_eq!(chunk, pattern(offset, chunk.len()), "mismatch at {offset}");
        offset += chunk.len() as u64;
    }
    assert_eq!(offset, SIZE);
    let down = t.elapsed();
    let rss = agent.peak_rss_kib();
    eprintln!("1 GiB: write {up:?}, read {down:?}, agent peak RSS {rss} KiB");
    assert!(rss < RSS_BOUND_KIB, "agent peak RSS {rss} KiB");
}

#[tokio::test]
async fn a_command_printing_100_mb_keeps_memory_and_disk_bounded() {
    let agent = Agent::start().await;
    let t = Instant::now();
    let started = agent
        .client
        .start_command(&argv(&[
            "/bin/sh",
            "-c",
            "yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 100000000",
        ]))
        .await
        .unwrap();
    let mut lines = agent.client.output(&started.id, 0, true).await.unwrap();
    let mut received = 0u64;
    while let Some(line) = lines.try_next().await.unwrap() {
        received += line.bytes().len() as u64;
    }
    let info = agent.client.wait_command(&started.id).await.unwrap();
    let rss = agent.peak_rss_kib();
    eprintln!(
        "100 MB output: {:?}, kept {received} B, agent peak RSS {rss} KiB",
        t.elapsed()
    );
    assert_eq!(info.exit_code, Some(0));
    // The default bound is 64 MiB per command; the rest is counted.
    assert_eq!(received, 64 << 20);
    assert_eq!(info.output_truncated_bytes, 100_000_000 - (64 << 20));
    assert!(rss < RSS_BOUND_KIB, "agent peak RSS {rss} KiB");
}

#[tokio::test]
async fn output_bound_is_configurable() {
    let agent = Agent::start_with(&["--output-limit", "1000"]).await;
    let (info, out, _) = agent.sh("head -c 5000 /dev/zero | tr '\\0' a").await;
    assert_eq!(out.len(), 1000);
    assert_eq!(info.output_truncated_bytes, 4000);
}

#[tokio::test]
async fn runs_100_commands_at_once_and_reaps_them_all() {
    let agent = Agent::start().await;
    let t = Instant::now();
    let started = futures::future::join_all((0..100).map(|i| {
        let client = agent.client.clone();
        async move {
            let start = argv(&[
                "/bin/sh",
                "-c",
                "sleep 5; echo out-$0; echo err-$0 >&2; exit $(($0 % 7))",
                &i.to_string(),
            ]);
            client.start_command(&start).await.unwrap()
        }
    }))
    .await;
    // Each command sleeps long enough that all 100 are still running when listed, even on a
    // loaded two-core machine where starting them takes a while.
    let running = agent.client.list_commands().await.unwrap();
    assert_eq!(running.len(), 100);
    assert!(
        running
            .iter()
            .filter(|c| c.status == CommandStatus::Running)
            .count()
            > 50
    );

    let results = futures::future::join_all(started.iter().enumerate().map(|(i, cmd)| {
        let client = agent.client.clone();
        let id = cmd.id.clone();
        async move {
            let lines: Vec<OutputLine> = client
                .output(&id, 0, true)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            let info = client.wait_command(&id).await.unwrap();
            (i, info, common::split(&lines))
        }
    }))
    .await;
    for (i, info, (out, err)) in results {
        assert_eq!(info.exit_code, Some(i32::try_from(i % 7).unwrap()));
        assert_eq!(out, format!("out-{i}\n").as_bytes());
        assert_eq!(err, format!("err-{i}\n").as_bytes());
    }
    eprintln!("100 concurrent commands: {:?}", t.elapsed());

    // No zombie is left among the agent's children once its reaper has caught up.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let zombies: Vec<u32> = common::children(agent.pid())
            .into_iter()
            .filter(|&pid| common::is_zombie(pid))
            .collect();
        if zombies.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "zombies left: {zombies:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn many_streams_share_one_connection() {
    let agent = Agent::start().await;
    // 300 output follows open at once on one HTTP/2 connection.
    let started = agent
        .client
        .start_command(&argv(&["/bin/sh", "-c", "sleep 0.5; echo hi"]))
        .await
        .unwrap();
    let follows = futures::stream::iter(0..300)
        .map(|_| {
            let client = agent.client.clone();
            let id = started.id.clone();
            async move {
                let lines: Vec<OutputLine> = client
                    .output(&id, 0, true)
                    .await
                    .unwrap()
                    .try_collect()
                    .await
                    .unwrap();
                common::split(&lines).0
            }
        })
        .buffer_unordered(300)
        .collect::<Vec<_>>()
        .await;
    assert!(follows.iter().all(|out| out == b"hi\n"));
}

#[tokio::test]
async fn finished_commands_do_not_keep_descriptors() {
    let agent = Agent::start().await;
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", agent.pid()))
            .unwrap()
            .count()
    };
    // Warm up the runtime's own threads and descriptors.
    agent.sh("true").await;
    let before = fds();
    for _ in 0..30 {
        let start = belljar_agent_proto::StartCommand {
            argv: ["/bin/sh", "-c", "echo hi"].map(String::from).to_vec(),
            pty: Some(belljar_agent_proto::PtySize { rows: 5, cols: 5 }),
            ..Default::default()
        };
        agent.run(start).await;
        let mut start = argv(&["cat"]);
        start.stdin = true;
        let started = agent.client.start_command(&start).await.unwrap();
        agent.client.signal(&started.id, "KILL").await.unwrap();
        agent.client.wait_command(&started.id).await.unwrap();
    }
    // The last command's descriptors close as the agent finishes with it, just after its
    // exit is reported.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let after = fds();
        if after <= before + 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors grew from {before} to {after}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
