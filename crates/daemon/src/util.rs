//! Small helpers shared across modules: the clock and id generation.

use rand::Rng;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// An error and its sources, `: `-separated, for a person (a log line, a sandbox's
/// `status_reason`, an error message): errors carry their cause as a source and do not repeat
/// it in their own message.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
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
}
