//! End to end through the `belljar` CLI: a real daemon in a temporary `BELLJAR_HOME`, started
//! by the CLI itself, sandboxes on the namespace backend with the real `base` image.

use std::time::Duration;

use belljar_e2e::{Daemon, eventually, random_file, same_file, stderr, stdout};

/// `belljar create` with the namespace backend; returns the id it printed.
fn create(d: &Daemon, extra: &[&str]) -> String {
    let mut args = vec!["create", "--backend", "namespace"];
    args.extend_from_slice(extra);
    let out = d.cli(&args);
    assert!(
        out.status.success(),
        "create failed: {}\nlog:\n{}",
        stderr(&out),
        d.log()
    );
    let id = stdout(&out).trim().to_string();
    assert!(id.starts_with("sbx_"), "create printed {id:?}");
    id
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(out), stderr(out)))
}

#[test]
fn daemon_start_status_stop_and_autostart() {
    let d = Daemon::start_via_cli();
    let out = d.cli(["daemon", "status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("running:   yes"));
    let out = d.cli(["daemon", "status", "--json"]);
    let v = json(&out);
    assert_eq!(v["running"], true);
    assert_eq!(v["info"]["default_backend"], "namespace");

    let out = d.cli(["daemon", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli(["daemon", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("running:   no"));

    // Any other command starts the daemon again in the background.
    let out = d.cli(["ls", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out), serde_json::json!([]));
    assert!(d.cli(["daemon", "status"]).status.success());
}

#[test]
fn create_ls_info_exec_and_exit_codes() {
    let d = Daemon::start_via_cli();
    let id = create(
        &d,
        &[
            "--name",
            "alpha",
            "--tag",
            "team=e2e",
            "--env",
            "GREETING=hello",
            "--timeout",
            "10m",
        ],
    );

    let out = d.cli(["ls"]);
    assert!(stdout(&out).contains(&id), "{}", stdout(&out));
    let list = json(&d.cli(["ls", "--json"]));
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["status"], "running");
    assert_eq!(list[0]["backend"], "namespace");
    let filtered = json(&d.cli(["ls", "--json", "--tag", "team=other"]));
    assert_eq!(filtered, serde_json::json!([]));

    let info = json(&d.cli(["info", &id, "--json"]));
    assert_eq!(info["name"], "alpha");
    assert_eq!(info["tags"]["team"], "e2e");
    assert_eq!(info["timeout_ms"], 600_000);
    // A name works where an id does.
    assert!(stdout(&d.cli(["info", "alpha"])).contains(&id));

    let out = d.cli([
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo out $GREETING; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    assert_eq!(stdout(&out), "out hello\n");
    assert_eq!(stderr(&out), "err\n");

    let out = d.cli([
        "exec",
        "--env",
        "GREETING=bye",
        "--cwd",
        "/tmp",
        &id,
        "--",
        "sh",
        "-c",
        "echo $GREETING $(pwd) $(id -un)",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "bye /tmp belljar\n");

    let out = d.cli(["exec", "--sudo", &id, "--", "id", "-u"]);
    assert_eq!(stdout(&out), "0\n");

    // Killed by a signal: 128 + signal, like a shell.
    let out = d.cli(["exec", &id, "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(137));

    // A missing program is an error of the daemon, not a crash.
    let out = d.cli(["exec", &id, "--", "/no/such/program"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));

    // Piped stdin reaches the command with -i.
    let mut child = d
        .cli_command()
        .args(["exec", "-i", &id, "--", "sh", "-c", "tr a-z A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"shout\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "SHOUT\n");
}

#[test]
fn output_streams_as_it_comes() {
    let d = Daemon::start_via_cli();
    let id = create(&d, &[]);
    let mut child = d
        .cli_command()
        .args([
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo first; sleep 3; echo second",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "first\n");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "first line came only after {:?}",
        started.elapsed()
    );
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "second\n");
    assert!(child.wait().unwrap().success());
}

#[test]
fn detached_command_logs_pty_and_run() {
    let d = Daemon::start_via_cli();
    let id = create(&d, &[]);
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

    // Follow until it exits, then read again later without following.
    let out = d.cli(["logs", "-f", &id, &cmd_id]);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");
    assert_eq!(stderr(&out), "oops\n");
    let out = d.cli(["logs", &id, &cmd_id]);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");
    let out = d.cli(["logs", "--json", &id, &cmd_id]);
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.iter().any(|l| l["stream"] == "stderr"));

    // -t runs on a PTY: the command sees a terminal, and its output has terminal newlines.
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

    // run = create + exec + delete.
    let before = json(&d.cli(["ls", "--json"])).as_array().unwrap().len();
    let out = d.cli([
        "run",
        "--backend",
        "namespace",
        "base",
        "--",
        "sh",
        "-c",
        "echo ran; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    let after = json(&d.cli(["ls", "--json"])).as_array().unwrap().len();
    assert_eq!(before, after, "run left its sandbox behind");
}

#[test]
fn file_round_trips() {
    let d = Daemon::start_via_cli();
    let id = create(&d, &[]);
    let local = tempfile::tempdir().unwrap();
    let l = |name: &str| local.path().join(name);
    let remote = |p: &str| format!("{id}:{p}");

    // Empty file, binary file, 100 MiB file, unicode and spaces in names.
    std::fs::write(l("empty"), b"").unwrap();
    random_file(&l("binary.bin"), 70_001);
    random_file(&l("big.bin"), 100 << 20);
    std::fs::write(l("ünïcödé name with spaces.txt"), "héllo wörld\n").unwrap();
    for name in [
        "empty",
        "binary.bin",
        "big.bin",
        "ünïcödé name with spaces.txt",
    ] {
        let up = d.cli(["cp".as_ref(), l(name).as_os_str(), remote("/tmp/").as_ref()]);
        assert!(up.status.success(), "upload {name}: {}", stderr(&up));
        let back = l(&format!("back-{name}"));
        let down = d.cli([
            "cp".as_ref(),
            remote(&format!("/tmp/{name}")).as_ref(),
            back.as_os_str(),
        ]);
        assert!(down.status.success(), "download {name}: {}", stderr(&down));
        assert!(
            same_file(&l(name), &back),
            "{name} changed in the round trip"
        );
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
    let out = d.cli([
        "exec",
        &id,
        "--",
        "cat",
        "/tmp/ünïcödé name with spaces.txt",
    ]);
    assert_eq!(stdout(&out), "héllo wörld\n");

    // Directories, recursively, with nested unicode names and an empty subdirectory.
    let tree = l("tree");
    std::fs::create_dir_all(tree.join("sub dir/ñested")).unwrap();
    std::fs::create_dir_all(tree.join("empty dir")).unwrap();
    std::fs::write(tree.join("top.txt"), "top\n").unwrap();
    random_file(&tree.join("sub dir/ñested/data.bin"), 12_345);
    let up = d.cli([
        "cp".as_ref(),
        tree.as_os_str(),
        remote("/tmp/copied").as_ref(),
    ]);
    assert!(up.status.success(), "upload tree: {}", stderr(&up));
    let out = d.cli(["exec", &id, "--", "cat", "/tmp/copied/top.txt"]);
    assert_eq!(stdout(&out), "top\n");
    let out = d.cli(["exec", &id, "--", "test", "-d", "/tmp/copied/empty dir"]);
    assert!(out.status.success(), "empty dir missing");
    let back = l("tree-back");
    let down = d.cli([
        "cp".as_ref(),
        remote("/tmp/copied").as_ref(),
        back.as_os_str(),
    ]);
    assert!(down.status.success(), "download tree: {}", stderr(&down));
    assert!(same_file(
        &tree.join("sub dir/ñested/data.bin"),
        &back.join("sub dir/ñested/data.bin")
    ));
    assert!(same_file(&tree.join("top.txt"), &back.join("top.txt")));
    assert!(back.join("empty dir").is_dir());

    // Copying into an existing directory puts the source inside it.
    let up = d.cli([
        "cp".as_ref(),
        tree.as_os_str(),
        remote("/tmp/copied").as_ref(),
    ]);
    assert!(up.status.success(), "{}", stderr(&up));
    let out = d.cli(["exec", &id, "--", "cat", "/tmp/copied/tree/top.txt"]);
    assert_eq!(stdout(&out), "top\n");

    // Sandbox to sandbox, streamed through the daemon.
    let other = create(&d, &[]);
    let out = d.cli([
        "cp",
        &remote("/tmp/binary.bin"),
        &format!("{other}:/tmp/copy.bin"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let back = l("from-other.bin");
    let out = d.cli([
        "cp".as_ref(),
        format!("{other}:/tmp/copy.bin").as_ref(),
        back.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(same_file(&l("binary.bin"), &back));

    // Missing remote file: one clear line and exit status 1.
    let out = d.cli([
        "cp".as_ref(),
        remote("/tmp/nope").as_ref(),
        l("x").as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("(not_found)"), "{}", stderr(&out));
}

#[test]
fn extend_stop_rm_and_errors() {
    let d = Daemon::start_via_cli();
    let id = create(&d, &["--timeout", "2m"]);
    let before = json(&d.cli(["info", "--json", &id]));
    let out = d.cli(["extend", &id, "10m"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let after = json(&d.cli(["info", "--json", &id]));
    assert_eq!(
        after["timeout_ms"].as_i64().unwrap(),
        before["timeout_ms"].as_i64().unwrap() + 600_000
    );
    assert!(after["expires_at"].as_i64().unwrap() > before["expires_at"].as_i64().unwrap());

    let out = d.cli(["stop", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info = json(&d.cli(["info", "--json", &id]));
    assert_eq!(info["status"], "stopped");
    // A stopped sandbox runs nothing.
    let out = d.cli(["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("(sandbox_not_running)"),
        "{}",
        stderr(&out)
    );

    let out = d.cli(["rm", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = d.cli(["info", &id]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("error: ") && err.trim_end().ends_with("(not_found)"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // Usage errors exit with 2; bad durations with 1 and a clear code.
    assert_eq!(d.cli(["exec", "sbx_x"]).status.code(), Some(2));
    assert_eq!(d.cli(["frobnicate"]).status.code(), Some(2));
    let out = d.cli(["extend", "sbx_nope", "ten minutes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("(bad_request)"), "{}", stderr(&out));
    let out = d.cli(["create", "--timeout", "-5m"]);
    assert_ne!(out.status.code(), Some(0));
    // Limits out of range: the API's code, not a crash.
    let out = d.cli(["create", "--memory", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("(bad_request)"), "{}", stderr(&out));
}

#[test]
fn images_ui_and_completions() {
    let d = Daemon::start_via_cli();
    let images = json(&d.cli(["images", "--json"]));
    let base = images
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "base")
        .expect("base image listed");
    assert_eq!(base["status"], "ready");
    assert!(stdout(&d.cli(["images"])).contains("base"));

    let out = d.cli(["ui", "--no-open"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let url = stdout(&out).trim().to_string();
    let port = d.paths.port().unwrap();
    assert!(
        url.starts_with(&format!("http://127.0.0.1:{port}/ui?token=")),
        "{url}"
    );

    let out = d.cli(["completions", "bash"]);
    assert!(stdout(&out).contains("belljar"));
}

#[test]
fn timeout_expiry_stops_the_sandbox() {
    let d = Daemon::start_via_cli();
    let id = create(&d, &["--timeout", "3s"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(eventually(Duration::from_secs(30), "the timeout", || {
        let v = json(&d.cli(["info", "--json", &id]));
        async move { (v["status"] == "stopped").then_some(v) }
    }));
    assert_eq!(status["status_reason"], "timeout");
}

/// `belljar sh` on a real pseudo-terminal: raw mode, the terminal's size, typed input and the
/// shell's exit status.
#[test]
fn interactive_shell_on_a_terminal() {
    use nix::pty::{Winsize, openpty};
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;

    let d = Daemon::start_via_cli();
    let id = create(&d, &[]);
    let size = Winsize {
        ws_row: 33,
        ws_col: 101,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&size), None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    let mut child = d
        .cli_command()
        .args(["sh", &id])
        .stdin(std::process::Stdio::from(slave.try_clone().unwrap()))
        .stdout(std::process::Stdio::from(slave.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(slave))
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    // A reader thread hands over what the terminal shows; it ends when the CLI exits (the
    // master then reads EIO once the slave is closed).
    let mut reader = master.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    // Reads until `marker` shows (or, with `None`, until the CLI exits), by the deadline.
    let mut read_until = |marker: Option<&str>| loop {
        if marker.is_some_and(|m| String::from_utf8_lossy(&seen).contains(m)) {
            return;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.extend_from_slice(&chunk),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) if marker.is_none() => return,
            Err(e) => panic!(
                "waiting for {marker:?}: {e:?}; the terminal showed: {}",
                String::from_utf8_lossy(&seen)
            ),
        }
    };
    master
        .write_all(b"stty size; echo first-$((40+2))\r")
        .unwrap();
    // The shell answered, so the CLI pumps the terminal (and watches for SIGWINCH).
    read_until(Some("first-42"));
    // The shell waits for the resize as a program would: SIGWINCH, which the sandbox's PTY
    // raises when the new size reaches it (CLI -> daemon -> agent), then prints that size.
    master
        .write_all(
            b"trap 'stty size; echo shell-$((40+2)); exit 3' WINCH; echo armed-$((40+2)); \
              while :; do sleep 1000 & wait $!; done\r",
        )
        .unwrap();
    read_until(Some("armed-42"));
    // Resize the local terminal as a terminal emulator does: new size, then SIGWINCH.
    rustix::termios::tcsetwinsize(
        &master,
        rustix::termios::Winsize {
            ws_row: 50,
            ws_col: 132,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGWINCH,
    )
    .unwrap();
    read_until(None);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3));
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("shell-42"), "{text}");
    assert!(text.contains("33 101"), "{text}");
    assert!(
        text.contains("50 132"),
        "resize did not reach the shell: {text}"
    );
}

#[test]
fn sources_fill_the_workspace() {
    let d = Daemon::start_via_cli();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a file.txt"), "from a directory\n").unwrap();
    let id = create(&d, &["--source", dir.path().to_str().unwrap()]);
    let out = d.cli(["exec", &id, "--", "cat", "/workspace/sub/a file.txt"]);
    assert_eq!(stdout(&out), "from a directory\n", "{}", stderr(&out));

    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .args([
                "-c",
                "user.email=e2e@belljar.invalid",
                "-c",
                "user.name=e2e",
            ])
            .args(args)
            .current_dir(repo.path())
            .status()
            .expect("git");
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.path().join("g.txt"), "from git\n").unwrap();
    git(&["add", "g.txt"]);
    git(&["commit", "-qm", "first"]);
    let id = create(&d, &["--source", repo.path().to_str().unwrap()]);
    let out = d.cli(["exec", &id, "--", "cat", "/workspace/g.txt"]);
    assert_eq!(stdout(&out), "from git\n", "{}", stderr(&out));
    let out = d.cli(["exec", &id, "--", "test", "-d", "/workspace/.git"]);
    assert!(out.status.success(), "the clone has no .git");
}
