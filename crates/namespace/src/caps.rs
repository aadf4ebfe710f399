//! Which capabilities the sandbox's root keeps.
//!
//! Inside its user namespace the sandbox's root starts with every capability over the
//! namespace's own objects. It keeps Docker's default set, which is what package managers,
//! `sudo`, `chown` and servers need, plus [`AGENT_NEEDS`]; the rest (`CAP_SYS_ADMIN`: mounts,
//! hostname; `CAP_NET_ADMIN`; `CAP_SYS_MODULE`, `CAP_SYS_PTRACE`, `CAP_SYS_TIME`,
//! `CAP_SYS_BOOT`, `CAP_BPF`, ...) is dropped from the bounding set before the agent is
//! exec'd, so nothing in the sandbox can get it back.
//!
//! Capabilities inside a user namespace only ever act on objects that namespace owns (its
//! mounts, its network namespace, its hostname); the seccomp filter refuses the rest.

use std::fs;

/// Capabilities kept only for the agent's sake: `CAP_NET_ADMIN`, so that it configures the
/// sandbox's `eth0` (address, routes, MTU) with the same code in a namespace sandbox as in a
/// microVM. The agent drops it (bounding set and its own sets) once `eth0` is up, before it
/// serves, so no command ever holds it. (Mounting `/proc` and the like, which the agent also
/// tries, is done by this crate before the exec and is best effort in the agent.)
pub const AGENT_NEEDS: &[(u32, &str)] = &[(12, "CAP_NET_ADMIN")];

/// Docker's default capabilities, kept in the bounding set, by number (`capability.h`).
pub const KEPT: &[(u32, &str)] = &[
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (3, "CAP_FOWNER"),
    (4, "CAP_FSETID"),
    (5, "CAP_KILL"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (8, "CAP_SETPCAP"),
    (10, "CAP_NET_BIND_SERVICE"),
    (13, "CAP_NET_RAW"),
    (18, "CAP_SYS_CHROOT"),
    (27, "CAP_MKNOD"),
    (29, "CAP_AUDIT_WRITE"),
    (31, "CAP_SETFCAP"),
];

/// The highest capability number this kernel knows.
pub fn last_cap() -> u32 {
    fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// The capabilities to drop from the bounding set, lowest first.
pub fn dropped() -> Vec<u32> {
    let kept = |c: &u32| KEPT.iter().chain(AGENT_NEEDS).any(|(k, _)| k == c);
    (0..=last_cap()).filter(|c| !kept(c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_module_and_time_keeps_chown() {
        let d = dropped();
        assert!(d.contains(&25), "CAP_SYS_TIME");
        assert!(d.contains(&22), "CAP_SYS_BOOT");
        assert!(d.contains(&19), "CAP_SYS_PTRACE");
        assert!(d.contains(&16), "CAP_SYS_MODULE");
        assert!(!d.contains(&0));
        assert!(last_cap() >= 37);
    }
}
