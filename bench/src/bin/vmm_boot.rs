//! Boot figures for `belljar-vmm` (printed, never pass/fail):
//!
//! - process start to the first guest instruction, with a tiny guest that writes one byte
//!   to the serial port (echoed to the VMM's stdout) as its first instruction;
//! - process start to exit for a tiny guest that resets at once (the VMM's whole
//!   start-up and tear-down);
//! - the VMM's RSS beyond guest memory (tiny guest, read from the control socket);
//! - with a kernel: boot to kernel start and to an init marker under belljar-vmm and, for
//!   reference in the same run, under `qemu-system-x86_64 -M microvm,rtc=on,acpi=off`
//!   without KVM.
//!
//! Usage: `cargo build --release -p belljar-vmm -p belljar-bench &&
//!         target/release/vmm_boot [--runs N] [--kernel VMLINUX] [--linux-timeout SECS]`
//! The kernel defaults to `BELLJAR_KERNEL` or the newest kernel cached by
//! `guest-images/kernel/build.sh`; the root disk is a small ext4 with busybox as init (needs busybox-static and
//! mkfs.ext4), printing a marker and rebooting.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use belljar_vmm_api::{ControlClient, ExitReason};
use clap::Parser;

const MARKER: &str = "BELLJAR-INIT-MARKER";

#[derive(Parser)]
#[command(about = "Boot figures for belljar-vmm (and QEMU microvm for reference)")]
struct Args {
    /// Runs per tiny-guest figure.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Guest kernel (vmlinux); default BELLJAR_KERNEL or the newest cached project kernel.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Give up on a Linux boot after this many seconds.
    #[arg(long, default_value_t = 120)]
    linux_timeout: u64,
    /// Skip the Linux boots.
    #[arg(long)]
    no_linux: bool,
    /// Skip the Linux boot under belljar-vmm (only QEMU), e.g. on software KVM.
    #[arg(long)]
    no_vmm_linux: bool,
}

/// The host TSC frequency in kHz from /proc/cpuinfo; TCG guests cannot calibrate it.
fn host_tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "float to int saturates, which is what is wanted"
    )]
    let khz = (mhz * 1000.0) as u64;
    Some(khz)
}

fn vmm_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BELLJAR_VMM") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let p = exe.with_file_name("belljar-vmm");
    if p.exists() {
        return Ok(p);
    }
    bail!(
        "{} not found: build it with `cargo build --release -p belljar-vmm` or set BELLJAR_VMM",
        p.display()
    )
}

/// `out 0x3f8, 'X'` first, then either reset or sleep with interrupts off.
fn tiny_guest(dir: &Path, reset: bool) -> Result<PathBuf> {
    let mut code = vec![0x66, 0xba, 0xf8, 0x03, 0xb0, b'X', 0xee];
    if reset {
        code.extend([0xb0, 0xfe, 0xe6, 0x64]);
    }
    code.extend([0xfa, 0xf4]);
    let p = dir.join(if reset { "reset.bin" } else { "sleep.bin" });
    std::fs::write(&p, code)?;
    Ok(p)
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    let median = v[v.len() / 2];
    format!(
        "median {:.2} ms, min {:.2} ms, max {:.2} ms (n={})",
        median,
        v[0],
        v[v.len() - 1],
        v.len()
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn first_instruction(vmm: &Path, guest: &Path) -> Result<(f64, f64)> {
    let t = Instant::now();
    let mut child = Command::new(vmm)
        .arg("--kernel")
        .arg(guest)
        .args(["--boot", "raw", "--memory-mib", "128", "--no-rng", "--echo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut b = [0u8; 1];
    out.read_exact(&mut b)?;
    let first = ms(t.elapsed());
    let status = child.wait()?;
    let exit = ms(t.elapsed());
    if b[0] != b'X' || ExitReason::from_exit_code(status.code()) != Some(ExitReason::Reset) {
        bail!("unexpected tiny guest result: {:?} {status}", b[0] as char);
    }
    Ok((first, exit))
}

fn rss(vmm: &Path, guest: &Path, dir: &Path) -> Result<(u64, u64)> {
    let sock = dir.join("ctl.sock");
    let mut child = Command::new(vmm)
        .arg("--kernel")
        .arg(guest)
        .args(["--boot", "raw", "--memory-mib", "128", "--no-rng"])
        .arg("--control-socket")
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let t = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        if t.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            bail!("control socket never appeared");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut ctl = ControlClient::connect(&sock, Duration::from_secs(5))?;
    let m = ctl.metrics()?;
    let _ = ctl.stop();
    child.wait()?;
    Ok((m.rss_bytes, m.guest_memory_bytes))
}

/// `--kernel`, else `BELLJAR_KERNEL`, else the newest cached project kernel. The build script
/// is not run here: it may take minutes or wait for another build's lock.
fn find_kernel(arg: Option<PathBuf>) -> Option<PathBuf> {
    if let Some(k) = arg.or_else(|| std::env::var_os("BELLJAR_KERNEL").map(PathBuf::from)) {
        return Some(k).filter(|p| p.exists());
    }
    let cache = std::env::var_os("BELLJAR_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| Path::new(&c).join("belljar")))
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/belljar")))?;
    std::fs::read_dir(cache.join("kernel"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("vmlinux"))
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

/// A tiny root filesystem whose init prints the marker and reboots.
fn busybox_rootfs(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("bin"))?;
    std::fs::create_dir_all(root.join("dev"))?;
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .context("copy /bin/busybox (install busybox-static)")?;
    let init = root.join("init");
    std::fs::write(
        &init,
        format!("#!/bin/busybox sh\n/bin/busybox echo {MARKER}\n/bin/busybox reboot -f\n"),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let img = dir.join("rootfs.ext4");
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&root)
        .arg(&img)
        .arg("16M")
        .status()?
        .success();
    if !ok {
        bail!("mkfs.ext4 failed");
    }
    Ok(img)
}

/// What a Linux boot reached.
struct Boot {
    kernel_ms: Option<f64>,
    init_ms: Option<f64>,
    /// Set when the process ended on its own before the marker.
    early_exit: Option<std::process::ExitStatus>,
}

/// Watches `child`'s console (stdout) for the kernel banner and the marker.
fn watch_boot(mut child: Child, t: Instant, timeout: Duration) -> Boot {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = Vec::new();
        while r
            .read_until(b'\n', &mut line)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            let s = String::from_utf8_lossy(&line).to_string();
            if tx.send((s, Instant::now())).is_err() {
                break;
            }
            line.clear();
        }
    });
    let (mut kernel, mut init) = (None, None);
    let deadline = t + timeout;
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((line, at)) => {
                if kernel.is_none() && line.contains("Linux version") {
                    kernel = Some(ms(at - t));
                }
                if line.contains(MARKER) {
                    init = Some(ms(at - t));
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    // The console closing before the deadline means the process is ending on its own.
    let mut early_exit = None;
    if init.is_none() && Instant::now() < deadline {
        let until = Instant::now() + Duration::from_secs(2);
        while early_exit.is_none() && Instant::now() < until {
            early_exit = child.try_wait().ok().flatten();
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Boot {
        kernel_ms: kernel,
        init_ms: init,
        early_exit,
    }
}

fn show(boot: &Boot, timeout: u64) -> String {
    let part = |label: &str, v: Option<f64>| match (v, boot.early_exit) {
        (Some(ms), _) => format!("{label} {ms:.0} ms"),
        (None, Some(status)) => format!("{label} not reached (exited first: {status})"),
        (None, None) => format!("{label} not reached within {timeout} s"),
    };
    format!(
        "{}, {}",
        part("kernel banner", boot.kernel_ms),
        part("init marker", boot.init_ms)
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let vmm = vmm_binary()?;
    let dir = tempfile::tempdir()?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let hw = std::fs::read_to_string("/proc/cpuinfo")
        .map(|c| c.split_whitespace().any(|f| f == "vmx" || f == "svm"))
        .unwrap_or(false);
    println!(
        "machine: {cpu}, {} cpus, /dev/kvm {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        if hw {
            "hardware (vmx/svm)"
        } else {
            "software (no vmx/svm)"
        }
    );
    println!("vmm: {}", vmm.display());

    let reset = tiny_guest(dir.path(), true)?;
    let sleep = tiny_guest(dir.path(), false)?;
    let mut first = Vec::new();
    let mut exit = Vec::new();
    for _ in 0..args.runs {
        let (f, e) = first_instruction(&vmm, &reset)?;
        first.push(f);
        exit.push(e);
    }
    println!(
        "tiny guest, process start -> first guest instruction (serial byte on stdout): {}",
        stats(first)
    );
    println!(
        "tiny guest, process start -> exit after guest reset: {}",
        stats(exit)
    );
    let (rss, guest) = rss(&vmm, &sleep, dir.path())?;
    println!(
        "tiny guest, VMM RSS: {:.1} MiB with {} MiB guest memory (guest pages touched: a few KiB, so ~all of it is VMM overhead)",
        rss as f64 / (1 << 20) as f64,
        guest >> 20
    );

    if args.no_linux {
        return Ok(());
    }
    let Some(kernel) = find_kernel(args.kernel) else {
        println!("linux: no kernel (run guest-images/kernel/build.sh, or pass --kernel)");
        return Ok(());
    };
    let rootfs = busybox_rootfs(dir.path())?;
    // earlyprintk: the banner appears when the kernel starts, not when the console registers.
    let cmdline = "console=ttyS0 earlyprintk=serial,ttyS0 reboot=k panic=1 pci=off root=/dev/vda ro init=/init";
    println!("linux: kernel {}", kernel.display());
    let timeout = Duration::from_secs(args.linux_timeout);

    if !args.no_vmm_linux {
        let t = Instant::now();
        let child = Command::new(&vmm)
            .arg("--kernel")
            .arg(&kernel)
            .args(["--memory-mib", "256", "--echo", "--cmdline", cmdline])
            .arg("--disk")
            .arg(format!("{},ro", rootfs.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let boot = watch_boot(child, t, timeout);
        println!(
            "linux under belljar-vmm (KVM): {}",
            show(&boot, args.linux_timeout)
        );
    }

    // Without KVM the guest cannot calibrate its TSC (no PIT/HPET on microvm): tell it.
    let qemu_cmdline = match host_tsc_khz() {
        Some(khz) => format!("{cmdline} tsc=reliable tsc_early_khz={khz}"),
        None => cmdline.to_string(),
    };

    let t = Instant::now();
    let child = Command::new("qemu-system-x86_64")
        // acpi=off: QEMU announces the devices on the command line, as belljar-vmm does.
        .args([
            "-M",
            "microvm,rtc=on,acpi=off",
            "-m",
            "256",
            "-nographic",
            "-no-reboot",
            "-nodefaults",
        ])
        .args(["-serial", "stdio", "-kernel"])
        .arg(&kernel)
        .args(["-append", &qemu_cmdline])
        .args([
            "-drive",
            &format!(
                "id=root,file={},format=raw,if=none,readonly=on",
                rootfs.display()
            ),
        ])
        .args(["-device", "virtio-blk-device,drive=root"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start qemu-system-x86_64 (install qemu-system-x86)")?;
    let boot = watch_boot(child, t, timeout);
    println!(
        "linux under qemu-system-x86_64 -M microvm,rtc=on,acpi=off (TCG, no KVM): {}",
        show(&boot, args.linux_timeout)
    );
    Ok(())
}
