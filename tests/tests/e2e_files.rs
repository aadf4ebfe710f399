//! End to end through the HTTP API on the namespace backend: what a hostile or careless
//! sandbox user can do to the files API and to the agent behind it — FIFOs, devices and
//! `/proc` files, busy mounts, moving `/`, directories of 200 000 entries, and filling
//! RAM-backed `/tmp` or the whole memory limit — leaves the daemon bounded and the sandbox
//! `running` with a working agent.

use std::path::Path;
use std::time::Duration;

use belljar_api::{Command, CreateSandbox, RunCommand, SandboxStatus};
use belljar_client::routes;
use belljar_client::{self as client, Client, log_bytes};
use belljar_e2e::Daemon;
use http::Method;
use http_body_util::BodyExt;
use procfs_core::FromRead;
use procfs_core::process::Status;

/// Long enough for any answer here; a hang (the FIFO defect) fails instead of blocking CI.
const DEADLINE: Duration = Duration::from_secs(60);

async fn sh(c: &Client, id: &str, script: &str) -> Command {
    let req = RunCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        sudo: true,
        ..Default::default()
    };
    c.run_command(id, &req).await.expect("run command")
}

/// Stdout and stderr of a finished command.
async fn output(c: &Client, id: &str, cmd: &str) -> (String, String) {
    let mut lines = c.command_logs(id, cmd, false).await.expect("logs");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(line) = lines.next().await.unwrap() {
        match line.stream {
            belljar_api::Stream::Stdout => out.extend(log_bytes(&line)),
            belljar_api::Stream::Stderr => err.extend(log_bytes(&line)),
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// Status and error code of a request, within [`DEADLINE`].
async fn status_of(c: &Client, method: Method, path: &str, body: Option<&str>) -> (u16, String) {
    let body = match body {
        Some(b) => client::full(b.to_owned()),
        None => client::empty(),
    };
    let ct = body_type(method.clone());
    let send = c.request(method, path, body, ct);
    let resp = match tokio::time::timeout(DEADLINE, send).await.expect("answer") {
        Ok(resp) => resp,
        Err(client::ClientError::Api { status, code, .. }) => return (status, code.to_string()),
        Err(e) => panic!("{path}: {e}"),
    };
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let code = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, code)
}

fn body_type(method: Method) -> Option<&'static str> {
    (method == Method::POST).then_some("application/json")
}

fn status(pid: i32) -> Status {
    Status::from_file(format!("/proc/{pid}/status")).unwrap()
}

fn vm_rss_kib(pid: i32) -> u64 {
    status(pid).vmrss.expect("VmRSS")
}

/// Whether `pid` may lower OOM scores: bit 24 (CAP_SYS_RESOURCE) of its effective set.
fn has_cap_sys_resource(pid: i32) -> bool {
    status(pid).capeff & (1 << 24) != 0
}

async fn still_running(c: &Client, d: &Daemon, id: &str) {
    let s = c.sandbox(id).await.unwrap();
    assert_eq!(s.status, SandboxStatus::Running, "{}", d.log());
    let cmd = sh(c, id, "echo alive").await;
    assert_eq!(cmd.exit_code, Some(0));
    assert_eq!(output(c, id, &cmd.id).await.0, "alive\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn special_files_busy_mounts_and_moving_root_get_their_own_codes() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let get = |path: &str| routes::file(&s.id, "", path);
    assert_eq!(
        sh(&c, &s.id, "mkfifo /workspace/fifo").await.exit_code,
        Some(0)
    );

    // A FIFO used to hang the request and an agent thread for ever; several at once.
    let fifo = get("/workspace/fifo");
    let reads: Vec<_> = (0..6)
        .map(|_| status_of(&c, Method::GET, &fifo, None))
        .collect();
    for r in futures::future::join_all(reads).await {
        assert_eq!(r, (400, "not_a_regular_file".to_owned()));
    }
    for device in ["/dev/zero", "/dev/null"] {
        assert_eq!(
            status_of(&c, Method::GET, &get(device), None).await,
            (400, "not_a_regular_file".to_owned()),
            "{device}"
        );
    }

    // /proc files say they are empty; their contents come through.
    let cpuinfo = c.read_file_bytes(&s.id, "/proc/cpuinfo").await.unwrap();
    assert!(
        String::from_utf8_lossy(&cpuinfo).contains("processor"),
        "{} bytes",
        cpuinfo.len()
    );

    // A mount point cannot be removed: busy, not an internal error.
    let rm = get("/proc");
    assert_eq!(
        status_of(&c, Method::DELETE, &rm, None).await,
        (409, "busy".to_owned())
    );
    let mv = routes::sandbox_sub(&s.id, "files/move");
    assert_eq!(
        status_of(
            &c,
            Method::POST,
            &mv,
            Some(r#"{"from":"/","to":"/workspace/root"}"#)
        )
        .await,
        (400, "invalid_path".to_owned())
    );
    still_running(&c, &d, &s.id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_of_200k_entries_lists_in_pages_in_bounded_daemon_memory() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let count = 200_000;
    let made = sh(
        &c,
        &s.id,
        &format!("mkdir /workspace/big && cd /workspace/big && seq -f 'file-%06g' 1 {count} | xargs touch"),
    )
    .await;
    assert_eq!(
        made.exit_code,
        Some(0),
        "{:?}",
        output(&c, &s.id, &made.id).await
    );
    let page = |limit: Option<u32>, cursor: Option<String>| {
        let (c, id) = (c.clone(), s.id.clone());
        async move {
            c.list_files(&id, "/workspace/big", limit, cursor.as_deref())
                .await
        }
    };

    let rss_before = vm_rss_kib(d.pid());
    // Four at once: the load that used to make the agent the OOM killer's choice.
    let firsts = (0..4).map(|_| page(None, None));
    for page in futures::future::join_all(firsts).await {
        let page = page.unwrap();
        assert_eq!(page.entries.len(), 1000, "the default page");
        assert!(page.next_cursor.is_some());
    }

    let mut seen = 0;
    let mut last = String::new();
    let mut cursor = None;
    loop {
        let page = page(Some(5000), cursor).await.unwrap();
        assert!(page.entries.len() <= 5000);
        for e in &page.entries {
            assert!(e.name > last, "{} after {last}", e.name);
            last.clone_from(&e.name);
        }
        seen += page.entries.len();
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, count);
    let rss_after = vm_rss_kib(d.pid());
    eprintln!(
        "daemon VmRSS {rss_before} KiB before, {rss_after} KiB after listing {count} entries"
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "the daemon grew from {rss_before} to {rss_after} KiB"
    );

    for bad in [0, 5001] {
        let e = page(Some(bad), None).await.unwrap_err();
        assert_eq!((e.status(), e.code()), (Some(400), "bad_request"), "{e}");
    }
    still_running(&c, &d, &s.id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn filling_tmp_or_memory_kills_the_command_not_the_agent() {
    let d = Daemon::start();
    let c = d.http();
    let req = CreateSandbox {
        memory_mib: Some(256),
        ..Default::default()
    };
    let s = d.create(&c, req).await;

    // Commands always score above the agent: 0 against its -1000 when the host may lower
    // scores (CAP_SYS_RESOURCE), else the agent keeps its 0 and commands get 1000.
    let cmd = sh(
        &c,
        &s.id,
        "cat /proc/1/oom_score_adj /proc/self/oom_score_adj",
    )
    .await;
    let scores = output(&c, &s.id, &cmd.id).await.0;
    let want = if has_cap_sys_resource(d.pid()) {
        "-1000\n0\n"
    } else {
        "0\n1000\n"
    };
    assert_eq!(scores, want);

    // /tmp is half the memory limit: the writer gets ENOSPC long before the limit.
    let fill = sh(
        &c,
        &s.id,
        "dd if=/dev/zero of=/tmp/big bs=1M count=2048; df -k /tmp | tail -1",
    )
    .await;
    let (out, err) = output(&c, &s.id, &fill.id).await;
    assert!(err.contains("No space left"), "{err}");
    let size_kib: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(size_kib <= 128 * 1024, "/tmp is {size_kib} KiB");
    still_running(&c, &d, &s.id).await;

    // Using the whole memory limit: the OOM killer takes the command.
    let hog = sh(&c, &s.id, "exec tail /dev/zero").await;
    assert_eq!(hog.signal, Some(9), "{hog:?}\n{}", d.log());
    still_running(&c, &d, &s.id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cp_keeps_links_to_the_root_copies_proc_files_and_big_trees() {
    let d = Daemon::start();
    let c = d.http();
    let s = d.create(&c, CreateSandbox::default()).await;
    let made = sh(
        &c,
        &s.id,
        "mkdir -p /workspace/tree/many && cd /workspace/tree && ln -s / root && ln -s /etc/ etc \
         && cd many && seq -f 'f%05g' 1 20000 | xargs touch",
    )
    .await;
    assert_eq!(made.exit_code, Some(0));
    let local = tempfile::tempdir().unwrap();
    let cli = |args: &[&str]| {
        let out = d.cli(args);
        assert!(
            out.status.success(),
            "belljar {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let tree = local.path().join("tree");
    cli(&[
        "cp",
        &format!("{}:/workspace/tree", s.id),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read_link(tree.join("root")).unwrap(),
        Path::new("/")
    );
    assert_eq!(
        std::fs::read_link(tree.join("etc")).unwrap(),
        Path::new("/etc/")
    );
    assert_eq!(
        std::fs::read_dir(tree.join("many")).unwrap().count(),
        20_000
    );

    // A /proc file has no length; it is copied to its end.
    let cpuinfo = local.path().join("cpuinfo");
    cli(&[
        "cp",
        &format!("{}:/proc/cpuinfo", s.id),
        cpuinfo.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read_to_string(&cpuinfo)
            .unwrap()
            .contains("processor")
    );

    // And the tree goes back up, links intact.
    cli(&[
        "cp",
        tree.to_str().unwrap(),
        &format!("{}:/workspace/again", s.id),
    ]);
    let check = sh(
        &c,
        &s.id,
        "readlink /workspace/again/root; ls /workspace/again/many | wc -l",
    )
    .await;
    assert_eq!(output(&c, &s.id, &check.id).await.0, "/\n20000\n");
}
