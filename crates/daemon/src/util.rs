//! Small helpers shared across modules: the clock and id generation.

use rand::Rng;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A new id: `prefix_` and 12 lowercase letters and digits.
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let tail: String = (0..12)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}_{tail}")
}

/// Whether `id` looks like an id this daemon made (`prefix_` + lowercase letters and digits),
/// so that nothing else reaches a file path.
pub fn is_id(prefix: &str, id: &str) -> bool {
    id.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .is_some_and(|tail| {
            !tail.is_empty()
                && tail
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// Parses a duration like `90s`, `10m`, `24h`, `500ms` or a bare number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: i64 = num.parse().ok()?;
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_recognised_and_path_tricks_are_not() {
        let id = new_id("sbx");
        assert!(is_id("sbx", &id), "{id}");
        assert_ne!(id, new_id("sbx"));
        assert!(!is_id("sbx", "sbx_../../etc"));
        assert!(!is_id("sbx", "sbx_"));
        assert!(!is_id("sbx", "cmd_abc"));
        assert!(!is_id("sbx", "sbx_ABC"));
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration_ms("90s"), Some(90_000));
        assert_eq!(parse_duration_ms("10m"), Some(600_000));
        assert_eq!(parse_duration_ms("24h"), Some(86_400_000));
        assert_eq!(parse_duration_ms("250"), Some(250));
        assert_eq!(parse_duration_ms("5x"), None);
        assert_eq!(parse_duration_ms("h"), None);
    }
}
