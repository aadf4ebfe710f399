//! Human durations on the command line (`90s`, `10m`, `1h30m`), turned into the API's
//! milliseconds and back.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    /// The text is empty.
    #[error("Empty duration")]
    Empty,
    /// The text is not a duration like `90s`, `10m` or `1h30m`.
    #[error("Invalid duration {0:?}: use a number with a unit, like 90s, 10m or 1h30m")]
    Invalid(String),
    /// The duration does not fit in 64 bits of milliseconds.
    #[error("Duration {0:?} is too long")]
    TooLong(String),
}

/// Parses `500ms`, `90s`, `10m`, `1h`, `2d` and sums like `1h30m`; a bare number is seconds.
pub fn parse_ms(text: &str) -> Result<i64, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let invalid = || DurationError::Invalid(text.to_string());
    let too_long = || DurationError::TooLong(text.to_string());
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let secs: i64 = s.parse().map_err(|_| too_long())?;
        return secs.checked_mul(1000).ok_or_else(too_long);
    }
    let mut total: i64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        let n: i64 = rest[..digits].parse().map_err(|_| too_long())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: i64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" | "sec" => 1_000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(unit_ms)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(too_long)?;
    }
    Ok(total)
}

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

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_ms("90s"), Ok(90_000));
        assert_eq!(parse_ms("10m"), Ok(600_000));
        assert_eq!(parse_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("45"), Ok(45_000));
        assert_eq!(parse_ms(" 2d "), Ok(172_800_000));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_ms(""), Err(DurationError::Empty));
        assert!(matches!(parse_ms("10x"), Err(DurationError::Invalid(_))));
        assert!(matches!(parse_ms("-5m"), Err(DurationError::Invalid(_))));
        assert!(matches!(parse_ms("m"), Err(DurationError::Invalid(_))));
        assert!(matches!(
            parse_ms("99999999999999999999s"),
            Err(DurationError::TooLong(_))
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
