//! What the agent does to the system it runs: the mount plan of each mode, hostname, clock,
//! loopback, and ending the sandbox. Plain mode (tests, any user) never calls into this
//! module's mounting or rebooting code.

use std::path::Path;
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::config::{Config, Mode};

/// Where the microVM's writable layer and the overlay root are assembled before pivoting.
const LAYER: &str = "/run/belljar/layer";
const NEW_ROOT: &str = "/run/belljar/root";
/// Where snapshot layers' disks are mounted (`<LOWER>/<n>`, topmost first).
const LOWER: &str = "/run/belljar/lower";

#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    /// A mount failed.
    #[error("Cannot mount {fstype} on {target}")]
    Mount {
        fstype: String,
        target: String,
        #[source]
        source: nix::Error,
    },
    /// Another system call failed.
    #[error("Cannot {what}")]
    Sys {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    /// A file operation failed.
    #[error("Cannot {what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> SystemError {
    move |source| SystemError::Sys { what, source }
}

pub(crate) fn mount_fs(
    source: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), SystemError> {
    let _ = std::fs::create_dir_all(target);
    match mount(Some(source), target, Some(fstype), flags, data) {
        // The kernel may have mounted devtmpfs already (CONFIG_DEVTMPFS_MOUNT).
        Err(nix::errno::Errno::EBUSY) => Ok(()),
        r => r.map_err(|source| SystemError::Mount {
            fstype: fstype.into(),
            target: target.into(),
            source,
        }),
    }
}

/// /proc, /sys, /dev, /dev/pts, /dev/shm, /tmp and /run, as a microVM's init mounts them.
/// The VM's RAM is the sandbox's memory limit and tmpfs pages cannot be swapped out, so `/tmp`
/// gets half of it and `/dev/shm` a quarter: a writer that fills them gets ENOSPC while the
/// agent and the commands keep memory to run (the namespace backend sizes them the same way).
fn mount_pseudo() -> Result<(), SystemError> {
    let secure = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount_fs("proc", "/proc", "proc", secure, None)?;
    mount_fs("sysfs", "/sys", "sysfs", secure, None)?;
    mount_fs(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )?;
    mount_fs(
        "devpts",
        "/dev/pts",
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("gid=5,mode=0620,ptmxmode=0666"),
    )?;
    mount_fs(
        "shm",
        "/dev/shm",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=25%"),
    )?;
    mount_fs(
        "tmpfs",
        "/tmp",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=50%"),
    )?;
    mount_fs(
        "tmpfs",
        "/run",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )?;
    let _ = std::os::unix::fs::symlink("/proc/self/fd", "/dev/fd");
    Ok(())
}

/// The microVM's mount plan: pseudo filesystems, the writable layer (`layer_device`, or a
/// tmpfs when the VM has none), the overlay of the read-only image and the layer, a pivot into
/// it, and the pseudo filesystems again inside.
pub fn microvm_init(config: &Config) -> Result<(), SystemError> {
    mount::<str, str, str, str>(None, "/", None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)
        .map_err(sys("make / private"))?;
    mount_pseudo()?;
    if let Some(ms) = config.clock_ms {
        set_clock(ms)?;
    }
    let device = config.layer_device.to_string_lossy().into_owned();
    let on_disk = Path::new(&device).exists()
        && mount_fs(&device, LAYER, "ext4", MsFlags::MS_NOATIME, None)
            .inspect_err(|e| eprintln!("belljar-agent: {e}: {:?}; using a tmpfs layer", e))
            .is_ok();
    if !on_disk {
        mount_fs("layer", LAYER, "tmpfs", MsFlags::empty(), Some("mode=0755"))?;
    }
    for dir in ["upper", "work"] {
        let _ = std::fs::create_dir_all(Path::new(LAYER).join(dir));
    }
    let data = overlay_options(&mount_lowers(&config.lower_devices)?);
    mount_fs(
        "overlay",
        NEW_ROOT,
        "overlay",
        MsFlags::empty(),
        Some(&data),
    )?;
    if let Some(mounts) = &config.mounts {
        crate::mounts::mount_all(&mounts.0, NEW_ROOT, LAYER)?;
    }
    nix::unistd::chdir(NEW_ROOT).map_err(sys("enter the new root"))?;
    nix::unistd::pivot_root(".", ".").map_err(sys("pivot_root"))?;
    // The old root is stacked under the new one at "."; detaching it drops its mounts too.
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach the old root"))?;
    nix::unistd::chdir("/").map_err(sys("enter /"))?;
    mount_pseudo()?;
    finish_init(config)
}

/// Mounts the snapshot layers' disks read-only; returns their mount points, topmost first.
fn mount_lowers(devices: &[std::path::PathBuf]) -> Result<Vec<String>, SystemError> {
    let ro = MsFlags::MS_RDONLY | MsFlags::MS_NOATIME;
    devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            let target = format!("{LOWER}/{i}");
            mount_fs(&device.to_string_lossy(), &target, "ext4", ro, None)?;
            Ok(target)
        })
        .collect()
}

/// The overlay's options: the snapshot layers (topmost first) over the image, the writable
/// layer on top. Layers carry overlayfs's marks as `user.overlay.*` attributes (the form both
/// backends share), which `userxattr` reads; without layers the options stay as they were,
/// so a writable layer made before keeps its `trusted.overlay.*` marks meaningful.
fn overlay_options(lowers: &[String]) -> String {
    let mut lowerdir = lowers.join(":");
    if !lowerdir.is_empty() {
        lowerdir.push(':');
    }
    lowerdir.push('/');
    let mut data = format!("lowerdir={lowerdir},upperdir={LAYER}/upper,workdir={LAYER}/work");
    if !lowers.is_empty() {
        data.push_str(",userxattr");
    }
    data
}

/// The namespace sandbox's mount plan: its root is already in place, so only what a fresh
/// PID namespace needs: /proc, a private /dev/pts, /dev/shm, and /tmp when it is not writable.
/// The backend may have mounted these already, or dropped the capabilities to do so, so
/// every step is best effort: a failure is logged and the agent serves on. Without
/// CAP_SYS_ADMIN (Belljar's backend drops it once its PID 1 has mounted all of these) no
/// mount could succeed, so none is tried.
pub fn namespace_init(config: &Config) -> Result<(), SystemError> {
    if may_mount() {
        namespace_mounts();
    }
    if !Path::new("/dev/ptmx").exists() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
    if let Err(e) = finish_init(config) {
        tracing::warn!("{e}: {}", source_of(&e));
    }
    Ok(())
}

/// Whether CAP_SYS_ADMIN is in this process's bounding set, without which it cannot mount.
fn may_mount() -> bool {
    const CAP_SYS_ADMIN: libc::c_ulong = 21;
    // SAFETY: PR_CAPBSET_READ only reads this process's bounding set; no pointer is passed.
    unsafe { libc::prctl(libc::PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) == 1 }
}

fn namespace_mounts() {
    let secure = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let plan: [(&str, &str, &str, MsFlags, Option<&str>); 3] = [
        ("proc", "/proc", "proc", secure, None),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        ),
        (
            "shm",
            "/dev/shm",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        ),
    ];
    for (source, target, fstype, flags, data) in plan {
        // A /proc inherited from outside shows the wrong PID namespace: always mount a fresh
        // one. An existing devpts or shm stays (the backend's /dev/ptmx may point into it).
        if fstype != "proc" && mounted(target, fstype) {
            continue;
        }
        if let Err(e) = mount_fs(source, target, fstype, flags, data) {
            tracing::warn!("{e}: {}", source_of(&e));
        }
    }
    if nix::unistd::access("/tmp", nix::unistd::AccessFlags::W_OK).is_err() {
        let data = Some("mode=1777");
        if let Err(e) = mount_fs(
            "tmpfs",
            "/tmp",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            data,
        ) {
            tracing::warn!("{e}: {}", source_of(&e));
        }
    }
}

fn source_of(e: &SystemError) -> String {
    std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// Whether `target` is a mount point of `fstype` (from /proc/self/mountinfo).
fn mounted(target: &str, fstype: &str) -> bool {
    // Two fields parsed by hand, not with `procfs`: the agent, in every sandbox, stays small.
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-");
        fields.get(4) == Some(&target) && sep.and_then(|i| fields.get(i + 1)) == Some(&fstype)
    })
}

fn finish_init(config: &Config) -> Result<(), SystemError> {
    // The image's /etc/hostname unless the sandbox names itself.
    let name = config.hostname.clone().or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
    });
    // The namespace backend's PID 1 set it already, and then gave up the right to.
    let current = nix::unistd::gethostname().ok();
    if let Some(name) = name
        && current.as_deref().and_then(|c| c.to_str()) != Some(name.as_str())
    {
        nix::unistd::sethostname(name).map_err(sys("set the hostname"))?;
    }
    loopback_up()?;
    let _ = std::fs::create_dir_all("/run/belljar");
    Ok(())
}

fn set_clock(unix_ms: i64) -> Result<(), SystemError> {
    let ts = nix::sys::time::TimeSpec::new(unix_ms / 1000, (unix_ms % 1000) * 1_000_000);
    nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts).map_err(sys("set the clock"))
}

/// Brings `lo` up with the SIOCSIFFLAGS ioctl, so no `ip` binary is needed.
pub fn loopback_up() -> Result<(), SystemError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    use std::os::fd::AsRawFd;
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(sys("open a socket for lo"))?;
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `ifr`, a valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(SystemError::Sys {
            what: "read the flags of lo",
            source: nix::Error::last(),
        });
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the IFF_ flags are small c_int constants of a c_short field"
    )]
    const UP: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: after SIOCGIFFLAGS the `ifru_flags` member of the union is the initialised one.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= UP;
    }
    // SAFETY: SIOCSIFFLAGS reads the name and flags from `ifr`, a valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(SystemError::Sys {
            what: "bring lo up",
            source: nix::Error::last(),
        });
    }
    Ok(())
}

/// Prepares the system for `config`'s mode; nothing in plain mode.
pub fn init(config: &Config) -> Result<(), SystemError> {
    match config.mode() {
        Mode::Microvm if std::process::id() == 1 => microvm_init(config)?,
        Mode::Namespace => namespace_init(config)?,
        _ => return Ok(()),
    }
    // A sandbox without network still serves: the daemon reports what is missing.
    if let Some(net) = &config.net
        && let Err(e) = crate::net::setup(net)
    {
        tracing::warn!("network: {e}: {}", crate::net::source_of(&e));
    }
    if let Some(pem) = &config.ca_pem
        && let Err(e) = crate::ca::install(pem)
    {
        let why = std::error::Error::source(&e).map(ToString::to_string);
        tracing::warn!("{e}: {}", why.unwrap_or_default());
    }
    if config.mode() == Mode::Namespace
        && let Err(e) = crate::net::drop_net_admin()
    {
        tracing::warn!("{e}: {}", crate::net::source_of(&e));
    }
    protect_from_oom();
    Ok(())
}

/// Takes the agent out of the OOM killer's choice: when the sandbox runs out of memory, a
/// command must die, not PID 1, whose death ends the sandbox. In a microVM the agent may set
/// this itself; in a namespace sandbox only a host holding CAP_SYS_RESOURCE may lower it (the
/// backend does, before the agent starts), so this then only confirms it. Where nobody could
/// lower it, commands are raised to the maximum instead (which needs no privilege), so that
/// they are still chosen before the agent.
fn protect_from_oom() {
    const PATH: &str = "/proc/self/oom_score_adj";
    let state = match std::fs::write(PATH, "-1000") {
        Ok(()) => OOM_AGENT_PROTECTED,
        Err(e) => {
            let now = std::fs::read_to_string(PATH).unwrap_or_default();
            tracing::warn!(
                "cannot protect the agent from the OOM killer ({e}); oom_score_adj is {}; \
                 commands get 1000 instead",
                now.trim()
            );
            OOM_COMMANDS_RAISED
        }
    };
    OOM_STATE.store(state, std::sync::atomic::Ordering::Relaxed);
}

const OOM_UNTOUCHED: u8 = 0;
const OOM_AGENT_PROTECTED: u8 = 1;
const OOM_COMMANDS_RAISED: u8 = 2;

static OOM_STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(OOM_UNTOUCHED);

/// The `oom_score_adj` every command must start with, so that the OOM killer picks commands
/// before the agent: `0` when the agent is at -1000, `1000` when it could not be lowered, and
/// none (inherit) when the agent is not the sandbox's init.
pub fn command_oom_score() -> Option<&'static [u8]> {
    match OOM_STATE.load(std::sync::atomic::Ordering::Relaxed) {
        OOM_AGENT_PROTECTED => Some(b"0"),
        OOM_COMMANDS_RAISED => Some(b"1000"),
        _ => None,
    }
}

/// Ends the sandbox as its mode wants: a microVM's init stops every process, syncs and powers
/// off or reboots; a namespace sandbox's init kills everything in its PID namespace and exits.
/// Elsewhere only the agent itself exits (its commands are killed by the caller).
pub fn end(mode: Mode, reboot: bool) -> ! {
    let pid1 = std::process::id() == 1;
    if pid1 {
        let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
        std::thread::sleep(Duration::from_millis(if mode == Mode::Microvm {
            500
        } else {
            100
        }));
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    }
    nix::unistd::sync();
    if pid1 && mode == Mode::Microvm {
        if !reboot {
            power_off_port();
        }
        let how = if reboot {
            nix::sys::reboot::RebootMode::RB_AUTOBOOT
        } else {
            nix::sys::reboot::RebootMode::RB_POWER_OFF
        };
        let _ = nix::sys::reboot::reboot(how);
        // Only reached if reboot(2) failed; init must not exit, so wait for the end.
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    std::process::exit(0)
}

/// Writes to `belljar-vmm`'s power-off port, which ends the VM at once. Returns only where
/// the port cannot be reached (not x86, or neither `/dev/port` nor `ioperm` works), leaving
/// `reboot(2)` to try.
fn power_off_port() {
    #[cfg(target_arch = "x86_64")]
    {
        // `/dev/port` first: the guest kernel is built without CONFIG_X86_IOPL_IOPERM, so
        // `ioperm` fails there with ENOSYS, and the VM would only halt and never end.
        if write_dev_port(std::path::Path::new("/dev/port")).is_ok() {
            return;
        }
        let port = belljar_agent_proto::POWER_OFF_PORT;
        // SAFETY: ioperm only changes this process's I/O permission bitmap.
        if unsafe { libc::ioperm(libc::c_ulong::from(port), 1, 1) } != 0 {
            return;
        }
        // SAFETY: a one-byte `out` to a port this process was just allowed; the VMM ends the
        // VM on it, and on a machine without the device the write goes nowhere.
        unsafe {
            std::arch::asm!("out dx, al", in("dx") port, in("al") 1u8, options(nomem, nostack));
        }
    }
}

/// One byte at offset [`belljar_agent_proto::POWER_OFF_PORT`] of `dev_port` (`/dev/port`,
/// where a file offset is an I/O port number).
fn write_dev_port(dev_port: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let port = std::fs::OpenOptions::new().write(true).open(dev_port)?;
    port.write_all_at(&[1], u64::from(belljar_agent_proto::POWER_OFF_PORT))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Snapshot layers go between the writable layer and the image, topmost first, read
    /// through `user.overlay.*`; without them the options are what they always were.
    #[test]
    fn snapshot_layers_stack_over_the_image() {
        assert_eq!(
            overlay_options(&[]),
            "lowerdir=/,upperdir=/run/belljar/layer/upper,workdir=/run/belljar/layer/work"
        );
        assert_eq!(
            overlay_options(&["/run/belljar/lower/0".into(), "/run/belljar/lower/1".into()]),
            "lowerdir=/run/belljar/lower/0:/run/belljar/lower/1:/,\
             upperdir=/run/belljar/layer/upper,workdir=/run/belljar/layer/work,userxattr"
        );
    }

    #[test]
    fn the_power_off_byte_goes_to_the_port_offset() {
        // A plain file stands in for /dev/port: the byte must land at offset 0x501.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("port");
        std::fs::write(&f, b"").unwrap();
        write_dev_port(&f).unwrap();
        let data = std::fs::read(&f).unwrap();
        assert_eq!(data.len(), 0x502);
        assert_eq!(data[0x501], 1);
        assert!(write_dev_port(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn sees_what_is_mounted() {
        assert!(mounted("/proc", "proc"));
        assert!(!mounted("/proc", "ext4"));
        assert!(!mounted("/no/such/mount", "proc"));
    }
}
