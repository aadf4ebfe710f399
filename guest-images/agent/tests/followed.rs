//! A command's whole life on its start's request (`POST /v1/commands?follow=true`), and the
//! epoch fence that keeps a dead daemon's queued starts from running after a restarted
//! daemon listed the commands.

mod common;

use belljar_agent_proto::{CommandStatus, Followed, Stream, codes};
use common::{Agent, argv, wait_then_read};
use futures::TryStreamExt;

#[tokio::test]
async fn a_followed_start_carries_the_output_and_the_end() {
    let agent = Agent::start().await;
    let mut start = argv(&["/bin/sh", "-c", "echo one; echo two >&2; sleep 0.2; exit 4"]);
    start.client_id = Some("cmd_followed".into());
    let (started, life) = agent.client.start_following(&start).await.unwrap();
    assert_eq!(started.status, CommandStatus::Running);
    assert_eq!(started.client_id.as_deref(), Some("cmd_followed"));
    let rest: Vec<Followed> = life
        .expect("this agent follows")
        .try_collect()
        .await
        .unwrap();
    let (last, output) = rest.split_last().unwrap();
    let Followed::Ended(end) = last else {
        panic!("the stream ends with the command's end: {rest:?}")
    };
    assert_eq!(end.ended.id, started.id);
    assert_eq!(end.ended.exit_code, Some(4));
    assert_eq!(end.ended.status, CommandStatus::Exited);
    // The output lines are those the output route keeps for later clients.
    let (_, kept) = wait_then_read(&agent.client, &started.id).await;
    let lines: Vec<_> = output
        .iter()
        .map(|f| match f {
            Followed::Output(line) => line.clone(),
            other => panic!("only output between start and end: {other:?}"),
        })
        .collect();
    assert_eq!(lines, kept);
    let streams: Vec<_> = lines.iter().map(|l| l.stream).collect();
    assert!(streams.contains(&Stream::Stdout) && streams.contains(&Stream::Stderr));

    // Asked again under the same client id: the same command, followed from its first line.
    let (again, life) = agent.client.start_following(&start).await.unwrap();
    assert_eq!(again.id, started.id);
    let rest: Vec<Followed> = life.unwrap().try_collect().await.unwrap();
    assert_eq!(rest.len(), output.len() + 1);

    // A start that fails is an error, as without `follow`.
    let err = agent
        .client
        .start_following(&argv(&["/no/such/program"]))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Some(codes::EXEC_FAILED));
}

#[tokio::test]
async fn a_listing_with_a_fence_refuses_older_starts() {
    let agent = Agent::start().await;
    let mut start = argv(&["true"]);
    start.client_id = Some("cmd_before".into());
    start.epoch = Some(5);
    let before = agent.client.start_command(&start).await.unwrap();

    let (listed, fence) = agent.client.list_commands_fenced(10).await.unwrap();
    assert_eq!(fence, Some(10));
    assert_eq!(listed.len(), 1);
    // Listed again by the same daemon: the same fence; a plain listing leaves it.
    let (_, fence) = agent.client.list_commands_fenced(10).await.unwrap();
    assert_eq!(fence, Some(10));
    agent.client.list_commands().await.unwrap();

    // The old daemon's start that arrives late is refused and runs nothing.
    start.client_id = Some("cmd_late".into());
    let err = agent.client.start_command(&start).await.unwrap_err();
    assert_eq!(err.code(), Some(codes::STALE_START));
    let err = agent
        .client
        .start_following(&start)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Some(codes::STALE_START));
    // One already started is still reported under its client id, whatever its epoch.
    start.client_id = Some("cmd_before".into());
    assert_eq!(
        agent.client.start_command(&start).await.unwrap().id,
        before.id
    );
    // The new daemon's starts, and starts with no epoch, run.
    start.client_id = Some("cmd_new".into());
    start.epoch = Some(10);
    agent.client.start_command(&start).await.unwrap();
    start.client_id = Some("cmd_unfenced".into());
    start.epoch = None;
    agent.client.start_command(&start).await.unwrap();
    let ids: Vec<_> = agent
        .client
        .list_commands()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.client_id)
        .collect();
    assert_eq!(ids, ["cmd_before", "cmd_new", "cmd_unfenced"]);

    // Another daemon's listing moves the fence: then the epoch before it is refused too.
    assert_eq!(
        agent.client.list_commands_fenced(3).await.unwrap().1,
        Some(3)
    );
    start.client_id = Some("cmd_other".into());
    start.epoch = Some(10);
    let err = agent.client.start_command(&start).await.unwrap_err();
    assert_eq!(err.code(), Some(codes::STALE_START));
}
