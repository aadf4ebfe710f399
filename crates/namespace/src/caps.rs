//! Which capabilities the sandbox's root keeps.
//!
//! Inside its user namespace the sandbox's root starts with every capability over the
//! namespace's own objects. It keeps Docker's default set, which is what package managers,
//! `sudo`, `chown` and servers need; the rest (notably `CAP_SYS_ADMIN`: mounting, and
//! `CAP_NET_ADMIN`) is dropped from the bounding set before the agent is exec'd, so neither the
//! agent nor anything it starts can get them back. All mounts and `lo` are set up beforehand.

use std::fs;

/// Capabilities kept in the bounding set, by number (see `capability.h`).
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
    (0..=last_cap())
        .filter(|c| !KEPT.iter().any(|(k, _)| k == c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_sys_admin_keeps_chown() {
        let d = dropped();
        assert!(d.contains(&21), "CAP_SYS_ADMIN");
        assert!(d.contains(&12), "CAP_NET_ADMIN");
        assert!(d.contains(&16), "CAP_SYS_MODULE");
        assert!(!d.contains(&0));
        assert!(last_cap() >= 37);
    }
}
