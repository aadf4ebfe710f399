//! A sandbox's usage (`GET /v1/sandboxes/{id}/usage`, `belljar usage`) on the namespace
//! backend, through a real daemon: memory the sandbox holds shows (and goes when freed, while
//! the peak stays), CPU time grows with a loop, processes are counted as they come and go, a
//! paused sandbox is measured without being woken, and a stopped or unknown one has no usage.
//! Every wait polls with a deadline.
//!
//! Needs root and the `base` image (as every e2e test).

use std::time::Duration;

use belljar_api::{CreateSandbox, RunCommand, SandboxStatus, SandboxUsage};
use belljar_client::Client;
use belljar_e2e::{Daemon, eventually, sh_ok, stderr, stdout};

const MIB: u64 = 1 << 20;

async fn usage(c: &Client, id: &str) -> SandboxUsage {
    c.sandbox_usage(id)
        .await
        .unwrap_or_else(|e| panic!("usage of {id}: {e} ({})", e.code()))
}

/// Polls the usage until `ok` holds for it; returns that reading.
async fn usage_until(
    c: &Client,
    id: &str,
    what: &str,
    ok: impl Fn(&SandboxUsage) -> bool,
) -> SandboxUsage {
    eventually(Duration::from_secs(30), what, || async {
        let u = usage(c, id).await;
        ok(&u).then_some(u)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_follows_memory_cpu_and_processes() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d
        .create(
            &c,
            CreateSandbox {
                memory_mib: Some(512),
                ..Default::default()
            },
        )
        .await;
    let start = usage(&c, &a.id).await;
    let (Some(memory), Some(cpu), Some(pids)) = (start.memory_bytes, start.cpu_usec, start.pids)
    else {
        panic!("the namespace backend measures memory, CPU and processes: {start:?}");
    };
    assert!(pids >= 1 && cpu > 0, "{start:?}");
    assert!(start.measured_at > a.created_at, "{start:?}");
    if a.limits.memory.enforced {
        assert_eq!(start.memory_limit_bytes, Some(512 * MIB), "{start:?}");
    }
    assert_eq!(start.oom_kills, Some(0), "{start:?}");

    // 64 MiB in a tmpfs file is the sandbox's memory as long as the file is there.
    sh_ok(
        &c,
        &a.id,
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>/dev/null",
    )
    .await;
    let filled = usage_until(&c, &a.id, "64 MiB more memory", |u| {
        u.memory_bytes.unwrap() >= memory + 60 * MIB
    })
    .await;
    assert!(filled.memory_bytes.unwrap() >= 60 * MIB, "{filled:?}");
    assert!(
        filled.memory_peak_bytes.unwrap() >= filled.memory_bytes.unwrap(),
        "{filled:?}"
    );
    sh_ok(&c, &a.id, "rm /dev/shm/fill").await;
    let freed = usage_until(&c, &a.id, "the 64 MiB freed", |u| {
        u.memory_bytes.unwrap() + 48 * MIB <= filled.memory_bytes.unwrap()
    })
    .await;
    assert!(
        freed.memory_peak_bytes.unwrap() >= filled.memory_bytes.unwrap(),
        "the peak stays: {freed:?}"
    );

    // A shell loop's CPU time is the sandbox's (at least 50 ms of it, however loaded the host).
    let before = usage(&c, &a.id).await.cpu_usec.unwrap();
    sh_ok(
        &c,
        &a.id,
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
    )
    .await;
    let after = usage(&c, &a.id).await;
    assert!(
        after.cpu_usec.unwrap() >= before + 50_000,
        "{before} → {after:?}"
    );
    assert!(after.measured_at >= freed.measured_at);

    // Three sleeps and their shell are counted while they run, and not once killed.
    let idle = usage(&c, &a.id).await.pids.unwrap();
    let sleeps = c
        .run_command(
            &a.id,
            &RunCommand {
                argv: ["sh", "-c", "sleep 1000 & sleep 1000 & sleep 1000 & wait"]
                    .map(String::from)
                    .into(),
                detached: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let busy = usage_until(&c, &a.id, "four more processes", |u| {
        u.pids.unwrap() >= idle + 4
    })
    .await
    .pids
    .unwrap();
    c.kill_command(&a.id, &sleeps.id, Some("KILL"))
        .await
        .unwrap();
    usage_until(&c, &a.id, "the sleeps gone", |u| {
        u.pids.unwrap() + 4 <= busy
    })
    .await;

    // The CLI prints the same figures, for people and as JSON.
    let out = d.cli(["usage", &a.id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("memory:") && text.contains("processes:"),
        "{text}"
    );
    let out = d.cli(["usage", &a.id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: SandboxUsage = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json.memory_bytes.is_some() && json.cpu_usec.unwrap() >= after.cpu_usec.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_is_measured_as_it_stands() {
    let d = Daemon::start();
    let c = d.unix();
    // With auto-resume (the default), so that only the route itself could wake it. The
    // loop is niced: it must not take the host's CPU from anything else.
    let a = d.create(&c, CreateSandbox::default()).await;
    c.run_command(
        &a.id,
        &RunCommand {
            argv: ["nice", "-n", "19", "sh", "-c", "while :; do :; done"]
                .map(String::from)
                .into(),
            detached: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let spinning = usage(&c, &a.id).await.cpu_usec.unwrap();
    usage_until(&c, &a.id, "the loop to use CPU", |u| {
        u.cpu_usec.unwrap() > spinning + 20_000
    })
    .await;

    assert_eq!(
        c.pause_sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Paused
    );
    let first = usage(&c, &a.id).await;
    assert!(
        first.memory_bytes.is_some() && first.pids.unwrap() >= 2,
        "{first:?}"
    );
    // Frozen, the busy loop uses no CPU at all between two readings.
    let second = usage(&c, &a.id).await;
    assert_eq!(first.cpu_usec, second.cpu_usec, "{first:?} {second:?}");
    assert!(second.measured_at >= first.measured_at);
    assert_eq!(
        c.sandbox(&a.id).await.unwrap().status,
        SandboxStatus::Paused
    );

    // Resumed, the loop runs and is counted again.
    c.resume_sandbox(&a.id).await.unwrap();
    usage_until(&c, &a.id, "the loop to run on", |u| {
        u.cpu_usec > second.cpu_usec
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_or_unknown_sandbox_has_no_usage() {
    let d = Daemon::start();
    let c = d.unix();
    let a = d.create(&c, CreateSandbox::default()).await;
    c.stop_sandbox(&a.id).await.unwrap();
    let err = c.sandbox_usage(&a.id).await.unwrap_err();
    assert_eq!(
        (err.status(), err.code()),
        (Some(409), "sandbox_not_running"),
        "{err}"
    );
    assert!(err.to_string().contains("stopped"), "{err}");
    let out = d.cli(["usage", &a.id]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("sandbox_not_running"),
        "{}",
        stderr(&out)
    );

    let err = c.sandbox_usage("sbx_nosuchsandbox").await.unwrap_err();
    assert_eq!(
        (err.status(), err.code()),
        (Some(404), "not_found"),
        "{err}"
    );
}
