//! Launch, adopt, stop and destroy real namespace sandboxes (as root here), with the stand-in
//! agent from `belljar_namespace::testing` as PID 1. What a running sandbox may reach and use
//! is tested in `confinement.rs`.

mod common;

use std::io::BufRead;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use belljar_namespace::testing;
use belljar_namespace::{Limits, SandboxSpec};
use common::{Guard, T, sh, spec, tmpdir};
use procfs_core::FromRead;
use procfs_core::process::Stat;

#[test]
fn launch_run_stop_destroy() {
    let tmp = tmpdir();
    let spec = spec(tmp.path(), "life", Limits::default());
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).expect("launch");
    assert_eq!(running.socket, spec.state_dir.join("agent.sock"));
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    let out = sh(
        &running.socket,
        "echo $$; hostname; id -u; cat /workspace/hello.txt; echo $BELLJAR_TEST",
    );
    assert_eq!(out.code, 0, "{}", out.text);
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines[1], "life-host");
    assert_eq!(lines[2], "0");
    assert_eq!(lines[3], "hello from the image");
    assert_eq!(lines[4], "1");
    // The hostname resolves, from /etc/hosts.
    let out = sh(&running.socket, "grep life-host /etc/hosts");
    assert_eq!(out.text, "127.0.1.1\tlife-host\n");
    // PID 1 is the agent.
    let out = sh(&running.socket, "cat /proc/1/cmdline | tr '\\0' ' '");
    // Its socket is inherited, bound on the host where the sandbox cannot reach it.
    assert!(
        out.text
            .trim()
            .starts_with("/sbin/belljar-agent --mode namespace --listen fd:"),
        "{}",
        out.text
    );
    belljar_namespace::stop(&spec.state_dir, Duration::from_secs(2)).unwrap();
    assert!(belljar_namespace::adopt(&spec.state_dir).unwrap().is_none());
    belljar_namespace::destroy(&spec.state_dir).unwrap();
    assert!(!spec.state_dir.exists());
}

/// The cross-sandbox hijack: a guest that plants a link to another sandbox's socket where it
/// can write must not change where the host's connections to its agent go.
#[test]
fn a_guest_cannot_swap_its_agent_socket() {
    let tmp = tmpdir();
    let a = spec(tmp.path(), "swap-a", Limits::default());
    let b = spec(tmp.path(), "swap-b", Limits::default());
    let _guards = (Guard(a.state_dir.clone()), Guard(b.state_dir.clone()));
    let ra = belljar_namespace::launch(&a).expect("launch a");
    let rb = belljar_namespace::launch(&b).expect("launch b");
    belljar_namespace::wait_ready(&ra.socket, T).unwrap();
    belljar_namespace::wait_ready(&rb.socket, T).unwrap();
    let plant = format!(
        "cd /run/belljar && ln -sfn {} agent.sock && ln -sfn {} agent.sock.b && ls /run/belljar",
        b.state_dir.join("run/agent.sock").display(),
        rb.socket.display()
    );
    assert_eq!(sh(&ra.socket, &plant).code, 0);
    // The host side, as a restarted daemon finds it.
    let adopted = belljar_namespace::adopt(&a.state_dir).unwrap().unwrap();
    assert_eq!(sh(&adopted.socket, "hostname").text, "swap-a-host\n");
    assert!(
        std::fs::symlink_metadata(&adopted.socket)
            .unwrap()
            .file_type()
            .is_socket()
    );
}

#[test]
fn survives_the_death_of_the_launching_process_and_is_adopted() {
    let tmp = tmpdir();
    let spec = spec(tmp.path(), "orphan", Limits::default());
    let _guard = Guard(spec.state_dir.clone());
    // The "daemon": a separate process that launches and then waits to be killed.
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_belljar-ns"))
        .arg("launch")
        .arg(&spec.id)
        .arg(&spec.rootfs)
        .arg(&spec.state_dir)
        .arg(&spec.agent)
        .arg("--hold")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(daemon.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let launched: belljar_namespace::Running = serde_json::from_str(&line).expect(&line);
    daemon.kill().unwrap(); // SIGKILL
    daemon.wait().unwrap();
    let adopted = belljar_namespace::adopt(&spec.state_dir)
        .unwrap()
        .expect("still running");
    assert_eq!(adopted.pid, launched.pid);
    // Reparented away from the dead daemon, in its own session.
    let stat = Stat::from_file(format!("/proc/{}/stat", adopted.pid)).unwrap();
    assert_ne!(i64::from(stat.ppid), i64::from(daemon.id()), "ppid");
    assert_eq!(
        i64::from(stat.session),
        i64::from(adopted.pid),
        "PID 1 leads its own session"
    );
    belljar_namespace::wait_ready(&adopted.socket, T).unwrap();
    assert_eq!(sh(&adopted.socket, "echo alive").text, "alive\n");
    // The exit watch works for a process that is not our child.
    let watch = belljar_namespace::ExitWatch::for_sandbox(&spec.state_dir)
        .unwrap()
        .unwrap();
    assert!(!watch.has_exited());
    belljar_namespace::stop(&spec.state_dir, Duration::from_secs(2)).unwrap();
    assert!(watch.wait(Some(T)));
    assert!(belljar_namespace::adopt(&spec.state_dir).unwrap().is_none());
    belljar_namespace::destroy(&spec.state_dir).unwrap();
}

/// The source and options of the overlay at the sandbox's `/`, as its kernel shows them.
fn root_overlay_options(socket: &Path) -> String {
    // The fields after " - " are the type, the source and the superblock's options.
    let out = sh(
        socket,
        "awk '$5 == \"/\"' /proc/1/mountinfo | sed 's/.* - overlay //'",
    );
    assert_eq!(out.code, 0, "{}", out.text);
    out.text
}

#[test]
fn exit_from_inside_is_seen_and_relaunch_keeps_the_writable_layer() {
    let tmp = tmpdir();
    let mut spec = spec(tmp.path(), "relaunch", Limits::default());
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).unwrap();
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    // A disposable sandbox's writable layer skips syncs.
    let options = root_overlay_options(&running.socket);
    assert!(options.contains("volatile"), "{options:?}");
    assert!(matches!(
        belljar_namespace::launch(&spec),
        Err(belljar_namespace::Error::AlreadyRunning(pid)) if pid == running.pid
    ));
    let out = sh(
        &running.socket,
        "echo kept > /workspace/kept.txt && mkdir -p /etc/new && touch /etc/new/f && rm /workspace/hello.txt",
    );
    assert_eq!(out.code, 0, "{}", out.text);
    // Files written by root inside belong to the sandbox's root uid on the host, not root.
    let upper = spec.state_dir.join("fs/upper");
    let meta = std::fs::metadata(upper.join("workspace/kept.txt")).unwrap();
    // The file was created by root inside (the stand-in runs commands as root).
    assert_eq!(meta.uid(), running.root_uid);
    assert_ne!(running.root_uid, 0);
    let watch = belljar_namespace::ExitWatch::for_sandbox(&spec.state_dir)
        .unwrap()
        .unwrap();
    // PID 1 ends itself (SIGTERM from inside reaches the stand-in's handler).
    let _ = testing::shell(&running.socket, "kill -TERM 1", T);
    assert!(watch.wait(Some(T)), "PID 1 exited");
    assert!(belljar_namespace::adopt(&spec.state_dir).unwrap().is_none());
    belljar_namespace::stop(&spec.state_dir, Duration::from_secs(1)).unwrap();
    // The volatile overlay's marker does not keep the layer from being mounted again in the
    // same boot, now durable (as a persistent sandbox's is).
    spec.durable = true;
    let again = belljar_namespace::launch(&spec).unwrap();
    belljar_namespace::wait_ready(&again.socket, T).unwrap();
    let options = root_overlay_options(&again.socket);
    assert!(
        options.contains("userxattr") && !options.contains("volatile"),
        "{options}"
    );
    assert_eq!(
        again.root_uid, running.root_uid,
        "same id block for the same layer"
    );
    let out = sh(
        &again.socket,
        "cat /workspace/kept.txt; ls /etc/new; ls /workspace",
    );
    assert_eq!(out.text, "kept\nf\nkept.txt\n");
    belljar_namespace::destroy(&spec.state_dir).unwrap();
    assert!(!spec.state_dir.exists());
}

#[test]
fn many_sandboxes_launched_from_many_threads_at_once() {
    let tmp = tmpdir();
    let specs: Vec<SandboxSpec> = (0..8)
        .map(|i| spec(tmp.path(), &format!("par{i}"), Limits::default()))
        .collect();
    let _guards: Vec<Guard> = specs.iter().map(|s| Guard(s.state_dir.clone())).collect();
    let running: Vec<belljar_namespace::Running> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .iter()
            .map(|s| scope.spawn(move || belljar_namespace::launch(s).expect("launch")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut blocks: Vec<u32> = running.iter().map(|r| r.root_uid).collect();
    blocks.sort();
    blocks.dedup();
    assert_eq!(blocks.len(), 8, "every sandbox has its own id block");
    for (r, s) in running.iter().zip(&specs) {
        belljar_namespace::wait_ready(&r.socket, T).unwrap();
        let name = s
            .state_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            sh(&r.socket, "hostname").text.trim(),
            format!("{name}-host")
        );
    }
    for s in &specs {
        belljar_namespace::destroy(&s.state_dir).unwrap();
    }
}

#[test]
fn a_volatile_layer_is_not_mounted_again_after_the_host_went_down() {
    let tmp = tmpdir();
    let spec = spec(tmp.path(), "torn", Limits::default());
    let _guard = Guard(spec.state_dir.clone());
    let running = belljar_namespace::launch(&spec).unwrap();
    belljar_namespace::wait_ready(&running.socket, T).unwrap();
    belljar_namespace::stop(&spec.state_dir, Duration::from_secs(1)).unwrap();
    // As after a reboot: the state names another boot than this one.
    let path = spec.state_dir.join("sandbox.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(state["boot_id"].is_string(), "{state}");
    state["boot_id"] = "00000000-0000-0000-0000-000000000000".into();
    std::fs::write(&path, state.to_string()).unwrap();
    match belljar_namespace::launch(&spec) {
        Err(e @ belljar_namespace::Error::TornLayer { .. }) => {
            assert!(e.to_string().contains("delete the sandbox"), "{e}")
        }
        other => panic!("expected TornLayer, got {other:?}"),
    }
    // The disk the launch mounted to look is unmounted again, so the sandbox can go.
    belljar_namespace::destroy(&spec.state_dir).unwrap();
    assert!(!spec.state_dir.exists());
}
