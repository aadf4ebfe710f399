//! The one rule for durations written as text, shared by every side of the API: the daemon's
//! flags (`--default-timeout`), the CLI's (`create --timeout`, `extend`) and any client.
//!
//! Before this rule the daemon read a bare number as milliseconds and the CLI as seconds, so a
//! configured timeout of `300` meant 0.3 s. Now a bare number is seconds everywhere, and any
//! other text is a `humantime` duration (`250ms`, `90s`, `10m`, `1h30m`, `2d`). The wire itself
//! carries milliseconds (`timeout_ms`).

use std::time::Duration;

/// What `--help` says about a duration's text.
pub const HELP: &str = "a bare number is seconds; or use units like 250ms, 90s, 10m, 1h30m, 2d";

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum DurationError {
    /// The text is empty.
    #[error("Empty duration")]
    Empty,
    /// The text is neither a number of seconds nor a duration with units.
    #[error(
        "Invalid duration {text:?}: use a number of seconds or a number with a unit, like 90s, 10m or 1h30m"
    )]
    Invalid {
        text: String,
        #[source]
        source: humantime::DurationError,
    },
    /// The duration does not fit in 64 bits of milliseconds.
    #[error("Duration {0:?} is too long")]
    TooLong(String),
}

/// Parses a duration: a bare number is seconds, anything else is a `humantime` duration.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let too_long = || DurationError::TooLong(text.to_owned());
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map(Duration::from_secs).map_err(|_| too_long());
    }
    humantime::parse_duration(s).map_err(|source| match source {
        humantime::DurationError::NumberOverflow => too_long(),
        source => DurationError::Invalid {
            text: text.to_owned(),
            source,
        },
    })
}

/// [`parse`], in the API's milliseconds.
pub fn parse_ms(text: &str) -> Result<i64, DurationError> {
    i64::try_from(parse(text)?.as_millis()).map_err(|_| DurationError::TooLong(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_number_is_seconds() {
        assert_eq!(parse_ms("300"), Ok(300_000));
        assert_eq!(parse_ms(" 45 "), Ok(45_000));
        assert_eq!(parse_ms("0"), Ok(0));
    }

    #[test]
    fn units_and_sums() {
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("90s"), Ok(90_000));
        assert_eq!(parse_ms("10m"), Ok(600_000));
        assert_eq!(parse_ms("24h"), Ok(86_400_000));
        assert_eq!(parse_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_ms("1h 30m"), Ok(5_400_000));
        assert_eq!(parse_ms("2d"), Ok(172_800_000));
        assert_eq!(parse_ms("1.5h"), Ok(5_400_000));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_ms(""), Err(DurationError::Empty));
        assert_eq!(parse_ms("  "), Err(DurationError::Empty));
        for bad in ["10x", "-5m", "m", "5 parsecs"] {
            assert!(
                matches!(parse_ms(bad), Err(DurationError::Invalid { .. })),
                "{bad}"
            );
        }
        for huge in [
            "99999999999999999999s",
            "99999999999999999999",
            "18446744073709551615",
        ] {
            assert!(
                matches!(parse_ms(huge), Err(DurationError::TooLong(_))),
                "{huge}"
            );
        }
    }
}
