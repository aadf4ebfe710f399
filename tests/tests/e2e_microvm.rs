//! Sandboxes on the `microvm` backend end to end: a real daemon, the real `belljar-vmm`, the
//! project's guest kernel and the `base` image, driven through the `belljar` CLI.
//!
//! They need KVM, so they are ignored by default. `scripts/test-microvm.sh` runs them: on a
//! host with hardware KVM directly, elsewhere inside a QEMU-TCG guest whose emulated AMD SVM
//! gives it a nested `/dev/kvm`. Nested KVM fails the daemon's speed probe, so the script sets
//! `BELLJAR_TESTING_FORCE_MICROVM=1`, which lets the explicit `--backend microvm` used here
//! through; on hardware KVM it changes nothing.

use std::time::{Duration, Instant};

use belljar_api::RunCommand;
use belljar_e2e::{Daemon, random_file, same_file, stderr, stdout};

/// `belljar create --backend microvm`; returns the id and how long it took.
fn create(d: &Daemon) -> (String, Duration) {
    let t = Instant::now();
    // A nested microVM under load can spend minutes in one test; the default 5 min timeout
    // would stop the sandbox mid-test (a 100 MiB download then ends in `connection_lost`).
    let out = d.cli(["create", "--backend", "microvm", "--timeout", "30m"]);
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "create failed: {}\nlog:\n{}\nconsoles:\n{}",
        stderr(&out),
        d.log(),
        console(d, "sbx_")
    );
    let id = stdout(&out).trim().to_string();
    assert!(id.starts_with("sbx_"), "create printed {id:?}");
    (id, took)
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(out), stderr(out)))
}

/// The sandbox's console log (the guest kernel's and the agent's output) and the VMM's own
/// log, for failures.
fn console(d: &Daemon, id: &str) -> String {
    let mut found = String::new();
    let Ok(walk) = std::process::Command::new("find")
        .arg(d.home.path())
        .args([
            "(",
            "-name",
            "console.log",
            "-o",
            "-name",
            "vmm.log",
            ")",
            "-path",
        ])
        .arg(format!("*{id}*"))
        .output()
    else {
        return found;
    };
    for p in stdout(&walk).lines() {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        found += &format!("--- {p}\n");
        found += &lines[lines.len().saturating_sub(60)..].join("\n");
        found += "\n";
    }
    found
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn create_exec_files_and_stop() {
    let d = Daemon::start_via_cli();
    let (id, create_took) = create(&d);
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["backend"], "microvm", "{info}");

    // The first command: output, stderr and exit code come back from inside the microVM.
    let t = Instant::now();
    let out = d.cli([
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo hello from $(uname -r); echo oops >&2; exit 3",
    ]);
    let first_took = t.elapsed();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}\nconsole:\n{}",
        stderr(&out),
        console(&d, &id)
    );
    assert!(stdout(&out).starts_with("hello from "), "{}", stdout(&out));
    assert_eq!(stderr(&out), "oops\n");
    eprintln!(
        "microvm: create {create_took:?}, first command {first_took:?}, create -> first command {:?}",
        create_took + first_took
    );
    // A microVM runs its own kernel (the project's guest kernel, not the host's).
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!stdout(&out).contains(host.trim()), "{}", stdout(&out));

    // Files both ways: empty, binary, and 100 MiB (thousands of vsock round trips).
    let local = tempfile::tempdir().unwrap();
    let l = |name: &str| local.path().join(name);
    std::fs::write(l("empty"), b"").unwrap();
    random_file(&l("binary.bin"), 70_001);
    random_file(&l("big.bin"), 100 << 20);
    for name in ["empty", "binary.bin", "big.bin"] {
        let t = Instant::now();
        let up = d.cli([
            "cp".as_ref(),
            l(name).as_os_str(),
            format!("{id}:/tmp/").as_ref(),
        ]);
        assert!(
            up.status.success(),
            "upload {name}: {}\nconsoles:\n{}\nlog:\n{}",
            stderr(&up),
            console(&d, &id),
            d.log()
        );
        let back = l(&format!("back-{name}"));
        let down = d.cli([
            "cp".as_ref(),
            format!("{id}:/tmp/{name}").as_ref(),
            back.as_os_str(),
        ]);
        assert!(
            down.status.success(),
            "download {name}: {}\nconsoles:\n{}\nlog:\n{}",
            stderr(&down),
            console(&d, &id),
            d.log()
        );
        assert!(
            same_file(&l(name), &back),
            "{name} changed in the round trip"
        );
        eprintln!("microvm: {name} round trip {:?}", t.elapsed());
    }
    let out = d.cli(["exec", &id, "--", "sha256sum", "/tmp/binary.bin"]);
    let local_sum = std::process::Command::new("sha256sum")
        .arg(l("binary.bin"))
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out).split_whitespace().next(),
        stdout(&local_sum).split_whitespace().next()
    );

    // Stop ends the VMM; a stopped sandbox runs nothing.
    let out = d.cli(["stop", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["status"], "stopped");
    let out = d.cli(["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("(sandbox_not_running)"),
        "{}",
        stderr(&out)
    );
    let out = d.cli(["rm", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn detached_logs_and_pty() {
    let d = Daemon::start_via_cli();
    let (id, _) = create(&d);
    let out = d.cli([
        "exec",
        "--detach",
        &id,
        "--",
        "sh",
        "-c",
        "for i in 1 2 3; do echo line$i; sleep 0.2; done; echo oops >&2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cmd_id = stdout(&out).trim().to_string();
    assert!(cmd_id.starts_with("cmd_"), "{cmd_id}");
    let out = d.cli(["logs", "-f", &id, &cmd_id]);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");
    assert_eq!(stderr(&out), "oops\n");
    let out = d.cli(["logs", &id, &cmd_id]);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");

    // -t runs on a PTY inside the microVM.
    let out = d.cli([
        "exec",
        "-t",
        &id,
        "--",
        "sh",
        "-c",
        "test -t 1 && echo tty; stty size",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "tty\r\n24 80\r\n");

    // Watch: a change inside the microVM reaches the host as an event. The watch is installed
    // in the guest a moment after the stream opens, so files are made until one is seen.
    let client = d.unix();
    let seen = belljar_e2e::block_on(async {
        let mut watch = client.watch(&id, "/tmp", false).await.expect("watch");
        for i in 0..30 {
            let name = format!("/tmp/watched-{i}");
            let run = RunCommand {
                argv: vec!["touch".into(), name.clone()],
                ..Default::default()
            };
            client.run_command(&id, &run).await.expect("touch");
            let found = tokio::time::timeout(Duration::from_secs(3), async {
                while let Some(event) = watch.next().await.expect("watch stream") {
                    if event.path.starts_with("/tmp/watched-") {
                        return true;
                    }
                }
                false
            })
            .await;
            match found {
                Ok(true) => return Some(i),
                Ok(false) => return None, // the stream ended
                Err(_) => continue,       // not installed yet: make another file
            }
        }
        None
    });
    assert!(seen.is_some(), "no watch event from the microVM");
}

#[test]
#[ignore = "needs KVM, the guest kernel and the base image: run scripts/test-microvm.sh"]
fn daemon_kill_9_adopts_the_running_microvm() {
    let d = Daemon::start_via_cli();
    let (id, _) = create(&d);
    let out = d.cli(["exec", &id, "--", "sh", "-c", "echo kept > /tmp/keep.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli([
        "exec",
        "--detach",
        &id,
        "--",
        "sh",
        "-c",
        "echo start; sleep 3; echo end; exit 6",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cmd_id = stdout(&out).trim().to_string();

    // The VMM runs in its own process group and outlives the daemon; the new daemon adopts it.
    d.kill9();
    d.restart();
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["status"], "running", "{info}\nlog:\n{}", d.log());
    let out = d.cli(["logs", "-f", &id, &cmd_id]);
    assert_eq!(stdout(&out), "start\nend\n", "{}", stderr(&out));
    let out = d.cli(["exec", &id, "--", "cat", "/tmp/keep.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "kept\n");
}
