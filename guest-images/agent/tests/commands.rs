//! Commands through the real agent: output, exit codes, signals, stdin, PTYs, detached
//! output read later, users and bad input.

mod common;

use std::time::{Duration, Instant};

use belljar_agent_proto::{
    CommandStatus, PtySize, StartCommand, Stream, client::body_from_bytes, codes,
};
use common::{Agent, argv, split, wait_then_read};
use futures::TryStreamExt;

#[tokio::test]
async fn health_reports_the_agent() {
    let agent = Agent::start().await;
    let info = agent.client.health().await.unwrap();
    assert_eq!(info.pid, agent.pid());
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert!(info.started_at > 0);
}

#[tokio::test]
async fn streams_stdout_and_stderr_and_reports_the_exit_code() {
    let agent = Agent::start().await;
    let (info, out, err) = agent.sh("echo out; echo err >&2; exit 3").await;
    assert_eq!(out, "out\n");
    assert_eq!(err, "err\n");
    assert_eq!(info.exit_code, Some(3));
    assert_eq!(info.signal, None);
    assert_eq!(info.status, CommandStatus::Exited);
    assert!(info.finished_at.unwrap() >= info.started_at);
}

#[tokio::test]
async fn sets_env_cwd_and_user_defaults() {
    let agent = Agent::start().await;
    let mut start = argv(&[
        "/bin/sh",
        "-c",
        "pwd; echo $FOO; echo $PATH; echo $HOME; echo $USER",
    ]);
    start.cwd = Some("/tmp".into());
    start.env.insert("FOO".into(), "bar baz".into());
    let (info, lines) = agent.run(start).await;
    let (out, _) = split(&lines);
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "/tmp");
    assert_eq!(lines[1], "bar baz");
    assert!(lines[2].contains("/usr/bin"));
    assert!(!lines[3].is_empty());
    assert_eq!(lines[4], info.user);
}

#[tokio::test]
async fn runs_as_the_requested_user_when_root() {
    if !common::root_or_not_run("to switch users") {
        return;
    }
    let agent = Agent::start().await;
    let mut start = argv(&["/bin/sh", "-c", "id -u; id -g"]);
    start.user = Some("nobody".into());
    let (info, lines) = agent.run(start).await;
    let (out, _) = split(&lines);
    assert_eq!(String::from_utf8(out).unwrap(), "65534\n65534\n");
    assert_eq!(info.user, "nobody");

    let mut start = argv(&["true"]);
    start.user = Some("no-such-user-here".into());
    let err = agent.client.start_command(&start).await.unwrap_err();
    assert_eq!(err.code(), Some(codes::UNKNOWN_USER));
}

#[tokio::test]
async fn refuses_bad_commands_with_stable_codes() {
    let agent = Agent::start().await;
    let c = &agent.client;
    assert_eq!(
        code(c.start_command(&argv(&["/no/such/program"])).await).as_deref(),
        Some(codes::EXEC_FAILED)
    );
    assert_eq!(
        code(c.start_command(&argv(&["no-such-program-in-path"])).await).as_deref(),
        Some(codes::EXEC_FAILED)
    );
    assert_eq!(
        code(c.start_command(&argv(&[])).await).as_deref(),
        Some(codes::BAD_REQUEST)
    );
    let mut start = argv(&["true"]);
    start.cwd = Some("/no/such/dir".into());
    assert_eq!(
        code(c.start_command(&start).await).as_deref(),
        Some(codes::NOT_FOUND)
    );
    start.cwd = Some("relative".into());
    assert_eq!(
        code(c.start_command(&start).await).as_deref(),
        Some(codes::INVALID_PATH)
    );
    assert_eq!(
        code(c.command("cmd-999").await).as_deref(),
        Some(codes::COMMAND_NOT_FOUND)
    );
    assert_eq!(
        code(c.signal("cmd-999", "TERM").await).as_deref(),
        Some(codes::COMMAND_NOT_FOUND)
    );
    // The agent still works after all that.
    let (info, out, _) = agent.sh("echo fine").await;
    assert_eq!((info.exit_code, out.as_str()), (Some(0), "fine\n"));
}

fn code<T: std::fmt::Debug>(
    r: Result<T, belljar_agent_proto::client::ClientError>,
) -> Option<String> {
    r.unwrap_err().code().map(str::to_owned)
}

#[tokio::test]
async fn reports_commands_killed_by_signals() {
    let agent = Agent::start().await;
    let (info, _, _) = agent.sh("kill -9 $$").await;
    assert_eq!((info.exit_code, info.signal), (None, Some(9)));

    let started = agent
        .client
        .start_command(&argv(&["sleep", "100"]))
        .await
        .unwrap();
    assert_eq!(started.status, CommandStatus::Running);
    agent.client.signal(&started.id, "TERM").await.unwrap();
    let info = agent.client.wait_command(&started.id).await.unwrap();
    assert_eq!((info.exit_code, info.signal), (None, Some(15)));
    let err = agent.client.signal(&started.id, "KILL").await.unwrap_err();
    assert_eq!(err.code(), Some(codes::COMMAND_FINISHED));
    let bad = agent.client.signal(&started.id, "NOPE").await.unwrap_err();
    assert_eq!(bad.code(), Some(codes::BAD_REQUEST));
}

#[tokio::test]
async fn signals_reach_the_whole_process_group() {
    let agent = Agent::start().await;
    let started = agent
        .client
        .start_command(&argv(&[
            "/bin/sh",
            "-c",
            "sleep 100 & sleep 100 & echo forked; wait",
        ]))
        .await
        .unwrap();
    // Killed once both sleeps are in the group: the shell says so after forking them.
    let mut output = agent.client.output(&started.id, 0, true).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), output.try_next())
        .await
        .expect("the shell forked within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(first.data.as_deref(), Some("forked\n"));
    drop(output);
    agent.client.signal(&started.id, "SIGKILL").await.unwrap();
    let info = agent.client.wait_command(&started.id).await.unwrap();
    assert_eq!(info.signal, Some(9));
    // The backgrounded sleeps were in the group too: the output stream ends promptly.
    let t = Instant::now();
    let _: Vec<_> = agent
        .client
        .output(&started.id, 0, true)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[tokio::test]
async fn keeps_binary_and_non_utf8_output_exact() {
    let agent = Agent::start().await;
    let (info, lines) = agent
        .run(argv(&["/bin/sh", "-c", r"printf '\377\376\000abc\n'"]))
        .await;
    assert_eq!(info.exit_code, Some(0));
    assert!(lines.iter().any(|l| l.data_base64.is_some()));
    assert_eq!(split(&lines).0, b"\xff\xfe\x00abc\n");

    // Multi-byte characters across read boundaries are never split: every line stays text.
    let (_, lines) = agent
        .run(argv(&["/bin/sh", "-c", "yes 'é€😀' | head -c 900000"]))
        .await;
    assert!(lines.len() > 1);
    assert!(
        lines.iter().all(|l| l.data.is_some()),
        "a chunk was not valid UTF-8"
    );
    let out = split(&lines).0;
    let expected: Vec<u8> = "é€😀\n".bytes().cycle().take(900000).collect();
    // `head -c` may end inside the last character; that tail alone goes as base64.
    assert_eq!(out.len(), expected.len());
    assert_eq!(out, expected);
}

#[tokio::test]
async fn streams_stdin_and_closes_it() {
    let agent = Agent::start().await;
    let mut start = argv(&["/bin/sh", "-c", "wc -c; echo done"]);
    start.stdin = true;
    let started = agent.client.start_command(&start).await.unwrap();
    let chunk = vec![b'x'; 1 << 20];
    agent
        .client
        .write_stdin(&started.id, body_from_bytes(chunk.clone()), false)
        .await
        .unwrap();
    agent
        .client
        .write_stdin(&started.id, body_from_bytes(chunk), true)
        .await
        .unwrap();
    let (info, lines) = wait_then_read(&agent.client, &started.id).await;
    assert_eq!(info.exit_code, Some(0));
    assert_eq!(
        String::from_utf8(split(&lines).0)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["2097152", "done"]
    );
    // Stdin is closed now.
    let err = agent
        .client
        .write_stdin(&started.id, body_from_bytes("x"), false)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(codes::COMMAND_FINISHED));

    // Without `stdin: true`, stdin is /dev/null.
    let (_, out, _) = agent.sh("cat; echo eof").await;
    assert_eq!(out, "eof\n");
}

#[tokio::test]
async fn runs_on_a_pty_with_resize() {
    let agent = Agent::start().await;
    let start = StartCommand {
        argv: [
            "/bin/sh",
            "-c",
            "tty; stty size; read x; stty size; echo got $x; exit 4",
        ]
        .map(String::from)
        .to_vec(),
        pty: Some(PtySize { rows: 24, cols: 80 }),
        ..Default::default()
    };
    let started = agent.client.start_command(&start).await.unwrap();
    assert!(started.pty);
    let mut output = agent.client.output(&started.id, 0, true).await.unwrap();
    let mut seen = String::new();
    while !seen.contains("24 80") {
        let line = output
            .try_next()
            .await
            .unwrap()
            .expect("output ended early");
        assert_eq!(line.stream, Stream::Stdout);
        seen.push_str(&String::from_utf8_lossy(&line.bytes()));
    }
    assert!(seen.starts_with("/dev/pts/"), "{seen}");
    agent
        .client
        .resize(
            &started.id,
            PtySize {
                rows: 40,
                cols: 100,
            },
        )
        .await
        .unwrap();
    agent
        .client
        .write_stdin(&started.id, body_from_bytes("hi\n"), false)
        .await
        .unwrap();
    while let Some(line) = output.try_next().await.unwrap() {
        seen.push_str(&String::from_utf8_lossy(&line.bytes()));
    }
    assert!(seen.contains("40 100"), "{seen}");
    assert!(seen.contains("got hi"), "{seen}");
    let info = agent.client.wait_command(&started.id).await.unwrap();
    assert_eq!(info.exit_code, Some(4));
    // Resizing a command without a terminal is refused.
    let plain = agent.client.start_command(&argv(&["true"])).await.unwrap();
    let err = agent
        .client
        .resize(&plain.id, PtySize { rows: 1, cols: 1 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(codes::BAD_REQUEST));
}

#[tokio::test]
async fn keeps_detached_output_for_later_clients() {
    let agent = Agent::start().await;
    let started = agent
        .client
        .start_command(&argv(&[
            "/bin/sh",
            "-c",
            "echo a; sleep 0.3; echo b; sleep 0.3; echo c",
        ]))
        .await
        .unwrap();
    // A second connection follows it live while it runs.
    let other = agent.connect().await;
    let live: Vec<_> = other
        .output(&started.id, 0, true)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(split(&live).0, b"a\nb\nc\n");
    drop(other);

    // A third one, after it ended, reads it again from a line.
    let later = agent.connect().await;
    let all: Vec<_> = later
        .output(&started.id, 0, false)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all, live);
    let from_1: Vec<_> = later
        .output(&started.id, 1, false)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(from_1, live[1..]);
    let past_end: Vec<_> = later
        .output(&started.id, 99, true)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(past_end.is_empty());

    let listed = later.list_commands().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, started.id);
    assert_eq!(listed[0].status, CommandStatus::Exited);
}

#[tokio::test]
async fn lists_commands_in_start_order() {
    let agent = Agent::start().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            agent
                .client
                .start_command(&argv(&["true"]))
                .await
                .unwrap()
                .id,
        );
    }
    let listed: Vec<_> = agent
        .client
        .list_commands()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(listed, ids);
}

#[tokio::test]
async fn output_ends_even_when_a_background_process_keeps_the_pipe() {
    let agent = Agent::start().await;
    let t = Instant::now();
    let (info, out, _) = agent.sh("sleep 30 & echo started").await;
    assert_eq!(info.exit_code, Some(0));
    assert_eq!(out, "started\n");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// A background process that keeps the pipe open and writes more often than the drain grace
/// holds a wait only for the agent's drain limit (5 s after the exit), not for as long as it
/// writes. Without the limit this wait never answered.
#[tokio::test]
async fn a_wait_answers_while_a_background_process_keeps_writing() {
    let agent = Agent::start().await;
    let script = "(while :; do echo tick; sleep 0.3; done) & echo started";
    let started = agent
        .client
        .start_command(&argv(&["/bin/sh", "-c", script]))
        .await
        .unwrap();
    let t = Instant::now();
    let (info, lines) = tokio::time::timeout(
        Duration::from_secs(60),
        wait_then_read(&agent.client, &started.id),
    )
    .await
    .expect("the wait answers while the background process still writes");
    assert_eq!(info.exit_code, Some(0));
    let out = String::from_utf8(split(&lines).0).unwrap();
    assert!(out.contains("started\n"), "{out}");
    // Reading went on after the exit (the ticks came) and then stopped.
    assert!(out.matches("tick").count() >= 5, "{out}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Programs are found through the command's own PATH, and a file without `#!` runs with the
/// shell, as `execvp` would run them; the command leads a session of its own.
#[tokio::test]
async fn programs_are_found_through_the_commands_own_path() {
    let agent = Agent::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("my-tool");
    std::fs::write(&tool, "echo found-in-path\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut start = argv(&["my-tool"]);
    start.env.insert(
        "PATH".into(),
        format!("/nonexistent:{}:/usr/bin:/bin", dir.path().display()),
    );
    let (info, lines) = agent.run(start).await;
    assert_eq!(info.exit_code, Some(0));
    assert_eq!(split(&lines).0, b"found-in-path\n");

    let (info, out, _) = agent
        .sh("test \"$(cut -d' ' -f6 /proc/$$/stat)\" = $$ && echo leader")
        .await;
    assert_eq!((info.exit_code, out.as_str()), (Some(0), "leader\n"));

    let mut missing = argv(&["my-tool"]);
    missing
        .env
        .insert("PATH".into(), "/nonexistent:/usr/bin".into());
    assert_eq!(
        code(agent.client.start_command(&missing).await).as_deref(),
        Some(codes::EXEC_FAILED)
    );
}

/// A wait that reports the exit answers only once the output is complete: a command that
/// writes and exits at once, waited for and then read (not followed), shows all it wrote.
/// Many at a time, so that the agent is busy when the commands exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waited_command_has_all_its_output() {
    let agent = Agent::start().await;
    let line = "x".repeat(3000);
    for round in 0..10 {
        let runs = (0..40).map(|i| {
            let client = agent.client.clone();
            let line = line.clone();
            async move {
                let script = format!("echo {round}-{i}-{line}; echo {i} >&2");
                let started = client
                    .start_command(&argv(&["/bin/sh", "-c", &script]))
                    .await
                    .unwrap();
                let (info, lines) = wait_then_read(&client, &started.id).await;
                assert_eq!(info.exit_code, Some(0));
                let (out, err) = split(&lines);
                let (want_out, want_err) = (format!("{round}-{i}-{line}\n"), format!("{i}\n"));
                assert!(
                    out == want_out.as_bytes() && err == want_err.as_bytes(),
                    "{}: {} of {} bytes on stdout, {} of {} on stderr",
                    started.id,
                    out.len(),
                    want_out.len(),
                    err.len(),
                    want_err.len()
                );
            }
        });
        futures::future::join_all(runs).await;
    }
    // A background process that keeps the pipe open holds the wait only for the drain grace.
    let started = agent
        .client
        .start_command(&argv(&["/bin/sh", "-c", "sleep 30 & echo started"]))
        .await
        .unwrap();
    let t = Instant::now();
    let (info, lines) = wait_then_read(&agent.client, &started.id).await;
    assert_eq!(info.exit_code, Some(0));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(split(&lines).0, b"started\n");
}

#[tokio::test]
async fn a_client_id_starts_a_command_once_and_is_reported_back() {
    let agent = Agent::start().await;
    let marker = agent.path("runs");
    let mut start = argv(&["/bin/sh", "-c", &format!("echo x >> {marker}")]);
    start.client_id = Some("cmd_daemon1".into());
    // Concurrent and repeated starts with one client id: one process, one agent id.
    let starts = (0..8).map(|_| agent.client.start_command(&start));
    let infos: Vec<_> = futures::future::try_join_all(starts).await.unwrap();
    assert!(infos.iter().all(|i| i.id == infos[0].id), "{infos:?}");
    assert_eq!(infos[0].client_id.as_deref(), Some("cmd_daemon1"));
    agent.client.wait_command(&infos[0].id).await.unwrap();
    let again = agent.client.start_command(&start).await.unwrap();
    assert_eq!(again.id, infos[0].id);
    assert_eq!(again.status, CommandStatus::Exited);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x\n");
    let listed = agent.client.list_commands().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|c| c.client_id.as_deref() == Some("cmd_daemon1"))
            .count(),
        1
    );

    // Without a client id every start is a new command; a bad one is refused.
    start.client_id = None;
    let (a, b) = (
        agent.client.start_command(&start).await.unwrap(),
        agent.client.start_command(&start).await.unwrap(),
    );
    assert_ne!(a.id, b.id);
    assert!(a.client_id.is_none());
    start.client_id = Some("x".repeat(belljar_agent_proto::MAX_CLIENT_ID_LEN + 1));
    let err = agent.client.start_command(&start).await.unwrap_err();
    assert_eq!(err.code(), Some(codes::BAD_REQUEST));
}
