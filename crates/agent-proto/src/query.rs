//! Percent-encoding of query strings, shared by the agent and its client so that both ends
//! agree on how a path with spaces, `&` or non-ASCII bytes travels in a URL.

use std::collections::HashMap;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// What stays unencoded: the unreserved characters of RFC 3986, and `/` so that paths stay
/// readable in logs.
const KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Encodes `value` for a query parameter: unreserved characters and `/` stay, the rest is
/// `%XX`-escaped byte by byte.
pub fn encode(value: &str) -> String {
    utf8_percent_encode(value, KEEP).to_string()
}

/// Decodes one `%XX`/`+` escaped component; `None` when it is malformed or not UTF-8.
pub fn decode(value: &str) -> Option<String> {
    // The crate passes a malformed escape through as text; a request that has one is refused
    // instead, so that no two spellings reach the same path.
    let bytes = value.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    let spaced = value.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|v| v.into_owned())
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
        assert_eq!(decode("a%2Bb%25").as_deref(), Some("a+b%"));
        assert!(decode("100%").is_none());
    }
}
