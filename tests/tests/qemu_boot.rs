//! Boots the project's guest kernel with the `base` image under QEMU, with
//! `belljar-agent` as init in self-check mode.
//!
//! KVM on our build machines cannot run a Linux kernel, but QEMU's TCG can, so
//! this is the test that the kernel, the image and the agent fit together: the
//! kernel finds its virtio-mmio disks from the command line, mounts the
//! read-only ext4 root, and the agent mounts the rest (proc, sys, dev, tmp and
//! the overlay of the root with a writable disk), runs a command as the
//! `belljar` user, prints `BELLJAR-SELFCHECK-OK` and powers the VM off.
//!
//! The kernel and the image are built by `guest-images/build-all.sh` (CI runs
//! it in `scripts/setup.sh`); when they are missing the test fails and says so.

// QEMU's microvm machine and the guest kernel are x86_64.
#![cfg(target_arch = "x86_64")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The marker the agent prints on the console when its self-check passed.
const MARKER: &str = "BELLJAR-SELFCHECK-OK";
/// TCG boots the kernel in seconds; the margin is for a loaded CI machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
/// Size of the writable layer disk (a sparse file, so it costs nothing).
const LAYER_BYTES: u64 = 256 << 20;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// `$BELLJAR_CACHE`, else `$XDG_CACHE_HOME/belljar`, else `~/.cache/belljar`:
/// the same rule as the build scripts.
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BELLJAR_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("belljar");
    }
    let home = std::env::var_os("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache").join("belljar")
}

/// The cached kernel for the current config, asked from the build script so
/// that the cache key is computed in one place only.
fn kernel() -> PathBuf {
    let script = repo_root().join("guest-images/kernel/build.sh");
    let out = Command::new(&script)
        .arg("--cached")
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    assert!(
        out.status.success() && Path::new(&path).is_file(),
        "the guest kernel is not built: run guest-images/build-all.sh \
         (or guest-images/kernel/build.sh) first"
    );
    PathBuf::from(path)
}

/// The current `base` image's read-only root disk.
fn base_image() -> PathBuf {
    let dir = cache_dir().join("images/base/current");
    let disk = dir.join("rootfs.ext4");
    assert!(
        disk.is_file(),
        "the base image is not built ({} is missing): run guest-images/build-all.sh \
         (or guest-images/build-image.sh base --agent PATH) first",
        disk.display()
    );
    disk
}

/// A directory removed when the test ends, pass or fail.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir =
            std::env::temp_dir().join(format!("belljar-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Self(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes the writable layer the way the host does: `mkfs.ext4` on a sparse file.
fn make_layer_disk(path: &Path) {
    let file = std::fs::File::create(path).expect("create the layer disk");
    file.set_len(LAYER_BYTES).expect("size the layer disk");
    drop(file);
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "belljar-layer"])
        .arg(path)
        .status()
        .expect("run mkfs.ext4 (apt-get install e2fsprogs)");
    assert!(status.success(), "mkfs.ext4 failed: {status}");
}

/// The host's TSC frequency in kHz, measured against the monotonic clock.
///
/// Under TCG the guest reads the host's TSC, and the guest kernel calibrates it
/// against the emulated PIT; on a loaded machine that calibration fails, the
/// kernel marks the TSC unstable and its timer stops making progress. Telling
/// it the frequency (`tsc_early_khz=`) makes the boot independent of the load,
/// and `tsc=reliable` keeps the clocksource watchdog from dropping the TSC for
/// the emulated, load-skewed PIT later on.
fn host_tsc_khz() -> u64 {
    use std::arch::x86_64::_rdtsc;
    let t0 = Instant::now();
    // SAFETY: RDTSC only reads the time-stamp counter; every x86_64 CPU has it.
    let c0 = unsafe { _rdtsc() };
    thread::sleep(Duration::from_millis(200));
    // SAFETY: as above.
    let c1 = unsafe { _rdtsc() };
    let micros = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
    (c1 - c0) * 1000 / micros.max(1)
}

/// What one boot printed and how QEMU ended.
struct Boot {
    console: String,
    exit: Option<std::process::ExitStatus>,
    elapsed: Duration,
}

/// Runs QEMU until it exits or `timeout` passes (then kills it), collecting
/// the serial console.
fn run_qemu(mut cmd: Command, timeout: Duration) -> Boot {
    let start = Instant::now();
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run qemu-system-x86_64 (apt-get install qemu-system-x86)");
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let readers: Vec<_> = [
        Box::new(child.stdout.take().expect("piped stdout")) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().expect("piped stderr")),
    ]
    .into_iter()
    .map(|mut pipe| {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        })
    })
    .collect();
    drop(tx);

    let mut exited = false;
    while start.elapsed() < timeout {
        if child.try_wait().expect("wait for qemu").is_some() {
            exited = true;
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    if !exited {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait for qemu");
    let exit = exited.then_some(status);
    for reader in readers {
        let _ = reader.join();
    }
    let bytes: Vec<u8> = rx.into_iter().flatten().collect();
    Boot {
        console: String::from_utf8_lossy(&bytes).into_owned(),
        exit,
        elapsed: start.elapsed(),
    }
}

#[test]
fn agent_self_check_boots_under_qemu() {
    let kernel = kernel();
    let root = base_image();
    let scratch = ScratchDir::new("qemu-boot");
    let layer = scratch.0.join("layer.ext4");
    make_layer_disk(&layer);

    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-M", "microvm,rtc=on", "-m", "512", "-smp", "1"])
        .args(["-nographic", "-no-reboot", "-no-user-config"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 root=/dev/vda ro rootfstype=ext4 init=/sbin/belljar-agent \
             BELLJAR_SELFCHECK=1 panic=-1 tsc=reliable tsc_early_khz={}",
            host_tsc_khz()
        ))
        .arg("-drive")
        .arg(format!(
            "id=root,file={},format=raw,if=none,readonly=on",
            root.display()
        ))
        .args(["-device", "virtio-blk-device,drive=root"])
        .arg("-drive")
        .arg(format!(
            "id=layer,file={},format=raw,if=none",
            layer.display()
        ))
        .args(["-device", "virtio-blk-device,drive=layer"]);

    let boot = run_qemu(cmd, BOOT_TIMEOUT);
    let report = format!(
        "kernel {}\nimage {}\nafter {:.1}s, qemu exit {:?}\n--- console ---\n{}",
        kernel.display(),
        root.display(),
        boot.elapsed.as_secs_f64(),
        boot.exit,
        boot.console
    );
    assert!(
        boot.exit.is_some(),
        "the VM did not power off within {BOOT_TIMEOUT:?}\n{report}"
    );
    assert!(
        !boot.console.contains("Kernel panic"),
        "the guest kernel panicked\n{report}"
    );
    assert!(
        !boot.console.contains("BELLJAR-SELFCHECK-FAILED"),
        "the agent's self-check failed\n{report}"
    );
    assert!(
        boot.console.contains(MARKER),
        "no {MARKER} on the console\n{report}"
    );
    assert!(
        boot.exit.is_some_and(|s| s.success()),
        "qemu did not exit cleanly\n{report}"
    );
    eprintln!("self-check passed in {:.1}s", boot.elapsed.as_secs_f64());
}
