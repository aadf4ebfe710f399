//! The start's wait for the agent: a handshake that never answers, a sandbox that ended.

use super::*;
use crate::sandbox::backend::AgentAddress;

/// A VMM that accepts the hybrid vsock connection but whose guest never answers used to
/// hold the create forever: the deadline was checked only between attempts.
#[tokio::test]
async fn a_handshake_that_never_answers_ends_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vsock.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            kept.push(conn); // read nothing, answer nothing, close nothing
        }
    });
    let addr = AgentAddress::HybridVsock { socket, port: 1024 };
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        wait_for_agent(&addr, Duration::from_millis(300), || None),
    )
    .await
    .expect("wait_for_agent outlived its deadline");
    assert!(
        matches!(outcome, Err(SandboxError::AgentTimeout(_))),
        "{outcome:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    held.abort();
}

/// A sandbox whose process is gone fails its create at once, with its last output,
/// instead of after the whole readiness timeout.
#[tokio::test]
async fn an_ended_sandbox_fails_at_once_with_its_last_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("console.log"),
        "booting\nKernel panic - not syncing: Attempted to kill init!\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("vmm.log"),
        "WARN guest triple fault (KVM_EXIT_SHUTDOWN)\nINFO guest reset\n",
    )
    .unwrap();
    let addr = AgentAddress::HybridVsock {
        socket: dir.path().join("vsock.sock"), // nothing listens
        port: 1024,
    };
    let started = Instant::now();
    let outcome = wait_for_agent(&addr, Duration::from_secs(60), || {
        Some(BackendError::Ended {
            output: output_tail(dir.path()),
        })
    })
    .await;
    let Err(SandboxError::Backend(e @ BackendError::Ended { .. })) = outcome else {
        panic!("{outcome:?}")
    };
    let reason = e.to_string();
    assert!(
        reason.starts_with(
            "The sandbox ended before its agent answered; its last output:\nbooting\n"
        ),
        "{reason}"
    );
    assert!(reason.contains("Attempted to kill init"), "{reason}");
    // The VMM's word on why the VM ended comes after the console's.
    assert!(
        reason.ends_with("vmm.log:\nWARN guest triple fault (KVM_EXIT_SHUTDOWN)\nINFO guest reset"),
        "{reason}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}
