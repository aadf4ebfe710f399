//! Commands against a real daemon where it is easy to lose them: a `kill -9` of the daemon
//! while many commands are being started (every command that ran must have a record with its
//! output, and retries with the same idempotency keys must run each command exactly once), and
//! output over the per-command limit (the truncation must reach the API and the CLI).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use belljar_api::{BackendChoice, Command, CommandStatus, CreateSandbox, RunCommand};
use belljar_client::{Client, ClientError, log_bytes};
use belljar_e2e::{Daemon, run, stderr, stdout};

/// Commands started at once in the kill test.
const IN_FLIGHT: usize = 120;

/// `POST .../commands` with an idempotency key.
async fn run_keyed(
    c: &Client,
    sandbox: &str,
    key: &str,
    req: &RunCommand,
) -> Result<Command, ClientError> {
    c.run_command_once(sandbox, req, key).await
}

/// A detached command that appends its number to `/workspace/ran` and prints it.
fn appender(i: usize) -> RunCommand {
    RunCommand {
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!("echo {i} >> /workspace/ran; echo out-{i}"),
        ],
        detached: true,
        ..Default::default()
    }
}

async fn logs(c: &Client, sandbox: &str, cmd: &str) -> Vec<u8> {
    let mut lines = c.command_logs(sandbox, cmd, true).await.unwrap();
    let mut out = Vec::new();
    while let Some(l) = lines.next().await.unwrap() {
        out.extend(log_bytes(&l));
    }
    out
}

async fn wait(c: &Client, sandbox: &str, cmd: &str) -> Command {
    c.wait_command(sandbox, cmd).await.unwrap()
}

/// How many times each command number was appended to `/workspace/ran`.
async fn ran(c: &Client, sandbox: &str) -> HashMap<usize, usize> {
    let body = c.read_file_bytes(sandbox, "/workspace/ran").await.unwrap();
    let mut counts = HashMap::new();
    for line in String::from_utf8_lossy(&body).lines() {
        *counts
            .entry(line.parse().expect("a command number"))
            .or_default() += 1;
    }
    counts
}

/// The command number in an appender's argv.
fn number(cmd: &Command) -> usize {
    let script = &cmd.argv[2];
    script["echo ".len()..script.find(" >>").unwrap()]
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_while_commands_start_leaves_a_record_for_every_command_that_ran() {
    let d = Daemon::start();
    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;

    // Many starts in flight; the daemon dies once a few have been answered.
    let answered = Arc::new(AtomicUsize::new(0));
    let (first_answers, mut enough) = tokio::sync::mpsc::channel::<()>(IN_FLIGHT);
    let mut tasks = Vec::new();
    for i in 0..IN_FLIGHT {
        let (c, id, answered, tx) = (
            c.clone(),
            s.id.clone(),
            answered.clone(),
            first_answers.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let r = run_keyed(&c, &id, &format!("k-{i}"), &appender(i)).await;
            if r.is_ok() {
                answered.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(()).await;
            }
            r.ok()
        }));
    }
    drop(first_answers);
    for _ in 0..5 {
        tokio::time::timeout(Duration::from_secs(60), enough.recv())
            .await
            .expect("the first commands are answered")
            .expect("some commands start");
    }
    d.kill9();
    let before: Vec<Option<Command>> = futures_join(tasks).await;
    let answered_before = before.iter().flatten().count();
    assert!(
        answered_before < IN_FLIGHT,
        "every command was answered before the kill: the test kills too late"
    );

    d.restart();
    let c = d.unix();
    let list = c.commands(&s.id).await.unwrap();
    let mut by_number: BTreeMap<usize, Command> = BTreeMap::new();
    for cmd in list.commands {
        assert_ne!(
            cmd.status,
            CommandStatus::Pending,
            "unresolved after adoption: {cmd:?}"
        );
        assert!(
            by_number.insert(number(&cmd), cmd).is_none(),
            "two records for one command"
        );
    }
    // Every command answered before the kill has its record.
    for cmd in before.iter().flatten() {
        assert!(
            by_number.contains_key(&number(cmd)),
            "record of {} is missing",
            cmd.id
        );
    }
    // Every command that ran has a record, ends `exited` and has its output; every record
    // that is `lost` names why and never ran.
    let mut exited = 0;
    for (i, cmd) in &by_number {
        let done = wait(&c, &s.id, &cmd.id).await;
        match done.status {
            CommandStatus::Exited => {
                exited += 1;
                assert_eq!(done.exit_code, Some(0), "{done:?}");
                assert_eq!(
                    logs(&c, &s.id, &cmd.id).await,
                    format!("out-{i}\n").into_bytes()
                );
            }
            CommandStatus::Lost => {
                assert!(done.status_reason.is_some(), "{done:?}");
            }
            other => panic!("{} ended {other:?}", cmd.id),
        }
    }
    let counts = ran(&c, &s.id).await;
    eprintln!(
        "{IN_FLIGHT} starts, {answered_before} answered before the kill: {} records after it \
         ({exited} exited, {} lost), {} commands ran",
        by_number.len(),
        by_number.len() - exited,
        counts.len()
    );
    for (i, n) in &counts {
        assert_eq!(*n, 1, "command {i} ran {n} times");
        let cmd = by_number
            .get(i)
            .unwrap_or_else(|| panic!("command {i} ran but has no record\nlog:\n{}", d.log()));
        let done = wait(&c, &s.id, &cmd.id).await;
        assert_eq!(
            done.status,
            CommandStatus::Exited,
            "command {i} ran but is recorded {done:?}\nlog:\n{}",
            d.log()
        );
    }
    assert_eq!(
        counts.len(),
        exited,
        "an exited record whose command did not run"
    );

    // Retrying every request with its key: a command that ran is returned, not run again; one
    // that was lost before it started, or never recorded, runs now. Each runs exactly once.
    for i in 0..IN_FLIGHT {
        let again = run_keyed(&c, &s.id, &format!("k-{i}"), &appender(i))
            .await
            .unwrap();
        if let Some(cmd) = by_number.get(&i) {
            assert_eq!(again.id, cmd.id, "the retry of {i} has another id");
        }
        let done = wait(&c, &s.id, &again.id).await;
        assert_eq!(done.status, CommandStatus::Exited, "{done:?}");
        assert_eq!(
            logs(&c, &s.id, &again.id).await,
            format!("out-{i}\n").into_bytes()
        );
    }
    let counts = ran(&c, &s.id).await;
    for i in 0..IN_FLIGHT {
        assert_eq!(
            counts.get(&i),
            Some(&1),
            "command {i} did not run exactly once"
        );
    }
    // The same key with other arguments is refused rather than answered with a stranger.
    let err = run_keyed(&c, &s.id, "k-0", &appender(IN_FLIGHT + 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "conflict", "{err}");
}

async fn futures_join<T: Send + 'static>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn output_over_the_limit_is_reported_by_the_api_and_the_cli() {
    let d = Daemon::start_with_env(&[("BELLJAR_COMMAND_OUTPUT_LIMIT", "4096")]);
    let c = d.unix();
    // A sandbox created with an idempotency key; the retry returns it rather than a second.
    let create = |c: Client| async move {
        let req = CreateSandbox {
            backend: Some(BackendChoice::Namespace),
            ..Default::default()
        };
        c.create_sandbox_once(&req, "create-once").await.unwrap()
    };
    let s = create(c.clone()).await;
    assert_eq!(create(c.clone()).await.id, s.id);
    let all = c.list_sandboxes(&Default::default()).await.unwrap();
    assert_eq!(all.sandboxes.len(), 1);
    let print = |n: usize| RunCommand {
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!("head -c {n} /dev/zero | tr '\\0' x"),
        ],
        ..Default::default()
    };

    let big = c.run_command(&s.id, &print(10_000)).await.unwrap();
    assert_eq!(big.status, CommandStatus::Exited);
    assert_eq!(big.output_truncated_bytes, 10_000 - 4096);
    assert_eq!(logs(&c, &s.id, &big.id).await, vec![b'x'; 4096]);
    let listed = c.commands(&s.id).await.unwrap();
    assert_eq!(listed.commands[0].output_truncated_bytes, 10_000 - 4096);

    let small = c.run_command(&s.id, &print(100)).await.unwrap();
    assert_eq!(small.output_truncated_bytes, 0);

    let out = d.cli([
        "exec",
        &s.id,
        "--",
        "sh",
        "-c",
        "head -c 5000 /dev/zero | tr '\\0' y",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "y".repeat(4096));
    let warning = stderr(&out);
    assert_eq!(warning.lines().count(), 1, "{warning}");
    assert!(
        warning.contains("output truncated") && warning.contains("904 bytes"),
        "{warning}"
    );

    let out = d.cli(["exec", &s.id, "--", "echo", "fits"]);
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_with_one_key_run_the_command_once_and_all_wait_for_it() {
    let d = Daemon::start();
    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;
    let req = RunCommand {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "echo x >> /workspace/once; sleep 0.5; echo done".into(),
        ],
        ..Default::default()
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, id, req) = (c.clone(), s.id.clone(), req.clone());
            tokio::spawn(async move { run_keyed(&c, &id, "together", &req).await.unwrap() })
        })
        .collect();
    let answers = futures_join(tasks).await;
    for a in &answers {
        assert_eq!(a.id, answers[0].id, "two commands for one key");
        // Every request waited for the end, not only the one that started it.
        assert_eq!(a.status, CommandStatus::Exited, "{a:?}");
    }
    assert_eq!(logs(&c, &s.id, &answers[0].id).await, b"done\n");
    let once = c.read_file_bytes(&s.id, "/workspace/once").await.unwrap();
    assert_eq!(&once[..], b"x\n");
    // A key that is not visible ASCII is refused.
    let err = run_keyed(&c, &s.id, "two words", &req).await.unwrap_err();
    assert_eq!(err.code(), "bad_request", "{err}");
}

/// A command that writes and exits at once has all its output in its log as soon as a wait
/// reports its exit, whether the run waited or a detached command was waited for; many at a
/// time, so that the agent and the daemon are busy when the commands exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_waited_command_has_all_its_output() {
    let d = Daemon::start();
    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;
    let line = "y".repeat(3000);
    for round in 0..5 {
        let runs = (0..40).map(|i| {
            let (c, id, line) = (c.clone(), s.id.clone(), line.clone());
            tokio::spawn(async move {
                let req = RunCommand {
                    argv: vec![
                        "sh".into(),
                        "-c".into(),
                        format!("echo {round}-{i}-{line}; echo {i} >&2"),
                    ],
                    detached: i % 2 == 0,
                    ..Default::default()
                };
                let cmd = c.run_command(&id, &req).await.unwrap();
                let done = if req.detached {
                    wait(&c, &id, &cmd.id).await
                } else {
                    cmd
                };
                assert_eq!(done.exit_code, Some(0), "{done:?}");
                let mut lines = c.command_logs(&id, &done.id, false).await.unwrap();
                let (mut out, mut err) = (Vec::new(), Vec::new());
                while let Some(l) = lines.next().await.unwrap() {
                    match l.stream {
                        belljar_api::Stream::Stdout => out.extend(log_bytes(&l)),
                        belljar_api::Stream::Stderr => err.extend(log_bytes(&l)),
                    }
                }
                let (want_out, want_err) = (format!("{round}-{i}-{line}\n"), format!("{i}\n"));
                assert!(
                    out == want_out.as_bytes() && err == want_err.as_bytes(),
                    "{}: {} of {} bytes on stdout, {} of {} on stderr",
                    done.id,
                    out.len(),
                    want_out.len(),
                    err.len(),
                    want_err.len()
                );
            })
        });
        futures_join(runs.collect()).await;
    }
}

/// The agent keeps `/etc/passwd` and `/etc/group` between starts; a change made in the
/// sandbox must still reach the next command.
#[tokio::test(flavor = "multi_thread")]
async fn users_and_groups_changed_in_the_sandbox_reach_the_next_command() {
    let d = Daemon::start();
    let c = d.unix();
    let s = d.create(&c, CreateSandbox::default()).await;
    let show = ["sh", "-c", "id -Gn; echo $HOME"];
    let (code, before) = run(&c, &s.id, &show, false).await;
    assert_eq!(code, 0, "{before}");
    assert!(!before.contains("sandboxers") && !before.ends_with("/srv/home\n"));
    // As root: a group with the user in it (appended), and the user's home moved (`sed -i`
    // writes a new file and renames it over the old one).
    let change = r"echo sandboxers:x:4242:belljar >> /etc/group && mkdir -p /srv/home &&
        sed -i 's#^\(belljar:[^:]*:[^:]*:[^:]*:[^:]*:\)[^:]*#\1/srv/home#' /etc/passwd";
    let (code, out) = run(&c, &s.id, &["sh", "-c", change], true).await;
    assert_eq!(code, 0, "{out}");
    let (code, after) = run(&c, &s.id, &show, false).await;
    assert_eq!(code, 0, "{after}");
    assert!(after.contains("sandboxers"), "{after}");
    assert!(after.ends_with("/srv/home\n"), "{after}");
}
