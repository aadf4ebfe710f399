//! Percent-encoding of query strings, shared by the agent and its client so that both ends
//! agree on how a path with spaces, `&` or non-ASCII bytes travels in a URL.

use std::collections::HashMap;

/// Encodes `value` for a query parameter: unreserved characters and `/` stay, the rest is
/// `%XX`-escaped byte by byte.
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Decodes one `%XX`/`+` escaped component; `None` when it is malformed or not UTF-8.
pub fn decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Parses `a=1&b=x%20y` into a map; `None` when a component is malformed.
pub fn parse(query: &str) -> Option<HashMap<String, String>> {
    let mut map = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        map.insert(decode(k)?, decode(v)?);
    }
    Some(map)
}

/// Builds `?k=v&...` from pairs, encoding each value; empty when there are none.
pub fn build(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(&encode(k));
        out.push('=');
        out.push_str(&encode(v));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_awkward_paths() {
        let path = "/work space/a&b=c/héllo%.txt";
        let q = build(&[("path", path), ("mode", "644")]);
        assert_eq!(
            q,
            "?path=/work%20space/a%26b%3Dc/h%C3%A9llo%25.txt&mode=644"
        );
        let map = parse(&q[1..]).unwrap();
        assert_eq!(map["path"], path);
        assert_eq!(map["mode"], "644");
    }

    #[test]
    fn rejects_malformed_escapes() {
        assert!(decode("%zz").is_none());
        assert!(decode("%4").is_none());
        assert!(decode("%ff").is_none());
        assert_eq!(decode("a+b").as_deref(), Some("a b"));
    }
}
