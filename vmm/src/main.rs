//! `belljar-vmm`: one microVM per process. Parses the configuration, starts the VM and
//! turns its end into an exit status.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use belljar_vmm::builder::Vmm;
use belljar_vmm::config::{
    BootMode, DEFAULT_GUEST_CID, DiskConfig, SerialConfig, VmConfig, VsockConfig,
};
use belljar_vmm::exit::ExitReason;
use belljar_vmm::hypervisor::kvm::KvmHypervisor;
use belljar_vmm_api::exit::{CONFIG_ERROR_STATUS, RESTORE_ERROR_STATUS};
use clap::Parser;

const AFTER_HELP: &str = r#"CONFIG FILE (--config, JSON; flags override its fields):
  {
    "kernel": "/path/vmlinux",        required; vmlinux ELF (PVH or 64-bit entry) or bzImage
    "boot": "linux",                  "linux" (default) or "raw" (flat code at 1 MiB, tests)
    "cmdline": "console=ttyS0 ...",   kernel command line; virtio_mmio.device= entries are
                                      appended automatically (default: console=ttyS0
                                      reboot=k panic=1 pci=off nomodule i8042.noaux ...)
    "memory_mib": 256,                guest RAM in MiB (>= 1)
    "vcpus": 1,                       1..32
    "disks": [                        virtio-blk, in order: /dev/vda, /dev/vdb, ...
      {"path": "/img/root.ext4", "read_only": true, "id": "root"},
      {"path": "/sbx/rw.ext4", "read_only": false}
    ],
    "vsock": {"guest_cid": 3, "uds_path": "/sbx/vsock.sock"},
    "net": {"socket": "/sbx/net.sock", "mac": "02:62:6a:00:00:02", "mtu": 1500},
                                      virtio-net; its frames go over the socket (below)
    "rng": true,                      virtio-rng from the host's /dev/urandom
    "serial": {"log": "/sbx/console.log", "echo": false},
    "control_socket": "/sbx/vmm.sock",
    "seccomp": true                   install the seccomp filter once the VM runs
  }

VSOCK (hybrid, like Firecracker):
  guest connects to host port P   ->  VMM connects to the Unix socket <uds_path>_P
  host connects to <uds_path>, writes "CONNECT <port>\n"  ->  VMM answers "OK <host port>\n"
  once the guest listener accepts; the socket then carries the stream.

NET FRAME SOCKET (crates/vmm-api/src/net.rs is the contract):
  the VMM listens (SOCK_SEQPACKET) at "net.socket"; the daemon connects, and a new peer
  replaces the old one. One packet = one Ethernet frame (14..=mtu+14 bytes), no virtio-net
  header. Guest frames sent while no peer is connected are dropped.

CONTROL SOCKET (JSON lines, one response line per request; the types are crates/vmm-api's):
  {"cmd":"status"}   -> {"status":{"state":"running|pausing|paused|stopped","uptime_ms":N,
                        "exit_reason":null|"stopped"|"reset"|"power_off"|"failed"}}
  {"cmd":"pause"}    -> {"state":"paused"}
  {"cmd":"resume"}   -> {"state":"running"}
  {"cmd":"stop"}     -> {"state":"stopping"}   (the process then exits 0)
  {"cmd":"metrics"}  -> {"metrics":{"vcpus":[{"id","exits","io_exits","halt_exits",
                        "interrupted_exits"}],"unknown_pio","unknown_mmio","devices":[{"name",
                        "bytes_in","bytes_out","requests","errors"}],"rss_bytes",
                        "guest_memory_bytes"}}
  {"cmd":"snapshot"} with two fds (SCM_RIGHTS: the state file, then the memory file)
                     -> {"snapshot":{"state_bytes":N,"memory_bytes":N,"elapsed_ms":N}}
                        the VM pauses while they are written, then runs on as before
  errors             -> {"error":{"code":"bad_request|unknown_command|pause_failed|
                        snapshot_failed","message":"..."}}

SNAPSHOTS:
  --restore DIR starts from DIR/vmstate and DIR/memory instead of a kernel. The config gives
  the host side (sockets, logs, disks: the same disk contents as at the snapshot) and must
  have the snapshot's memory, vCPUs and devices. Memory is mapped copy-on-write, so many VMMs
  may restore one snapshot (fork); none of them changes its files. Open vsock connections
  are reset (new ones work). A refused snapshot exits 3 with its code on stderr (another VMM
  version, another CPU model, a bad checksum, a truncated file, ...).

EXIT STATUS:
  0   stopped (control "stop", SIGTERM or SIGINT)
  1   VMM or vCPU failure (e.g. KVM emulation error)
  2   bad configuration or arguments (one-line message on stderr)
  3   --restore refused the snapshot (the stderr line ends with its code)
  10  guest reset / reboot (i8042 reset, triple fault)
  11  guest power-off: a byte written to I/O port 0x501 (Belljar's power-off port, which
      the guest agent uses after syncing), or hlt without an interrupt controller. x86
      without ACPI has no standard power-off device.

A host whose /dev/kvm is software-based (no vmx/svm CPU flag, e.g. PVM) is reported in one
line at start. There guest kernel code is emulated (about 1.6M instructions/s); the guest gets
no CX16 in CPUID and `noxsave` on its command line, which takes Linux further, but the
emulator still stops at the kernel's int3 self-test: use hardware KVM to run Linux guests."#;

/// Belljar's microVM monitor: boots one Linux guest on KVM with virtio-mmio devices.
#[derive(Parser, Debug)]
#[command(name = "belljar-vmm", version, after_help = AFTER_HELP)]
struct Args {
    /// JSON configuration file (schema below).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Kernel image (vmlinux or bzImage).
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Boot mode: linux or raw.
    #[arg(long, value_parser = ["linux", "raw"])]
    boot: Option<String>,
    /// Kernel command line (virtio_mmio.device= entries are appended).
    #[arg(long)]
    cmdline: Option<String>,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB")]
    memory_mib: Option<u64>,
    /// Number of vCPUs.
    #[arg(long)]
    vcpus: Option<u8>,
    /// Disk: PATH[,ro][,id=NAME]; repeat for more disks (replaces the config's disks).
    #[arg(long, value_name = "SPEC")]
    disk: Vec<String>,
    /// Hybrid vsock Unix socket path.
    #[arg(long, value_name = "PATH")]
    vsock_uds: Option<PathBuf>,
    /// Guest vsock CID (default 3).
    #[arg(long, value_name = "CID")]
    vsock_cid: Option<u64>,
    /// Disable virtio-rng.
    #[arg(long)]
    no_rng: bool,
    /// Serial console log file.
    #[arg(long, value_name = "PATH")]
    serial_log: Option<PathBuf>,
    /// Echo the serial console to stdout.
    #[arg(long)]
    echo: bool,
    /// Control socket path.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Do not install the seccomp filter.
    #[arg(long)]
    no_seccomp: bool,
    /// Start from the snapshot in DIR instead of booting a kernel.
    #[arg(long, value_name = "DIR")]
    restore: Option<PathBuf>,
}

fn parse_disk(spec: &str) -> anyhow::Result<DiskConfig> {
    let mut parts = spec.split(',');
    let path = parts
        .next()
        .filter(|p| !p.is_empty())
        .context("empty --disk")?;
    let mut disk = DiskConfig {
        path: PathBuf::from(path),
        read_only: false,
        id: String::new(),
    };
    for opt in parts {
        match opt {
            "ro" => disk.read_only = true,
            "rw" => disk.read_only = false,
            _ if opt.starts_with("id=") => disk.id = opt[3..].to_string(),
            _ => anyhow::bail!("Unknown --disk option {opt:?}"),
        }
    }
    Ok(disk)
}

fn build_config(args: &Args) -> anyhow::Result<VmConfig> {
    let mut c = match &args.config {
        Some(p) => VmConfig::from_file(p)?,
        None => VmConfig::default(),
    };
    if let Some(k) = &args.kernel {
        c.kernel = Some(k.clone());
    }
    if let Some(b) = &args.boot {
        c.boot = if b == "raw" {
            BootMode::Raw
        } else {
            BootMode::Linux
        };
    }
    if let Some(s) = &args.cmdline {
        c.cmdline = s.clone();
    }
    if let Some(m) = args.memory_mib {
        c.memory_mib = m;
    }
    if let Some(v) = args.vcpus {
        c.vcpus = v;
    }
    if !args.disk.is_empty() {
        c.disks = args
            .disk
            .iter()
            .map(|d| parse_disk(d))
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(p) = &args.vsock_uds {
        c.vsock = Some(VsockConfig {
            guest_cid: args.vsock_cid.unwrap_or(DEFAULT_GUEST_CID),
            uds_path: p.clone(),
        });
    } else if let (Some(cid), Some(v)) = (args.vsock_cid, c.vsock.as_mut()) {
        v.guest_cid = cid;
    }
    if args.no_rng {
        c.rng = false;
    }
    if args.serial_log.is_some() || args.echo {
        c.serial = SerialConfig {
            log: args.serial_log.clone().or(c.serial.log.clone()),
            echo: args.echo || c.serial.echo,
        };
    }
    if let Some(p) = &args.control_socket {
        c.control_socket = Some(p.clone());
    }
    if args.no_seccomp {
        c.seccomp = false;
    }
    if args.restore.is_some() {
        c.validate_for_restore()?;
    } else {
        c.validate()?;
    }
    Ok(c)
}

/// How the VM comes to be: booted, or restored (a refused snapshot has its own status).
enum StartError {
    Restore(belljar_vmm::snapshot::Error),
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for StartError {
    fn from(e: E) -> Self {
        StartError::Other(e.into())
    }
}

static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    TERMINATE.store(true, Ordering::SeqCst);
}

fn run(config: &VmConfig, restore: Option<&std::path::Path>) -> Result<ExitReason, StartError> {
    // Before anything the outside world can observe (guest output, the control socket), so
    // that a SIGTERM sent once the VM is seen running always means a clean stop (status 0).
    for sig in [libc::SIGTERM, libc::SIGINT] {
        vmm_sys_util::signal::register_signal_handler(sig, on_terminate)
            .context("Cannot install signal handlers")?;
    }
    let hv = KvmHypervisor::new()?;
    let vmm = match restore {
        Some(dir) => Vmm::restore(config, &hv, dir).map_err(StartError::Restore)?,
        None => Vmm::start(config, &hv)?,
    };
    let mut accept_fds = vmm.listener_fds.clone();
    if let Some(path) = &config.control_socket {
        accept_fds.push(belljar_vmm::control::serve(path, Arc::clone(&vmm))?);
    }
    if config.seccomp {
        // Open /proc/self/statm while open() is still allowed.
        let _ = belljar_vmm::metrics::rss_bytes();
        belljar_vmm::seccomp::install_all_threads(&accept_fds)?;
    }
    let reason = loop {
        if let Some(r) = vmm.wait(Duration::from_millis(100)) {
            break r;
        }
        if TERMINATE.load(Ordering::SeqCst) {
            vmm.request_stop();
        }
    };
    vmm.shutdown();
    Ok(reason)
}

fn main() -> ExitCode {
    let args = Args::parse();
    // `info` by default: the VMM logs at that level only the few events of a VM's life (a
    // restore, and why it ended: reset by the i8042, a triple fault, halt, power-off), which
    // vmm.log must hold when a sandbox dies unexpectedly.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match build_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("belljar-vmm: {e:#}");
            return ExitCode::from(CONFIG_ERROR_STATUS);
        }
    };
    if belljar_vmm::hypervisor::host_has_hw_virt() == Some(false) {
        eprintln!(
            "belljar-vmm: this host's /dev/kvm is software-based (no vmx/svm CPU flag): guest kernel code is emulated, slowly, and an unmodified Linux kernel will not finish booting"
        );
    }
    match run(&config, args.restore.as_deref()) {
        Ok(reason) => ExitCode::from(reason.exit_code()),
        Err(StartError::Restore(e)) => {
            let code = e.code();
            eprintln!(
                "belljar-vmm: cannot restore the snapshot: {:#} ({code})",
                anyhow::Error::from(e)
            );
            ExitCode::from(RESTORE_ERROR_STATUS)
        }
        Err(StartError::Other(e)) => {
            eprintln!("belljar-vmm: {e:#}");
            ExitCode::from(1)
        }
    }
}
