//! What `belljar-vmm`'s exit status means, so the daemon can tell a guest reboot from a
//! power-off, a `stop` request, a crash or a bad config without hard-coding numbers.
//!
//! | status | meaning |
//! |---|---|
//! | 0 | [`ExitReason::Stopped`]: `stop` on the control socket, SIGTERM or SIGINT |
//! | 1 | [`ExitReason::Failed`]: a VMM or vCPU failure (e.g. a KVM emulation error) |
//! | 2 | [`CONFIG_ERROR_STATUS`]: bad configuration or arguments (one line on stderr) |
//! | 3 | [`RESTORE_ERROR_STATUS`]: `--restore` refused the snapshot (stderr ends with its code) |
//! | 10 | [`ExitReason::Reset`]: the guest reset (i8042 reset, triple fault, `reboot`) |
//! | 11 | [`ExitReason::PowerOff`]: the guest powered off (Belljar's power-off port) |

use serde::{Deserialize, Serialize};

/// The exit status of a config or argument error, before any VM exists.
pub const CONFIG_ERROR_STATUS: u8 = 2;

/// The exit status when `--restore` refuses or cannot load a snapshot. The one stderr line
/// ends with the stable code in parentheses: `vmm_version`, `cpu_model`, `checksum`,
/// `truncated`, `too_large`, `format_version`, `bad_magic`, `corrupt`, `memory`,
/// `config_mismatch`, `io` or `restore_failed`.
pub const RESTORE_ERROR_STATUS: u8 = 3;

/// Why the VM stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// `stop` on the control socket, or SIGTERM/SIGINT.
    Stopped,
    /// The guest reset the machine (i8042 reset, triple fault, `reboot`).
    Reset,
    /// The guest powered off (or halted with no interrupt controller to wake it).
    PowerOff,
    /// A vCPU failed (emulation error, bad state) or a host error.
    Failed,
}

impl ExitReason {
    /// Every reason, for tables and tests.
    pub const ALL: [ExitReason; 4] = [
        ExitReason::Stopped,
        ExitReason::Failed,
        ExitReason::Reset,
        ExitReason::PowerOff,
    ];

    /// The process exit status for this reason.
    pub const fn exit_code(self) -> u8 {
        match self {
            ExitReason::Stopped => 0,
            ExitReason::Failed => 1,
            ExitReason::Reset => 10,
            ExitReason::PowerOff => 11,
        }
    }

    /// The reason behind an exit status (`ExitStatus::code()`); `None` for a config error
    /// (2), a status this contract does not define, or death by a signal (no code).
    pub fn from_exit_code(code: Option<i32>) -> Option<ExitReason> {
        let code = code?;
        Self::ALL
            .into_iter()
            .find(|r| i32::from(r.exit_code()) == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_avoid_2_and_round_trip() {
        for (i, r) in ExitReason::ALL.iter().enumerate() {
            assert_ne!(r.exit_code(), CONFIG_ERROR_STATUS);
            assert!(
                !ExitReason::ALL[i + 1..]
                    .iter()
                    .any(|o| o.exit_code() == r.exit_code())
            );
            assert_eq!(
                ExitReason::from_exit_code(Some(i32::from(r.exit_code()))),
                Some(*r)
            );
        }
        assert_eq!(ExitReason::Reset.exit_code(), 10);
        assert_eq!(ExitReason::PowerOff.exit_code(), 11);
        assert_eq!(ExitReason::from_exit_code(Some(2)), None);
        assert_eq!(ExitReason::from_exit_code(Some(137)), None);
        assert_eq!(ExitReason::from_exit_code(None), None);
    }

    #[test]
    fn reasons_serialize_as_snake_case() {
        assert_eq!(
            serde_json::to_string(&ExitReason::PowerOff).unwrap(),
            "\"power_off\""
        );
        assert!(serde_json::from_str::<ExitReason>("\"poweroff\"").is_err());
    }
}
