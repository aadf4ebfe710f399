//! Directory snapshots a microVM mounts at boot, as the daemon tells its agent: one value in
//! the agent's environment (`BELLJAR_MOUNTS`, on the kernel command line). The daemon writes
//! it with `Display`, the agent reads it with `FromStr`, so neither end spells the format.
//!
//! Each mount is `<slot>:<device>+<device>...:<path>`, mounts joined by `,`. The devices are
//! the snapshot's read-only layer disks, topmost first; the slot names the mount's own
//! upper and work directories on the writable layer disk, stable across starts, so a
//! persistent sandbox finds its writes under the mount again. The path is percent-encoded
//! (a kernel command line ends a value at a space); the daemon refuses `,` `:` and `\` in
//! mount paths, so they never need escaping.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// The environment variable carrying [`GuestMounts`].
pub const MOUNTS_ENV: &str = "BELLJAR_MOUNTS";

/// What a path may not carry as it is on a kernel command line (and `%`, the escape).
const ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b',').add(b':').add(b'"');

/// One directory snapshot mounted copy-on-write at a path of the microVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestMount {
    /// Names the mount's upper and work directories on the writable layer.
    pub slot: usize,
    /// The snapshot's layer disks in the guest, topmost first.
    pub devices: Vec<PathBuf>,
    /// Absolute path in the sandbox.
    pub path: String,
}

/// Every mount of one microVM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestMounts(pub Vec<GuestMount>);

/// A `BELLJAR_MOUNTS` value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountsError(pub String);

impl fmt::Display for MountsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Invalid {MOUNTS_ENV}: {}", self.0)
    }
}

impl std::error::Error for MountsError {}

impl fmt::Display for GuestMounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let devices: Vec<String> = m.devices.iter().map(|d| d.display().to_string()).collect();
            write!(
                f,
                "{}:{}:{}",
                m.slot,
                devices.join("+"),
                utf8_percent_encode(&m.path, ESCAPED)
            )?;
        }
        Ok(())
    }
}

impl FromStr for GuestMounts {
    type Err = MountsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |what: &str, item: &str| MountsError(format!("{what} in {item:?}"));
        let mut mounts = Vec::new();
        for item in s.split(',').filter(|i| !i.is_empty()) {
            let mut parts = item.splitn(3, ':');
            let (Some(slot), Some(devices), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("expected SLOT:DEVICES:PATH", item));
            };
            let slot = slot.parse().map_err(|_| bad("a bad slot", item))?;
            let devices: Vec<PathBuf> = devices
                .split('+')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .collect();
            if devices.is_empty() || devices.iter().any(|d| !d.starts_with("/dev/")) {
                return Err(bad("devices must be /dev/ paths", item));
            }
            let path = percent_decode_str(path)
                .decode_utf8()
                .map_err(|_| bad("a path that is not UTF-8", item))?
                .into_owned();
            if !path.starts_with('/') || path == "/" {
                return Err(bad("the path must be absolute and not /", item));
            }
            mounts.push(GuestMount {
                slot,
                devices,
                path,
            });
        }
        Ok(GuestMounts(mounts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_round_trip_without_spaces_on_the_command_line() {
        let mounts = GuestMounts(vec![
            GuestMount {
                slot: 0,
                devices: vec!["/dev/vde".into(), "/dev/vdf".into()],
                path: "/srv/my data/%x".into(),
            },
            GuestMount {
                slot: 3,
                devices: vec!["/dev/vdg".into()],
                path: "/m".into(),
            },
        ]);
        let text = mounts.to_string();
        assert_eq!(
            text,
            "0:/dev/vde+/dev/vdf:/srv/my%20data/%25x,3:/dev/vdg:/m"
        );
        assert!(!text.contains(' '));
        assert_eq!(text.parse::<GuestMounts>().unwrap(), mounts);
        assert_eq!("".parse::<GuestMounts>().unwrap(), GuestMounts::default());
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (bad, says) in [
            ("0:/dev/vde", "expected SLOT:DEVICES:PATH"),
            ("x:/dev/vde:/m", "a bad slot"),
            ("0::/m", "devices must be /dev/ paths"),
            ("0:/etc/passwd:/m", "devices must be /dev/ paths"),
            ("0:/dev/vde:m", "absolute"),
            ("0:/dev/vde:/", "absolute"),
            ("0:/dev/vde:/%ff", "not UTF-8"),
        ] {
            let err = bad.parse::<GuestMounts>().unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
            assert!(err.starts_with("Invalid BELLJAR_MOUNTS"), "{err}");
        }
    }
}
