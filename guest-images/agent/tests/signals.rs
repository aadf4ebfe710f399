//! Commands start with every signal at its default disposition and none blocked, whatever
//! the agent itself was given: dispositions set to SIG_IGN and the signal mask both survive
//! `fork` and `execve`, so without a reset a command would ignore what its parent's parent
//! ignored (a daemon started under `nohup` ignores SIGHUP), and `kill -INT`, `-TERM` or a
//! broken pipe would not end it.

mod common;

use std::time::Duration;

use belljar_agent_proto::CommandInfo;
use common::{Agent, argv};

/// Long enough for a loaded machine; the commands here end at once when the signal acts.
const DEADLINE: Duration = Duration::from_secs(30);

/// The first real-time signal the kernel knows (glibc keeps 32 and 33 for itself).
const FIRST_RT: i32 = 34;

/// What the agent ignores: the terminal signals, SIGPIPE (Rust ignores it for itself too),
/// a job-control one, user and real-time signals (not glibc's own 32 and 33: its threads
/// install their handlers for those).
const IGNORED: &[i32] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGPIPE,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGTSTP,
    FIRST_RT,
    64,
];

/// What the agent blocks.
const BLOCKED: &[i32] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGUSR2,
    libc::SIGALRM,
    FIRST_RT + 1,
];

async fn agent() -> Agent {
    Agent::start_with_inherited_signals(IGNORED, BLOCKED).await
}

/// A `/proc/<pid>/status` signal set line (`SigIgn:`), as a bit set (bit n-1 is signal n).
fn mask(status: &str, name: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {status}"));
    u64::from_str_radix(line.trim(), 16).unwrap()
}

async fn wait(agent: &Agent, id: &str) -> CommandInfo {
    tokio::time::timeout(DEADLINE, agent.client.wait_command(id))
        .await
        .unwrap_or_else(|_| panic!("command {id} did not end: the signal did not act on it"))
        .unwrap()
}

#[tokio::test]
async fn the_harness_really_hands_the_agent_ignored_and_blocked_signals() {
    // The control: without it the other tests would pass against an agent that never had
    // anything ignored or blocked.
    let agent = agent().await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    let ignored = mask(&status, "SigIgn:");
    for &sig in IGNORED {
        assert_ne!(ignored & (1 << (sig - 1)), 0, "signal {sig}: {status}");
    }
    let blocked = mask(&status, "SigBlk:");
    for &sig in BLOCKED {
        assert_ne!(blocked & (1 << (sig - 1)), 0, "signal {sig}: {status}");
    }
}

#[tokio::test]
async fn a_command_has_nothing_ignored_or_blocked_and_no_traps() {
    let agent = agent().await;
    let (info, out, err) = agent.sh("grep -E '^Sig(Blk|Ign):' /proc/self/status").await;
    assert_eq!(info.exit_code, Some(0), "{out} {err}");
    assert_eq!(mask(&out, "SigIgn:"), 0, "{out}");
    assert_eq!(mask(&out, "SigBlk:"), 0, "{out}");
    // bash lists the signals it started with ignored in `trap -p` (as `trap -- '' SIGINT`).
    let (info, lines) = agent
        .run(argv(&["bash", "-c", "echo traps:; trap -p; echo end"]))
        .await;
    let (out, err) = common::split(&lines);
    let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    assert_eq!(info.exit_code, Some(0), "{out} {err}");
    assert_eq!(out, "traps:\nend\n");
}

#[tokio::test]
async fn int_term_and_pipe_sent_through_the_agent_end_a_command() {
    let agent = agent().await;
    for (name, number) in [("INT", 2), ("TERM", 15), ("PIPE", 13), ("HUP", 1)] {
        let started = agent
            .client
            .start_command(&argv(&["sleep", "1000"]))
            .await
            .unwrap();
        agent.client.signal(&started.id, name).await.unwrap();
        let info = wait(&agent, &started.id).await;
        assert_eq!(
            (info.exit_code, info.signal),
            (None, Some(number)),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_command_killed_from_inside_and_a_writer_to_a_closed_pipe_die_of_the_signal() {
    let agent = agent().await;
    for sig in ["INT", "TERM", "PIPE", "USR1"] {
        let (info, out, err) = agent
            .sh(&format!("kill -{sig} $$; echo survived {sig}"))
            .await;
        assert!(info.signal.is_some(), "{sig}: {info:?} {out} {err}");
        assert!(!out.contains("survived"), "{sig}: {out}");
    }
    // `yes` writes until its reader is gone: SIGPIPE ends it (ignored, it would see EPIPE and
    // exit 1 with an error), and the shell reports 128 + 13 for it.
    let (info, out, err) = agent.sh("(yes; echo $? >&2) | head -n 1 >/dev/null").await;
    assert_eq!(info.exit_code, Some(0), "{out} {err}");
    assert_eq!(err, "141\n", "{out} {err}");
}
