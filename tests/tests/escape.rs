//! Escape tests for the namespace backend: from inside a sandbox, the host's files, processes,
//! loopback and Unix sockets, and other sandboxes are out of reach; a fork bomb, a memory hog
//! and a CPU hog hit their cgroup limits without hurting this process (the stand-in for the
//! daemon) or another sandbox.
//!
//! Commands run as root inside the sandbox, through the real `belljar-agent` when a static
//! build of it is found (`BELLJAR_AGENT_BIN`, `standin` to force the stand-in; or `x86_64-unknown-linux-gnu/release/` of
//! `CARGO_TARGET_DIR` or of a `target*` directory of the workspace), else through the stand-in
//! agent of `belljar_namespace::testing`. The image is the busybox tree from the same module
//! (the `busybox-static` package must be installed); `/usr/local/bin/belljar-probe` in it
//! tries connections (`connect`, `connect-abstract`, `connect-tcp`).

use std::io::Read;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use belljar_agent_proto::StartCommand;
use belljar_agent_proto::client::AgentClient;
use belljar_namespace::{Limits, SandboxSpec, testing};
use futures::StreamExt;

const T: Duration = Duration::from_secs(30);

/// How commands reach the sandbox.
enum Driver {
    Agent {
        rt: tokio::runtime::Runtime,
        client: AgentClient,
    },
    Standin {
        socket: PathBuf,
    },
}

/// A running sandbox, destroyed on drop.
struct Sandbox {
    spec: SandboxSpec,
    running: belljar_namespace::Running,
    driver: Driver,
}

struct Out {
    code: i32,
    text: String,
}

/// The real agent, looked up once.
fn real_agent() -> Option<PathBuf> {
    static AGENT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    AGENT.get_or_init(find_real_agent).clone()
}

fn find_real_agent() -> Option<PathBuf> {
    match std::env::var_os("BELLJAR_AGENT_BIN") {
        Some(p) if p == "standin" => return None,
        Some(p) if !p.is_empty() => return Some(PathBuf::from(p)),
        _ => {}
    }
    let rel = "x86_64-unknown-linux-gnu/release/belljar-agent";
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?.to_owned();
    let mut candidates: Vec<PathBuf> = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| PathBuf::from(d).join(rel))
        .into_iter()
        .collect();
    for dir in [workspace.clone(), workspace.parent()?.to_owned()] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with("target") {
                candidates.push(entry.path().join(rel));
            }
        }
    }
    // Only a static binary runs on the busybox image (it has no C library).
    candidates.into_iter().find(|p| is_static(p))
}

/// An ELF file without a program interpreter (`.interp` sits right after the headers).
fn is_static(path: &Path) -> bool {
    let mut head = Vec::new();
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    if f.take(8192).read_to_end(&mut head).is_err() || !head.starts_with(b"\x7fELF") {
        return false;
    }
    !head.windows(15).any(|w| w == b"/lib64/ld-linux")
}

/// Waits until `ready` holds, by the deadline `T`: what a sandbox starts in the background
/// (a listener, a process) is ready when it is, not after some pause.
fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bjesc")
        .tempdir_in("/tmp")
        .unwrap()
}

impl Sandbox {
    fn launch(dir: &Path, id: &str, limits: Limits) -> Self {
        let (rootfs, standin) =
            testing::fixtures().expect("fixtures (is busybox-static installed?)");
        let agent = real_agent();
        let spec = SandboxSpec {
            // Unique per process, so concurrent test runs on one machine do not share cgroups.
            id: format!("{id}-{}", std::process::id()),
            rootfs,
            layers: Vec::new(),
            state_dir: dir.join(id),
            agent: agent.clone().unwrap_or(standin),
            hostname: id.into(),
            limits,
            env: vec![],
            mounts: vec![],
            binds: vec![],
            durable: false,
        };
        eprintln!("{id}: agent {}", spec.agent.display());
        let running = belljar_namespace::launch(&spec).expect("launch");
        belljar_namespace::wait_ready(&running.socket, T).expect("agent ready");
        let driver = match agent {
            Some(_) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let client = rt
                    .block_on(AgentClient::connect_unix(&running.socket))
                    .unwrap();
                Driver::Agent { rt, client }
            }
            None => Driver::Standin {
                socket: running.socket.clone(),
            },
        };
        Sandbox {
            spec,
            running,
            driver,
        }
    }

    /// `/bin/sh -c cmd` as root inside; stdout and stderr together.
    fn sh(&self, cmd: &str) -> Out {
        match &self.driver {
            Driver::Standin { socket } => {
                let out = testing::shell(socket, cmd, T).unwrap_or_else(|e| panic!("{cmd}: {e}"));
                Out {
                    code: out.code,
                    text: out.text,
                }
            }
            Driver::Agent { rt, client } => rt.block_on(async {
                let start = StartCommand {
                    argv: vec!["/bin/sh".into(), "-c".into(), format!("exec 2>&1; {cmd}")],
                    cwd: Some("/".into()),
                    user: Some("root".into()),
                    ..Default::default()
                };
                let info = client.start_command(&start).await.expect("start");
                let done = tokio::time::timeout(T, client.wait_command(&info.id))
                    .await
                    .expect("command timed out")
                    .expect("wait");
                let mut text = Vec::new();
                let mut lines = client.output(&info.id, 0, true).await.expect("output");
                while let Some(line) = lines.next().await {
                    text.extend(line.expect("output line").bytes());
                }
                let code = done
                    .exit_code
                    .unwrap_or_else(|| 128 + done.signal.unwrap_or(0));
                Out {
                    code,
                    text: String::from_utf8_lossy(&text).into_owned(),
                }
            }),
        }
    }

    /// Runs `cmd` and returns its trimmed output, failing on a non-zero exit.
    fn ok(&self, cmd: &str) -> String {
        let out = self.sh(cmd);
        assert_eq!(out.code, 0, "{cmd}: {}", out.text);
        out.text.trim().to_owned()
    }

    /// Whether `cmd` succeeds.
    fn succeeds(&self, cmd: &str) -> bool {
        self.sh(&format!("{cmd} >/dev/null 2>&1")).code == 0
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = belljar_namespace::destroy(&self.spec.state_dir);
    }
}

fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    format!("{}-{}", std::process::id(), nanos.as_nanos())
}

#[test]
fn host_files_are_not_reachable() {
    let tmp = tmpdir();
    let tag = unique();
    let marker_dir = tmp.path().join("host");
    std::fs::create_dir_all(&marker_dir).unwrap();
    let marker = marker_dir.join(format!("marker-{tag}"));
    std::fs::write(&marker, format!("host-secret-{tag}")).unwrap();
    let sb = Sandbox::launch(tmp.path(), "esc-files", Limits::default());
    let m = marker.display();
    assert!(
        !sb.succeeds(&format!("cat {m}")),
        "host marker readable at its host path"
    );
    assert!(!sb.succeeds(&format!("cat /proc/1/root{m}")));
    assert!(
        !sb.succeeds(&format!("ls {}", sb.spec.state_dir.display())),
        "own state dir visible"
    );
    assert!(
        !sb.succeeds(&format!("ls {}", sb.spec.rootfs.display())),
        "image path visible"
    );
    let found = sb.ok(&format!(
        "find / -path /proc -prune -o -path /sys -prune -o -name 'marker-{tag}' -print"
    ));
    assert_eq!(found, "", "marker found inside");
    // Host-only paths do not exist inside; the root is the image.
    assert!(!sb.succeeds("test -e /etc/debian_version"));
    assert_eq!(sb.ok("cat /workspace/hello.txt"), "hello from the image");
    // No block devices to mount the host's disk from, and no way to make one.
    assert_eq!(sb.ok("find /dev -type b | wc -l"), "0");
    let chars = sb.ok("find /dev -type c -exec basename {} \\; | sort | tr '\\n' ' '");
    assert_eq!(chars, "full null ptmx random tty urandom zero");
    assert!(!sb.succeeds("mknod /tmp/disk b 8 0 && head -c1 /tmp/disk"));
    assert!(!sb.succeeds("mount -t ext4 /dev/vda /tmp"));
    // Writes inside land in the sandbox's own layer, owned by an unprivileged host uid.
    sb.ok("echo inside > /etc/written-inside");
    let upper = sb.spec.state_dir.join("fs/upper/etc/written-inside");
    let meta = std::fs::metadata(&upper).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid(), sb.running.root_uid);
    let euid = nix::unistd::Uid::effective().as_raw();
    if euid == 0 {
        assert!(sb.running.root_uid >= 100_000);
    } else {
        // Rootless: the sandbox's root is the ordinary user who runs it, never host root.
        assert_eq!(sb.running.root_uid, euid);
    }
    assert!(!Path::new("/etc/written-inside").exists());
}

#[test]
fn host_processes_are_not_visible() {
    let tmp = tmpdir();
    let sb = Sandbox::launch(tmp.path(), "esc-procs", Limits::default());
    let pids = sb.ok("ls /proc | grep '^[0-9]*$' | tr '\\n' ' '");
    let pids: Vec<u32> = pids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(pids.contains(&1));
    assert!(pids.len() < 20, "{pids:?}");
    assert!(pids.iter().all(|p| *p < 1000), "{pids:?}");
    let me = std::process::id();
    assert!(
        !sb.succeeds(&format!("kill -0 {me}")),
        "host pid {me} signalable"
    );
    assert!(!sb.succeeds(&format!("test -e /proc/{me}")));
    let exe = std::env::current_exe().unwrap();
    let name = exe.file_name().unwrap().to_string_lossy();
    let cmdlines = sb.ok("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '");
    assert!(!cmdlines.contains(name.as_ref()), "{cmdlines}");
    // PID 1 is the agent, not the host's init.
    assert!(
        sb.ok("cat /proc/1/cmdline | tr '\\0' ' '")
            .starts_with("/sbin/belljar-agent")
    );
}

#[test]
fn other_sandboxes_are_not_reachable() {
    let tmp = tmpdir();
    let a = Sandbox::launch(tmp.path(), "esc-a", Limits::default());
    let b = Sandbox::launch(tmp.path(), "esc-b", Limits::default());
    let tag = unique();
    a.ok(&format!(
        "echo a > /workspace/secret-{tag}; echo a > /tmp/secret-{tag}"
    ));
    a.ok("sleep 4242 >/dev/null 2>&1 &");
    a.ok("nc -ll -p 5555 -e /bin/cat >/dev/null 2>&1 &");
    // Controls: A reaches its own listener and sees its own process, with the very commands
    // that must fail from B.
    eventually("A to reach its own listener", || {
        a.succeeds("belljar-probe connect-tcp 127.0.0.1:5555")
    });
    let processes = "cat /proc/[0-9]*/cmdline | tr '\\0' ' '";
    eventually("A to see its own sleep 4242", || {
        a.sh(processes).text.contains("sleep 4242")
    });
    let found = b.ok(&format!(
        "find / -path /proc -prune -o -path /sys -prune -o -name 'secret-{tag}' -print"
    ));
    assert_eq!(found, "");
    assert!(!b.sh(processes).text.contains("4242"), "B sees A's process");
    assert!(!b.succeeds(&format!("ls {}", a.spec.state_dir.display())));
    assert!(!b.succeeds(&format!(
        "belljar-probe connect {}",
        a.running.socket.display()
    )));
    assert!(
        !b.succeeds("belljar-probe connect-tcp 127.0.0.1:5555"),
        "B reached A's loopback"
    );
    // As root, different id blocks: A's root is not B's root on the host. (Rootless, both
    // are the user's subordinate range; the namespaces above keep them apart.)
    if nix::unistd::Uid::effective().is_root() {
        assert_ne!(a.running.root_uid, b.running.root_uid);
        assert!(a.running.root_uid.abs_diff(b.running.root_uid) >= 65536);
    }
    assert_ne!(a.ok("hostname"), b.ok("hostname"));
}

#[test]
fn host_sockets_and_loopback_are_not_reachable() {
    let tmp = tmpdir();
    let tag = unique();
    let path = tmp.path().join("daemon.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    use std::os::linux::net::SocketAddrExt;
    let abstract_name = format!("belljar-escape-{tag}");
    let _abstract =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(&abstract_name).unwrap()).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let sb = Sandbox::launch(tmp.path(), "esc-sock", Limits::default());
    // Controls: the probe works, on a socket the sandbox made and on its loopback.
    sb.ok("belljar-probe listen /tmp/own.sock >/dev/null 2>&1 &");
    eventually("the sandbox's own socket to listen", || {
        sb.succeeds("belljar-probe connect /tmp/own.sock")
    });
    sb.ok("nc -ll -p 7777 -e /bin/cat >/dev/null 2>&1 &");
    eventually("the sandbox's own loopback listener", || {
        sb.succeeds("belljar-probe connect-tcp 127.0.0.1:7777")
    });
    // The host's sockets, by path, by abstract name (per network namespace) and on loopback.
    assert!(!sb.succeeds(&format!("belljar-probe connect {}", path.display())));
    assert!(!sb.succeeds(&format!("belljar-probe connect-abstract {abstract_name}")));
    assert!(!sb.succeeds(&format!("belljar-probe connect-tcp 127.0.0.1:{port}")));
    // Its only interfaces: loopback and the tap that leads to the daemon's userspace stack,
    // which the sandbox makes when its starter may open /dev/net/tun: root always, an
    // ordinary user where it is 0666 as udev leaves it (the rootless job's L1, which has no
    // udev, makes it so only after doctor's check of it).
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .is_ok();
    let interfaces = if tun { "eth0\nlo" } else { "lo" };
    assert_eq!(
        sb.ok("ls /sys/class/net"),
        interfaces,
        "tun openable: {tun}"
    );
    // And the host can still reach them (the test is not vacuous).
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
}

/// The `pids.events` file of the group that holds `pid`: in the v1 `pids` hierarchy when
/// there is one, else in the unified (v2) hierarchy.
fn pids_events(pid: u32) -> PathBuf {
    belljar_namespace::cgroup::group_of(pid, "pids")
        .expect("no cgroup hierarchy with pids")
        .join("pids.events")
}

#[test]
fn fork_bomb_hits_the_pids_limit() {
    let tmp = tmpdir();
    let limits = Limits {
        pids: Some(64),
        disk_bytes: None,
        cpu: Some(0.5),
        memory_bytes: Some(256 << 20),
    };
    let bomb = Sandbox::launch(tmp.path(), "esc-bomb", limits);
    let other = Sandbox::launch(
        tmp.path(),
        "esc-calm",
        Limits {
            pids: Some(64),
            ..limits
        },
    );
    assert!(
        bomb.running.limits.pids.is_enforced(),
        "{:?}",
        bomb.running.limits
    );
    // Every process forks forever, so the bomb cannot die out when forks start failing.
    // The kernel counts each fork refused at the limit in `pids.events` and notifies watchers
    // of that file; the test waits for that event. The kernel itself keeps the population at
    // or under `pids.max`, so the limit set is what the test checks.
    let events = pids_events(bomb.running.pid);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |e| {
        let _ = tx.send(e);
    })
    .unwrap();
    notify::Watcher::watch(&mut watcher, &events, notify::RecursiveMode::NonRecursive).unwrap();
    bomb.ok("sh -c 'f() { while :; do f & done; }; f' >/dev/null 2>&1 &");
    let deadline = Instant::now() + T;
    loop {
        let usage = belljar_namespace::usage(&bomb.spec.state_dir).unwrap();
        if usage.pids_denied.unwrap_or(0) > 0 {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left)
            .unwrap_or_else(|e| panic!("fork bomb never reached the limit ({e}): {usage:?}"))
            .unwrap();
    }
    let max = std::fs::read_to_string(events.with_file_name("pids.max")).unwrap();
    assert_eq!(max.trim(), "64");
    // The daemon's stand-in (this process) and the other sandbox still work.
    let started = Instant::now();
    assert_eq!(other.ok("echo calm"), "calm");
    assert!(Command::new("true").status().unwrap().success());
    assert!(started.elapsed() < Duration::from_secs(10));
    let host_pids = std::fs::read_dir("/proc").unwrap().count();
    assert!(host_pids < 32768, "host flooded with processes");
    // Stopping the bombed sandbox ends every process in it.
    belljar_namespace::stop(&bomb.spec.state_dir, Duration::from_millis(100)).unwrap();
    assert!(
        belljar_namespace::adopt(&bomb.spec.state_dir)
            .unwrap()
            .is_none()
    );
    assert_eq!(other.ok("echo still calm"), "still calm");
}

#[test]
fn memory_hog_is_killed_inside_its_cgroup() {
    let tmp = tmpdir();
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        ..Default::default()
    };
    let hog = Sandbox::launch(tmp.path(), "esc-hog", limits);
    let other = Sandbox::launch(tmp.path(), "esc-neighbour", limits);
    assert!(
        hog.running.limits.memory.is_enforced(),
        "{:?}",
        hog.running.limits
    );
    let out = hog.sh("a=xxxxxxxxxxxxxxxx; while true; do a=$a$a; done");
    assert_eq!(out.code, 137, "the hog is SIGKILLed: {}", out.text);
    let usage = belljar_namespace::usage(&hog.spec.state_dir).unwrap();
    assert!(usage.oom_kills.unwrap_or(0) >= 1, "{usage:?}");
    assert!(usage.memory_peak_bytes.unwrap() <= 64 << 20, "{usage:?}");
    // The sandbox's PID 1, the neighbour and this process live on.
    assert_eq!(hog.ok("echo alive"), "alive");
    assert_eq!(other.ok("echo fine"), "fine");
    let neighbour = belljar_namespace::usage(&other.spec.state_dir).unwrap();
    assert_eq!(neighbour.oom_kills.unwrap_or(0), 0);
}

/// A key of the sandbox's `cpu.stat` (v1 `cpu` hierarchy or v2 group, as [`pids_events`]).
fn cpu_stat(pid: u32, key: &str) -> u64 {
    let dir = belljar_namespace::cgroup::group_of(pid, "cpu").expect("no cgroup with cpu");
    let text = std::fs::read_to_string(dir.join("cpu.stat")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {}: {text}", dir.display()))
}

#[test]
fn cpu_hog_is_held_to_its_quota() {
    let tmp = tmpdir();
    let limits = Limits {
        cpu: Some(0.2),
        ..Default::default()
    };
    let hog = Sandbox::launch(tmp.path(), "esc-cpu", limits);
    let how = match &hog.running.limits.cpu {
        belljar_namespace::LimitStatus::Enforced { how } => how.clone(),
        other => panic!("CPU limit not enforced: {other:?}"),
    };
    eprintln!("cpu limit: {how}");
    let pid = hog.running.pid;
    // Two spinning processes: unthrottled they would take both of this machine's cores (or
    // whatever the load leaves), so what bounds them is the quota, which the kernel proves by
    // counting the periods it stopped the group in (`nr_throttled`).
    hog.ok("for i in 1 2; do (while :; do :; done) >/dev/null 2>&1 & done");
    let cpu_usec = || {
        belljar_namespace::usage(&hog.spec.state_dir)
            .unwrap()
            .cpu_usec
            .expect("no CPU accounting")
    };
    eventually("the first throttled period", || {
        cpu_stat(pid, "nr_throttled") >= 1
    });
    let (t0, used0, throttled0) = (Instant::now(), cpu_usec(), cpu_stat(pid, "nr_throttled"));
    // At least a second and ten more throttled periods (each period is 100 ms).
    eventually("ten more throttled periods", || {
        cpu_stat(pid, "nr_throttled") >= throttled0 + 10 && t0.elapsed() >= Duration::from_secs(1)
    });
    let wall = t0.elapsed().as_secs_f64();
    let used = (cpu_usec() - used0) as f64 / 1e6;
    let share = used / wall;
    eprintln!("cpu: {used:.3} s of CPU in {wall:.3} s ({share:.2} CPUs) under a 0.2 quota ({how})");
    // The quota plus one period's burst over the window, with room for sampling skew.
    assert!(share <= 0.3, "{share:.2} CPUs used under a 0.2 CPU quota");
}

/// Benchmark, not a timed test: `launch()` → first command's output, 20 times, p50.
/// `cargo test -p belljar-e2e --test escape -- --ignored --nocapture bench_create_to_first_command`
#[test]
#[ignore = "benchmark"]
fn bench_create_to_first_command() {
    let tmp = tmpdir();
    let mut times = Vec::new();
    for i in 0..20 {
        let start = Instant::now();
        let sb = Sandbox::launch(tmp.path(), &format!("bench-{i}"), Limits::default());
        let ready = start.elapsed();
        assert_eq!(sb.ok("echo first"), "first");
        times.push(start.elapsed());
        if std::env::var_os("BELLJAR_BENCH_VERBOSE").is_some() {
            let first = start.elapsed();
            let again = Instant::now();
            sb.ok("echo second");
            println!(
                "launch+connect {ready:?}, first command {first:?}, second {:?}",
                again.elapsed()
            );
        }
    }
    times.sort();
    let driver = if real_agent().is_some() {
        "belljar-agent"
    } else {
        "stand-in agent"
    };
    println!(
        "create → first command ({driver}) over 20: p50 {:.1} ms, min {:.1} ms, max {:.1} ms",
        times[10].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[19].as_secs_f64() * 1e3
    );
}
