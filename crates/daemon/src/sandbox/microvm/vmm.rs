//! Running one `belljar-vmm` process per microVM sandbox: its JSON config, the writable
//! layer disk, the process itself (in its own process group, so it outlives the daemon), and
//! finding it again after a daemon restart by pid and start time.
//!
//! Layout of the sandbox's state directory: `vm.json` (the config), `layer.ext4` (the
//! writable layer, `/dev/vdb`), `vsock.sock` (hybrid vsock to the agent), `vmm.sock` (the
//! control socket), `console.log`, `vmm.json` (pid and start time).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use belljar_agent_proto::mounts::{GuestMount, GuestMounts, MOUNTS_ENV};
use belljar_vmm_api::config::{DiskConfig, SerialConfig, VmConfig, VsockConfig};
use belljar_vmm_api::{ControlClient, DEFAULT_CMDLINE, MAX_VCPUS};
use serde::{Deserialize, Serialize};

// The API may never accept more vCPUs than one microVM can have.
const _: () = assert!(belljar_api::limits::MAX_VCPUS <= MAX_VCPUS as u32);

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// No kernel was found for microVMs.
    #[error("No microVM kernel: build one with guest-images/kernel/build.sh or set BELLJAR_KERNEL")]
    NoKernel,
    /// The image has no ext4 root disk.
    #[error("The image has no rootfs.ext4 at {0}")]
    NoDisk(PathBuf),
    /// The sandbox's settings do not make a valid VM config.
    #[error("Invalid microVM settings: {0}")]
    Config(#[from] belljar_vmm_api::config::Error),
    /// `mkfs.ext4` could not be run.
    #[error("Cannot run mkfs.ext4 for the writable layer (install e2fsprogs)")]
    NoMkfs(#[source] std::io::Error),
    /// `mkfs.ext4` ran and failed; what it printed.
    #[error("mkfs.ext4 could not make the writable layer: {stderr}")]
    Mkfs {
        status: std::process::ExitStatus,
        stderr: String,
    },
    /// The VMM refused or did not answer a control request (pause, resume).
    #[error("The VMM's control socket: {0}")]
    Control(#[from] belljar_vmm_api::client::ClientError),
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmmError {
    let what = what.into();
    move |source| VmmError::Io { what, source }
}

/// What a microVM needs from the daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSpec {
    pub vmm: PathBuf,
    pub kernel: PathBuf,
    pub root_disk: PathBuf,
    pub state_dir: PathBuf,
    pub hostname: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_mib: u64,
    /// Extra `KEY=value` settings for the agent, passed on the kernel command line (the kernel
    /// hands them to init as its environment); values must not contain spaces.
    pub agent_env: Vec<(String, String)>,
    /// Read-only ext4 disks of snapshot layers, topmost first: `/dev/vdc`, `/dev/vdd`, ...
    /// in the guest, which the agent stacks between its writable layer and the image.
    pub lower_disks: Vec<PathBuf>,
    /// Directory snapshots the agent mounts at boot, each from one read-only disk listed
    /// after the layer disks.
    pub mounts: Vec<VmMount>,
}

/// A directory snapshot mounted in the microVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmMount {
    /// Names the mount's upper directory on the writable layer (stable across starts).
    pub slot: usize,
    /// The snapshot's layers as one read-only ext4 disk.
    pub disk: PathBuf,
    /// Absolute path in the sandbox.
    pub path: String,
}

/// The live VMM process, as recorded in `vmm.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmProcess {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`, so a recycled pid is not mistaken for the VMM.
    pub start_time: u64,
}

/// The newest `vmlinux` under `<cache>/kernel/*/`.
pub fn find_kernel(cache: &Path) -> Option<PathBuf> {
    std::fs::read_dir(cache.join("kernel"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("vmlinux"))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

/// The kernel command line: the VMM's default, the image's root read-only, the agent as
/// init, its settings.
pub fn cmdline(hostname: &str, now_ms: i64) -> String {
    format!(
        "{DEFAULT_CMDLINE} root=/dev/vda ro rootfstype=ext4 \
         init=/sbin/belljar-agent BELLJAR_MODE=microvm BELLJAR_HOSTNAME={hostname} \
         BELLJAR_CLOCK_MS={now_ms}"
    )
}

/// The `belljar-vmm` config of a sandbox, checked as far as it can be without the VMM.
pub fn config(spec: &VmSpec, now_ms: i64) -> Result<VmConfig, VmmError> {
    let dir = &spec.state_dir;
    let mut agent_env = spec.agent_env.clone();
    if !spec.lower_disks.is_empty() {
        agent_env.push((
            LOWER_DEVICES_ENV.into(),
            lower_devices(spec.lower_disks.len()),
        ));
    }
    let mut disks = vec![
        DiskConfig {
            path: spec.root_disk.clone(),
            read_only: true,
            id: "root".into(),
        },
        DiskConfig {
            path: dir.join("layer.ext4"),
            read_only: false,
            id: "layer".into(),
        },
    ];
    disks.extend(
        spec.lower_disks
            .iter()
            .enumerate()
            .map(|(i, path)| DiskConfig {
                path: path.clone(),
                read_only: true,
                id: format!("lower{i}"),
            }),
    );
    if !spec.mounts.is_empty() {
        let first = spec.lower_disks.len();
        let mounts = spec
            .mounts
            .iter()
            .enumerate()
            .map(|(i, m)| GuestMount {
                slot: m.slot,
                devices: vec![PathBuf::from(guest_disk(first + i))],
                path: m.path.clone(),
            })
            .collect();
        agent_env.push((MOUNTS_ENV.into(), GuestMounts(mounts).to_string()));
        disks.extend(spec.mounts.iter().map(|m| DiskConfig {
            path: m.disk.clone(),
            read_only: true,
            id: format!("mount{}", m.slot),
        }));
    }
    let config = VmConfig {
        kernel: Some(spec.kernel.clone()),
        cmdline: agent_env
            .iter()
            .fold(cmdline(&spec.hostname, now_ms), |line, (k, v)| {
                format!("{line} {k}={v}")
            }),
        memory_mib: spec.memory_mib,
        // Out of range becomes 0, which `validate_values` refuses with the range in the message.
        vcpus: u8::try_from(spec.vcpus).unwrap_or(0),
        disks,
        vsock: Some(VsockConfig {
            guest_cid: belljar_vmm_api::config::DEFAULT_GUEST_CID,
            uds_path: dir.join("vsock.sock"),
        }),
        rng: true,
        serial: SerialConfig {
            log: Some(dir.join("console.log")),
            echo: false,
        },
        control_socket: Some(dir.join("vmm.sock")),
        // The guest's eth0: frames go to the daemon's stack over this socket, so the VMM
        // opens no network socket of its own.
        net: Some(belljar_vmm_api::net::NetConfig {
            socket: dir.join(crate::sandbox::network::NET_SOCKET),
            mac: belljar_vmm_api::net::MacAddr(belljar_network::config::GUEST_MAC),
            mtu: u16::try_from(belljar_network::config::MTU).unwrap_or(1500),
        }),
        seccomp: true,
        ..Default::default()
    };
    config.validate_values()?;
    Ok(config)
}

/// The VMM's config in a sandbox's state directory, as [`launch`] wrote it.
const CONFIG_FILE: &str = "vm.json";

/// Reads back the config [`launch`] wrote for the microVM in `state_dir`.
pub fn read_config(state_dir: &Path) -> Result<VmConfig, belljar_vmm_api::config::Error> {
    VmConfig::from_file(&state_dir.join(CONFIG_FILE))
}

/// The agent's setting that names the snapshot layers' disks (`/dev/vdc,/dev/vdd`, topmost
/// first); the agent mounts each read-only and stacks them under its writable layer.
pub const LOWER_DEVICES_ENV: &str = "BELLJAR_LOWER_DEVICES";

/// The guest's names of `count` layer disks after the root (`vda`) and writable (`vdb`) ones:
/// virtio-blk disks are named in the order the VM config lists them.
pub fn lower_devices(count: usize) -> String {
    (0..count).map(guest_disk).collect::<Vec<_>>().join(",")
}

/// The guest's name of the `n`th read-only disk after the root and writable ones (a microVM
/// has far fewer than the 24 letters left).
fn guest_disk(n: usize) -> String {
    format!(
        "/dev/vd{}",
        char::from(b'c'.saturating_add(u8::try_from(n).unwrap_or(u8::MAX)))
    )
}

/// Field 22 (starttime) of `/proc/<pid>/stat`, for a live (not zombie, not dead) process.
pub fn start_time(pid: u32) -> Option<u64> {
    use procfs_core::FromRead;
    let stat = procfs_core::process::Stat::from_file(format!("/proc/{pid}/stat")).ok()?;
    (!matches!(stat.state, 'Z' | 'X')).then_some(stat.starttime)
}

/// What a VMM process uses, as the host kernel counts it: figures the guest cannot set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmUsage {
    /// Resident memory (`VmRSS`): the guest RAM the VM has touched and the VMM's own.
    pub rss_bytes: Option<u64>,
    /// The most resident memory since it started (`VmHWM`).
    pub peak_rss_bytes: Option<u64>,
    /// User and system time of all its threads, the vCPUs' guest time included.
    pub cpu_usec: u64,
}

/// What the VMM of `state_dir` uses now, from `/proc/<pid>/status` and `stat`; `None` when
/// it no longer runs. The start time in `stat`, read last, tells that both files were the
/// VMM's and not those of a process that took over its pid.
pub fn usage(state_dir: &Path) -> Result<Option<VmmUsage>, VmmError> {
    use procfs_core::FromRead;
    use procfs_core::process::{Stat, Status};
    let Some(proc) = adopt(state_dir) else {
        return Ok(None);
    };
    let read = || -> procfs_core::ProcResult<(Status, Stat)> {
        let status = Status::from_file(format!("/proc/{}/status", proc.pid))?;
        let stat = Stat::from_file(format!("/proc/{}/stat", proc.pid))?;
        Ok((status, stat))
    };
    let (status, stat) = match read() {
        Ok((status, stat)) if stat.starttime == proc.start_time => (status, stat),
        // Its pid is another process's now.
        Ok(_) => return Ok(None),
        // It ended while it was read.
        Err(_) if adopt(state_dir).is_none() => return Ok(None),
        Err(e) => {
            return Err(VmmError::Io {
                what: format!("Cannot read the VMM's usage in /proc/{}", proc.pid),
                source: std::io::Error::other(e),
            });
        }
    };
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    Ok(Some(VmmUsage {
        rss_bytes: status.vmrss.map(|kib| kib.saturating_mul(1024)),
        peak_rss_bytes: status.vmhwm.map(|kib| kib.saturating_mul(1024)),
        cpu_usec: (stat.utime + stat.stime).saturating_mul(1_000_000) / ticks,
    }))
}

/// Starts the VMM for `spec`; returns once the process runs.
pub fn launch(spec: &VmSpec, now_ms: i64) -> Result<VmmProcess, VmmError> {
    let dir = &spec.state_dir;
    std::fs::create_dir_all(dir).map_err(io_err("Cannot create the state directory"))?;
    if !spec.root_disk.is_file() {
        return Err(VmmError::NoDisk(spec.root_disk.clone()));
    }
    let config = config(spec, now_ms)?;
    make_layer(&dir.join("layer.ext4"), spec.disk_mib)?;
    let config_path = dir.join(CONFIG_FILE);
    std::fs::write(&config_path, config.to_json()).map_err(io_err("Cannot write the VM config"))?;
    let log =
        std::fs::File::create(dir.join("vmm.log")).map_err(io_err("Cannot create vmm.log"))?;
    let log2 = log.try_clone().map_err(io_err("Cannot create vmm.log"))?;
    let mut child = Command::new(&spec.vmm)
        .arg("--config")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: a signal to the daemon's group does not reach the VM.
        .process_group(0)
        .spawn()
        .map_err(io_err(format!("Cannot start {}", spec.vmm.display())))?;
    let pid = child.id();
    // Reap it when it ends while this daemon lives; after a restart, init does.
    std::thread::spawn(move || {
        // How it ended (a signal such as SIGSYS from its seccomp filter, an exit status) is
        // nowhere else: the log says it.
        match child.wait() {
            Ok(status) => tracing::info!(pid, %status, "belljar-vmm ended"),
            Err(e) => tracing::warn!(pid, error = %e, "cannot wait for belljar-vmm"),
        }
    });
    let start_time = start_time(pid).ok_or_else(|| VmmError::Io {
        what: "belljar-vmm exited at once; see vmm.log".into(),
        source: std::io::Error::other("no such process"),
    })?;
    let proc = VmmProcess { pid, start_time };
    let text =
        serde_json::to_string(&proc).map_err(|e| io_err("Cannot write vmm.json")(e.into()))?;
    std::fs::write(dir.join("vmm.json"), text).map_err(io_err("Cannot write vmm.json"))?;
    Ok(proc)
}

/// A sparse ext4 file of `mib` MiB for the writable layer (kept when it exists).
fn make_layer(path: &Path, mib: u64) -> Result<(), VmmError> {
    if path.exists() {
        return Ok(());
    }
    let file = std::fs::File::create(path).map_err(io_err("Cannot create the layer disk"))?;
    file.set_len(mib << 20)
        .map_err(io_err("Cannot size the layer disk"))?;
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"])
        .arg(path)
        .output()
        .map_err(VmmError::NoMkfs)?;
    if !out.status.success() {
        let _ = std::fs::remove_file(path);
        return Err(VmmError::Mkfs {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// The VMM of `state_dir`, if it still runs.
pub fn adopt(state_dir: &Path) -> Option<VmmProcess> {
    let text = std::fs::read(state_dir.join("vmm.json")).ok()?;
    let proc: VmmProcess = serde_json::from_slice(&text).ok()?;
    (start_time(proc.pid) == Some(proc.start_time)).then_some(proc)
}

/// Stops the VMM: `stop` on its control socket (or SIGTERM), SIGKILL after `grace`.
pub fn stop(state_dir: &Path, grace: Duration) -> Result<(), VmmError> {
    let Some(proc) = adopt(state_dir) else {
        return Ok(());
    };
    let stopped = ControlClient::connect(&state_dir.join("vmm.sock"), CONTROL_TIMEOUT)
        .and_then(|mut c| c.stop());
    if stopped.is_err() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(proc.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + grace;
    while start_time(proc.pid) == Some(proc.start_time) {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(proc.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            std::thread::sleep(Duration::from_millis(50));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Pauses every vCPU of the running VM (its memory, devices and disks stay as they are);
/// returns once they are all paused.
pub fn pause(state_dir: &Path) -> Result<(), VmmError> {
    ControlClient::connect(&state_dir.join("vmm.sock"), CONTROL_TIMEOUT)?.pause()?;
    Ok(())
}

/// Lets a paused VM run on (a no-op on a running one).
pub fn resume(state_dir: &Path) -> Result<(), VmmError> {
    ControlClient::connect(&state_dir.join("vmm.sock"), CONTROL_TIMEOUT)?.resume()?;
    Ok(())
}

/// Whether the VM's vCPUs are paused (`false` when it does not answer).
pub fn is_paused(state_dir: &Path) -> bool {
    ControlClient::connect(&state_dir.join("vmm.sock"), CONTROL_TIMEOUT)
        .and_then(|mut c| c.status())
        .is_ok_and(|s| {
            matches!(
                s.state,
                belljar_vmm_api::control::VmState::Paused
                    | belljar_vmm_api::control::VmState::Pausing
            )
        })
}

/// How long a control request may take before the daemon falls back to signals.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
#[path = "vmm_tests.rs"]
mod tests;
