//! The seccomp filter every sandbox process runs under.
//!
//! The sandbox shares the host's kernel, so system calls that reach host-wide state or large
//! attack surface are refused with `EPERM`, in the spirit of Docker's default profile: kernel
//! modules, kexec, reboot, the kernel keyring, bpf, perf, handle-based opens (the "shocker"
//! escape), swap, accounting, clocks, raw I/O ports, NUMA policy, userfaultfd, io_uring, new
//! namespaces (`unshare`, `setns`, `clone` with `CLONE_NEW*`) and the new mount API. `clone3`
//! answers `ENOSYS` so that libc falls back to `clone`, whose flags the filter can see.
//!
//! libseccomp (the library runc and podman use) compiles the program. It also closes the two
//! ways around a system-call list: a foreign architecture kills the process, and so does a
//! call through the x32 ABI (its numbers carry bit 30, so they would match nothing in the
//! list). The program is built in the daemon and handed to the sandbox's first process as
//! plain BPF, because that process installs it after `clone`, where it may not allocate.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::FromRawFd;

use libc::sock_filter;
use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

/// Errors building the filter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("libseccomp refused the filter: {0}")]
    Build(#[from] libseccomp::error::SeccompError),
    #[error("Could not read back the compiled seccomp filter: {0}")]
    Export(#[source] io::Error),
    #[error("The compiled seccomp filter is {0} bytes, not a whole number of instructions")]
    Malformed(usize),
}

/// System calls refused with `EPERM`, by name (for documentation and tests) and number.
pub const DENIED: &[(&str, libc::c_long)] = &[
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("quotactl", libc::SYS_quotactl),
    ("nfsservctl", libc::SYS_nfsservctl),
    ("uselib", libc::SYS_uselib),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("vhangup", libc::SYS_vhangup),
    ("syslog", libc::SYS_syslog),
    ("_sysctl", libc::SYS__sysctl),
    ("ustat", libc::SYS_ustat),
    ("mbind", libc::SYS_mbind),
    ("set_mempolicy", libc::SYS_set_mempolicy),
    ("migrate_pages", libc::SYS_migrate_pages),
    ("move_pages", libc::SYS_move_pages),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("pivot_root", libc::SYS_pivot_root),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("mount_setattr", libc::SYS_mount_setattr),
];

/// `clone` flags that make new namespaces; `clone` with any of them is refused.
const CLONE_NAMESPACE_FLAGS: [libc::c_int; 8] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
    0x80, // CLONE_NEWTIME
];

fn syscall(nr: libc::c_long) -> ScmpSyscall {
    // System call numbers are small positive integers; libc's constants are wider only by type.
    ScmpSyscall::from(i32::try_from(nr).expect("system call numbers are small"))
}

/// [`program`], built once per process and copied for each launch: the filter never changes,
/// and libseccomp compiled and exported it at every launch.
pub fn shared_program() -> Result<Vec<sock_filter>, Error> {
    static PROGRAM: std::sync::OnceLock<Vec<sock_filter>> = std::sync::OnceLock::new();
    if let Some(built) = PROGRAM.get() {
        return Ok(built.clone());
    }
    let built = program()?;
    Ok(PROGRAM.get_or_init(|| built).clone())
}

/// Builds the filter program.
pub fn program() -> Result<Vec<sock_filter>, Error> {
    let mut filter = ScmpFilterContext::new(ScmpAction::Allow)?;
    filter.set_act_badarch(ScmpAction::KillProcess)?;
    let eperm = ScmpAction::Errno(libc::EPERM);
    for (_, nr) in DENIED {
        filter.add_rule(eperm, syscall(*nr))?;
    }
    filter.add_rule(ScmpAction::Errno(libc::ENOSYS), syscall(libc::SYS_clone3))?;
    // One rule per flag: rules for one call are alternatives, and a masked compare tests
    // one flag exactly.
    for flag in CLONE_NAMESPACE_FLAGS {
        let flag = flag as u64;
        let has_flag = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(flag), flag);
        filter.add_rule_conditional(eperm, syscall(libc::SYS_clone), &[has_flag])?;
    }
    compiled(&filter)
}

/// The filter as BPF instructions, read back through a memory file (libseccomp 2.5, Debian
/// 12's, exports only to a descriptor).
fn compiled(filter: &ScmpFilterContext) -> Result<Vec<sock_filter>, Error> {
    // SAFETY: the name is a valid C string; the result is checked before use.
    let fd = unsafe { libc::memfd_create(c"belljar-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Export(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let mut file = unsafe { File::from_raw_fd(fd) };
    filter.export_bpf(&file)?;
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0)).map_err(Error::Export)?;
    file.read_to_end(&mut bytes).map_err(Error::Export)?;
    let size = size_of::<sock_filter>();
    if bytes.is_empty() || bytes.len() % size != 0 {
        return Err(Error::Malformed(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(size)
        .map(|insn| sock_filter {
            code: u16::from_ne_bytes([insn[0], insn[1]]),
            jt: insn[2],
            jf: insn[3],
            k: u32::from_ne_bytes([insn[4], insn[5], insn[6], insn[7]]),
        })
        .collect())
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
