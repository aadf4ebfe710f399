//! Human durations on the command line (`90s`, `10m`, `1h30m`), turned into the API's
//! milliseconds and back. Parsing is the API's one rule (`belljar_api::duration`: a bare number
//! is seconds, as for the daemon's own flags); the short format is the CLI's.

pub use belljar_api::duration::{DurationError, parse_ms};

/// Formats milliseconds the short way people read them: `4m59s`, `1h2m`, `850ms`.
pub fn format_ms(ms: i64) -> String {
    if ms < 0 {
        return format!("-{}", format_ms(-ms));
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CLI and the daemon read a duration the same way: `300` is five minutes on both.
    #[test]
    fn parses_the_apis_way() {
        assert_eq!(parse_ms("300"), Ok(300_000));
        assert_eq!(parse_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms(""), Err(DurationError::Empty));
        assert!(matches!(
            parse_ms("10x"),
            Err(DurationError::Invalid { .. })
        ));
    }

    #[test]
    fn formats_short() {
        assert_eq!(format_ms(850), "850ms");
        assert_eq!(format_ms(42_000), "42s");
        assert_eq!(format_ms(299_000), "4m59s");
        assert_eq!(format_ms(3_720_000), "1h02m");
        assert_eq!(format_ms(90_000_000), "1d1h");
    }
}
