//! The seccomp filter every sandbox process runs under.
//!
//! The sandbox shares the host's kernel, so system calls that reach host-wide state or large
//! attack surface are refused with `EPERM`, in the spirit of Docker's default profile: kernel
//! modules, kexec, reboot, the kernel keyring, bpf, perf, handle-based opens (the "shocker"
//! escape), swap, accounting, clocks, raw I/O ports, NUMA policy, userfaultfd, io_uring, new
//! namespaces (`unshare`, `setns`, `clone` with `CLONE_NEW*`) and the new mount API. `clone3`
//! answers `ENOSYS` so that libc falls back to `clone`, whose flags the filter can see. The
//! x32 ABI is refused outright (its numbers would slip past the list) and a foreign
//! architecture kills the process.
//!
//! The program is hand-built BPF: a flat list of comparisons, small enough to read.

use libc::sock_filter;

/// Errors building the filter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("The filter is too long for BPF jump offsets")]
    TooLong,
}

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

// struct seccomp_data { int nr; u32 arch; u64 instruction_pointer; u64 args[6]; }
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARG0_LOW: u32 = 16;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

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
const CLONE_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP
    | 0x80) as u32; // CLONE_NEWTIME

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Builds the filter program.
///
/// Layout: the checks, then `allow`, the `clone` flag check (load, test, allow), `deny` and
/// `enosys`. A check that matches jumps forward to its target.
pub fn program() -> Result<Vec<sock_filter>, Error> {
    #[derive(Clone, Copy)]
    enum Target {
        Deny,
        Enosys,
        CloneCheck,
    }
    let mut checks: Vec<(sock_filter, Option<Target>)> = vec![
        (stmt(BPF_LD_W_ABS, OFFSET_ARCH), None),
        // Right architecture: skip the kill.
        (jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0), None),
        (stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS), None),
        (stmt(BPF_LD_W_ABS, OFFSET_NR), None),
        (jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 0), Some(Target::Deny)),
    ];
    for (_, nr) in DENIED {
        checks.push((jump(BPF_JEQ_K, *nr as u32, 0, 0), Some(Target::Deny)));
    }
    checks.push((
        jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 0),
        Some(Target::Enosys),
    ));
    checks.push((
        jump(BPF_JEQ_K, libc::SYS_clone as u32, 0, 0),
        Some(Target::CloneCheck),
    ));
    let n = checks.len();
    let clone_at = n + 1;
    let deny_at = n + 4;
    let enosys_at = n + 5;
    let mut prog = Vec::with_capacity(n + 6);
    for (i, (mut insn, target)) in checks.into_iter().enumerate() {
        if let Some(target) = target {
            let to = match target {
                Target::Deny => deny_at,
                Target::Enosys => enosys_at,
                Target::CloneCheck => clone_at,
            };
            insn.jt = u8::try_from(to - i - 1).map_err(|_| Error::TooLong)?;
        }
        prog.push(insn);
    }
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    prog.push(stmt(BPF_LD_W_ABS, OFFSET_ARG0_LOW));
    // Any namespace flag: skip the allow, to deny.
    prog.push(jump(BPF_JSET_K, CLONE_NAMESPACE_FLAGS, 1, 0));
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    debug_assert_eq!(prog.len(), deny_at);
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    prog.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    Ok(prog)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BPF interpreter, enough for this program, so the tests check what it decides.
    fn run(prog: &[sock_filter], arch: u32, nr: u32, arg0: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        data[16..24].copy_from_slice(&arg0.to_ne_bytes());
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let insn = prog[pc];
            match insn.code {
                BPF_LD_W_ABS => {
                    let k = insn.k as usize;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_RET_K => return insn.k,
                BPF_JEQ_K | BPF_JGE_K | BPF_JSET_K => {
                    let hit = match insn.code {
                        BPF_JEQ_K => acc == insn.k,
                        BPF_JGE_K => acc >= insn.k,
                        _ => acc & insn.k != 0,
                    };
                    pc += 1 + if hit { insn.jt } else { insn.jf } as usize;
                }
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    const EPERM: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;

    #[test]
    fn denies_the_list_and_allows_the_rest() {
        let prog = program().unwrap();
        for (name, nr) in DENIED {
            assert_eq!(
                run(&prog, AUDIT_ARCH_X86_64, *nr as u32, 0),
                EPERM,
                "{name}"
            );
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_execve,
            libc::SYS_mount,
        ] {
            assert_eq!(
                run(&prog, AUDIT_ARCH_X86_64, nr as u32, 0),
                SECCOMP_RET_ALLOW
            );
        }
    }

    #[test]
    fn clone_with_namespaces_is_refused_and_clone3_is_enosys() {
        let prog = program().unwrap();
        let clone = libc::SYS_clone as u32;
        let fork_flags = (libc::CLONE_CHILD_SETTID | libc::SIGCHLD) as u64;
        assert_eq!(
            run(&prog, AUDIT_ARCH_X86_64, clone, fork_flags),
            SECCOMP_RET_ALLOW
        );
        let ns = fork_flags | libc::CLONE_NEWUSER as u64;
        assert_eq!(run(&prog, AUDIT_ARCH_X86_64, clone, ns), EPERM);
        let enosys = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        assert_eq!(
            run(&prog, AUDIT_ARCH_X86_64, libc::SYS_clone3 as u32, 0),
            enosys
        );
    }

    #[test]
    fn x32_and_foreign_arch() {
        let prog = program().unwrap();
        let x32_read = X32_SYSCALL_BIT | libc::SYS_read as u32;
        assert_eq!(run(&prog, AUDIT_ARCH_X86_64, x32_read, 0), EPERM);
        assert_eq!(run(&prog, 0x4000_0003, 1, 0), SECCOMP_RET_KILL_PROCESS);
    }
}
