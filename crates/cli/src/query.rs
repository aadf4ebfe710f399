//! Builds the query strings of API paths, so that file names with spaces, unicode or `&`
//! reach the daemon intact.

/// Percent-encodes `s` for a query value: everything but unreserved characters and `/`.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `path?k1=v1&k2=v2` with each value encoded; pairs with a `None` value are left out.
pub fn with_query(path: &str, pairs: &[(&str, Option<String>)]) -> String {
    let mut out = path.to_string();
    let mut sep = if path.contains('?') { '&' } else { '?' };
    for (k, v) in pairs {
        if let Some(v) = v {
            out.push(sep);
            out.push_str(k);
            out.push('=');
            out.push_str(&encode(v));
            sep = '&';
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_spaces_unicode_and_separators() {
        assert_eq!(encode("/a b/é&x=1"), "/a%20b/%C3%A9%26x%3D1");
        assert_eq!(encode("plain/path.txt"), "plain/path.txt");
    }

    #[test]
    fn builds_query_strings() {
        assert_eq!(
            with_query(
                "/v1/x",
                &[
                    ("path", Some("/a b".into())),
                    ("mode", None),
                    ("r", Some("1".into()))
                ]
            ),
            "/v1/x?path=/a%20b&r=1"
        );
        assert_eq!(with_query("/v1/x", &[("a", None)]), "/v1/x");
    }
}
