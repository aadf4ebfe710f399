//! Uploads that do not finish leave nothing behind: not when the uploader's connection drops
//! mid-body (the daemon killed with SIGKILL; the agent goes on), and not when the agent itself
//! dies mid-upload (a sandbox stopped hard), whose next start removes the temporary file.

mod common;

use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::time::Duration;

use belljar_agent_proto::client::{AgentClient, body_from_stream};
use belljar_agent_proto::{MkdirRequest, WatchEvent, WatchKind};
use bytes::Bytes;
use common::Agent;
use futures::{SinkExt, TryStreamExt};

/// The next watch event that `wanted` accepts.
async fn next_event(
    events: &mut (
             impl futures::Stream<Item = Result<WatchEvent, belljar_agent_proto::client::ClientError>>
             + Unpin
         ),
    wanted: impl Fn(&WatchEvent) -> bool,
) -> WatchEvent {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), events.try_next())
            .await
            .expect("no such watch event")
            .unwrap()
            .expect("watch ended");
        if wanted(&event) {
            return event;
        }
    }
}

async fn upload_dir(agent: &Agent) -> String {
    let dir = agent.path("up");
    agent
        .client
        .mkdir(&MkdirRequest {
            path: dir.clone(),
            parents: true,
            mode: None,
            user: None,
        })
        .await
        .unwrap();
    dir
}

/// Starts an upload of `target` on a connection of its own and waits until its first chunk is
/// in the temporary file (2 MiB, past the agent's 1 MiB write buffer, so it is written at once); returns that file's path, the body's sender and the connection.
async fn start_upload(
    agent: &Agent,
    events: &mut (
             impl futures::Stream<Item = Result<WatchEvent, belljar_agent_proto::client::ClientError>>
             + Unpin
         ),
    target: &str,
) -> (
    String,
    futures::channel::mpsc::Sender<Result<Bytes, io::Error>>,
    StdUnixStream,
) {
    let socket = StdUnixStream::connect(&agent.socket).unwrap();
    let held = socket.try_clone().unwrap();
    socket.set_nonblocking(true).unwrap();
    let client = AgentClient::handshake(tokio::net::UnixStream::from_std(socket).unwrap())
        .await
        .unwrap();
    let (mut tx, rx) = futures::channel::mpsc::channel(1);
    let path = target.to_owned();
    tokio::spawn(async move {
        let _ = client
            .write_file(&path, None, None, body_from_stream(rx))
            .await;
    });
    tx.send(Ok(Bytes::from(vec![7u8; 2 << 20]))).await.unwrap();
    let name = target.rsplit('/').next().unwrap();
    let prefix = format!("{}/.{name}.belljar-", target.rsplit_once('/').unwrap().0);
    let created = next_event(events, |e| {
        e.kind == WatchKind::Create && e.path.starts_with(&prefix)
    })
    .await;
    next_event(events, |e| {
        e.kind == WatchKind::Modify && e.path == created.path
    })
    .await;
    (created.path, tx, held)
}

#[tokio::test]
async fn an_upload_whose_connection_drops_leaves_no_temporary_file() {
    let agent = Agent::start().await;
    let dir = upload_dir(&agent).await;
    let mut events = agent.client.watch(&dir, false).await.unwrap();
    let target = format!("{dir}/big.bin");
    let (tmp, _body, connection) = start_upload(&agent, &mut events, &target).await;
    assert!(std::path::Path::new(&tmp).exists());
    // The uploader dies mid-body: its socket closes with the body still open.
    connection.shutdown(std::net::Shutdown::Both).unwrap();
    next_event(&mut events, |e| {
        e.kind == WatchKind::Remove && e.path == tmp
    })
    .await;
    let names: Vec<String> = agent
        .client
        .list(&dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

#[tokio::test]
async fn an_upload_whose_body_fails_leaves_no_temporary_file() {
    let agent = Agent::start().await;
    let dir = upload_dir(&agent).await;
    let mut events = agent.client.watch(&dir, false).await.unwrap();
    let target = format!("{dir}/cut.bin");
    let (tmp, mut body, _connection) = start_upload(&agent, &mut events, &target).await;
    body.send(Err(io::Error::other("cut"))).await.unwrap();
    next_event(&mut events, |e| {
        e.kind == WatchKind::Remove && e.path == tmp
    })
    .await;
    assert!(agent.client.list(&dir).await.unwrap().is_empty());
}

#[tokio::test]
async fn an_agent_killed_mid_upload_removes_the_temporary_file_at_its_next_start() {
    let agent = Agent::start().await;
    let dir = upload_dir(&agent).await;
    let mut events = agent.client.watch(&dir, false).await.unwrap();
    let target = format!("{dir}/big.bin");
    let (tmp, _body, _connection) = start_upload(&agent, &mut events, &target).await;
    drop(events);
    let agent = agent.kill_and_restart().await;
    assert!(
        !std::path::Path::new(&tmp).exists(),
        "{tmp} outlived the agent's restart"
    );
    // Uploads work as before, the same name included.
    agent
        .client
        .write_file(
            &target,
            None,
            None,
            belljar_agent_proto::client::body_from_bytes(&b"whole"[..]),
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"whole");
    let names: Vec<String> = agent
        .client
        .list(&dir)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["big.bin"]);
    // The journal of uploads in progress is gone with the last of them.
    assert!(!agent.dir.path().join("state/uploads").exists());
}
