//! Test fixtures for this crate's tests and the end-to-end escape tests: a busybox root
//! filesystem, a tiny static stand-in for the agent, and a client for it.
//!
//! The stand-in exists so that the backend can be tested without the real agent: it is PID 1,
//! listens on the agent socket and runs one `/bin/sh -c` command per connection. It is not
//! used outside tests.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{PermissionsExt, chown, symlink};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Errors building fixtures or talking to the stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Build(String),
    #[error("The stand-in's reply has no exit status: {0:?}")]
    Reply(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

const STANDIN_SRC: &str = include_str!("standin.rs");

/// Where test fixtures are cached between tests of one machine.
pub fn fixture_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "belljar-ns-fixtures-{}",
        nix::unistd::Uid::effective()
    ))
}

/// Compiles the stand-in agent (statically linked) into `dir`, once per source version.
pub fn standin_agent(dir: &Path) -> Result<PathBuf, Error> {
    let hash = STANDIN_SRC.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let out = dir.join(format!("belljar-standin-{hash:016x}"));
    if out.is_file() {
        return Ok(out);
    }
    fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
    let src = dir.join(format!("standin-{hash:016x}-{}.rs", std::process::id()));
    fs::write(&src, STANDIN_SRC).map_err(io_err("write the stand-in source"))?;
    let tmp = dir.join(format!(".standin-{}", std::process::id()));
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(&rustc)
        .args([
            "--edition=2024",
            "-O",
            "-C",
            "target-feature=+crt-static",
            "-o",
        ])
        .arg(&tmp)
        .arg(&src)
        .output()
        .map_err(io_err(format!("run {rustc}")))?;
    let _ = fs::remove_file(&src);
    if !output.status.success() {
        return Err(Error::Build(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .map_err(io_err("chmod the stand-in"))?;
    fs::rename(&tmp, &out).map_err(io_err("install the stand-in"))?;
    Ok(out)
}

/// Builds a minimal image tree in `dir` (once): busybox with its applets, `/etc/passwd` with
/// `root` and `belljar` (1000), `/workspace` owned by 1000, and `probe` (the stand-in, which
/// also answers `connect PATH`, `connect-abstract NAME`, `connect-tcp ADDR:PORT`) in `/usr/local/bin/belljar-probe`.
pub fn busybox_rootfs(dir: &Path, probe: &Path) -> Result<PathBuf, Error> {
    let done = dir.join(".complete");
    if done.exists() {
        return Ok(dir.to_owned());
    }
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Build("busybox not found: install busybox-static".into()))?;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(parent).map_err(io_err("create the fixture directory"))?;
    let tmp = parent.join(format!(".rootfs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    for d in [
        "bin",
        "sbin",
        "etc",
        "root",
        "home/belljar",
        "workspace",
        "tmp",
        "proc",
        "sys",
        "dev",
        "run",
        "usr/local/bin",
        "var/tmp",
    ] {
        fs::create_dir_all(tmp.join(d)).map_err(io_err(format!("create {d}")))?;
    }
    // Exact modes whatever the umask: the image is used by other users (uid 1000, rootless).
    for d in [
        "",
        "bin",
        "sbin",
        "etc",
        "home",
        "home/belljar",
        "workspace",
        "proc",
        "sys",
        "dev",
        "run",
        "usr",
        "usr/local",
        "usr/local/bin",
        "var",
    ] {
        fs::set_permissions(tmp.join(d), fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("chmod {d}")))?;
    }
    fs::copy(busybox, tmp.join("bin/busybox")).map_err(io_err("copy busybox"))?;
    fs::copy(probe, tmp.join("usr/local/bin/belljar-probe")).map_err(io_err("copy probe"))?;
    for (file, mode) in [
        ("bin/busybox", 0o755),
        ("usr/local/bin/belljar-probe", 0o755),
    ] {
        let _ = fs::set_permissions(tmp.join(file), fs::Permissions::from_mode(mode));
    }
    let list = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(io_err("busybox --list"))?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && !applet.is_empty() {
            let _ = symlink("busybox", tmp.join("bin").join(applet));
        }
    }
    let files = [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nbelljar:x:1000:1000::/home/belljar:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
        ),
        (
            "etc/group",
            "root:x:0:\ntty:x:5:\nbelljar:x:1000:\nnogroup:x:65534:\n",
        ),
        ("etc/hostname", "busybox\n"),
        ("workspace/hello.txt", "hello from the image\n"),
    ];
    for (path, text) in files {
        fs::write(tmp.join(path), text).map_err(io_err(format!("write {path}")))?;
        fs::set_permissions(tmp.join(path), fs::Permissions::from_mode(0o644))
            .map_err(io_err(format!("chmod {path}")))?;
    }
    for (path, mode) in [("root", 0o700), ("tmp", 0o1777), ("var/tmp", 0o1777)] {
        fs::set_permissions(tmp.join(path), fs::Permissions::from_mode(mode))
            .map_err(io_err(format!("chmod {path}")))?;
    }
    if nix::unistd::Uid::effective().is_root() {
        for path in ["home/belljar", "workspace", "workspace/hello.txt"] {
            chown(tmp.join(path), Some(1000), Some(1000))
                .map_err(io_err(format!("chown {path}")))?;
        }
    }
    fs::write(tmp.join(".complete"), "").map_err(io_err("mark complete"))?;
    match fs::rename(&tmp, dir) {
        Ok(()) => Ok(dir.to_owned()),
        // Another test built it at the same time.
        Err(_) if done.exists() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(dir.to_owned())
        }
        Err(e) => Err(io_err("install the rootfs")(e)),
    }
}

/// The image tree and stand-in agent, built once per machine: `(rootfs, agent)`.
///
/// Safe to call from many test threads and processes at once: builders take a lock file.
pub fn fixtures() -> Result<(PathBuf, PathBuf), Error> {
    static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fixture_dir();
    fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .map_err(io_err(format!("chmod {}", dir.display())))?;
    let lock = fs::File::create(dir.join(".lock")).map_err(io_err("create the fixture lock"))?;
    // SAFETY: flock on an fd we own; released when `lock` is dropped at the end.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } < 0 {
        return Err(io_err("lock the fixtures")(io::Error::last_os_error()));
    }
    let agent = standin_agent(&dir)?;
    // The image holds a copy of the stand-in (as the probe), so it follows its version.
    let version = agent
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rootfs = busybox_rootfs(&dir.join(format!("rootfs-{version}")), &agent)?;
    Ok((rootfs, agent))
}

/// The output and exit code of a shell command run by the stand-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub code: i32,
    pub text: String,
}

/// Runs `/bin/sh -c cmd` in the sandbox through the stand-in at `socket`. Background
/// processes must not keep stdout open (`cmd >/dev/null 2>&1 &`), or this waits for them.
pub fn shell(socket: &Path, cmd: &str, timeout: Duration) -> Result<Output, Error> {
    let mut conn =
        UnixStream::connect(socket).map_err(io_err(format!("connect {}", socket.display())))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(io_err("set timeout"))?;
    conn.write_all(cmd.as_bytes())
        .map_err(io_err("send the command"))?;
    conn.shutdown(std::net::Shutdown::Write)
        .map_err(io_err("shutdown"))?;
    let mut reply = Vec::new();
    conn.read_to_end(&mut reply)
        .map_err(io_err("read the reply"))?;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (text, tail) = reply
        .rsplit_once("\0EXIT ")
        .ok_or_else(|| Error::Reply(reply.clone()))?;
    let code = tail
        .trim()
        .parse()
        .map_err(|_| Error::Reply(reply.clone()))?;
    Ok(Output {
        code,
        text: text.to_owned(),
    })
}

/// The files under `dir` that loop devices read (`/sys/block/loop*/loop/backing_file`), so
/// that tests can see which disks are attached and that none is left behind.
pub fn loop_files_under(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = crate::disk::loop_backing_files()
        .into_iter()
        .filter(|f| f.starts_with(dir))
        .map(|f| f.to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}
