//! Domain patterns of a `NetworkPolicy` allow-list, with Vercel's matching rules: an exact
//! name; `*.example.com`, any subdomain but not the parent; `www.*.com`, exactly one label in
//! the middle. Names are compared case-insensitively and without a trailing dot.

use std::fmt;

/// Why a domain pattern is malformed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DomainError {
    /// The domain is empty.
    #[error("The domain is empty")]
    Empty,
    /// A label is empty (`a..b`, a leading or trailing dot).
    #[error("The domain {0:?} has an empty label")]
    EmptyLabel(String),
    /// A label is longer than 63 bytes or the name longer than 253.
    #[error("The domain {0:?} is too long")]
    TooLong(String),
    /// A label holds a character outside letters, digits, `-` and `_`.
    #[error("The domain {0:?} has an invalid character")]
    InvalidChar(String),
    /// `*` is not a whole label, appears twice, or is the last label.
    #[error("The domain {0:?} has a misplaced wildcard (allowed: `*.example.com` or `www.*.com`)")]
    BadWildcard(String),
}

/// One validated allow-list entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainPattern {
    /// Lower-case labels; `*` marks the wildcard label.
    labels: Vec<String>,
    text: String,
}

impl DomainPattern {
    /// Parses and validates a pattern.
    pub fn parse(text: &str) -> Result<Self, DomainError> {
        let trimmed = text.strip_suffix('.').unwrap_or(text);
        if trimmed.is_empty() {
            return Err(DomainError::Empty);
        }
        if trimmed.len() > 253 {
            return Err(DomainError::TooLong(text.into()));
        }
        let labels: Vec<String> = trimmed.split('.').map(str::to_ascii_lowercase).collect();
        let mut wildcards = 0;
        for (i, label) in labels.iter().enumerate() {
            if label.is_empty() {
                return Err(DomainError::EmptyLabel(text.into()));
            }
            if label.len() > 63 {
                return Err(DomainError::TooLong(text.into()));
            }
            if label == "*" {
                wildcards += 1;
                if wildcards > 1 || i == labels.len() - 1 {
                    return Err(DomainError::BadWildcard(text.into()));
                }
                continue;
            }
            if label.contains('*') {
                return Err(DomainError::BadWildcard(text.into()));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(DomainError::InvalidChar(text.into()));
            }
        }
        Ok(Self {
            text: labels.join("."),
            labels,
        })
    }

    /// Whether `name` (a DNS question, an SNI or a `Host`) matches.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        let name: Vec<String> = name.split('.').map(str::to_ascii_lowercase).collect();
        if name.iter().any(String::is_empty) {
            return false;
        }
        if self.labels[0] == "*" {
            // Any subdomain, never the parent: at least one label before the suffix.
            let suffix = &self.labels[1..];
            return name.len() > suffix.len() && name[name.len() - suffix.len()..] == *suffix;
        }
        name.len() == self.labels.len()
            && self
                .labels
                .iter()
                .zip(&name)
                .all(|(p, n)| p == "*" || p == n)
    }

    /// The pattern as written (lower case, no trailing dot).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }

    #[test]
    fn exact_matches_only_itself_case_insensitively() {
        assert!(p("example.com").matches("example.com"));
        assert!(p("example.com").matches("EXAMPLE.com."));
        assert!(!p("example.com").matches("www.example.com"));
        assert!(!p("example.com").matches("example.co"));
    }

    #[test]
    fn leading_wildcard_matches_subdomains_not_the_parent() {
        let w = p("*.example.com");
        assert!(w.matches("a.example.com"));
        assert!(w.matches("a.b.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("badexample.com"));
        assert!(!w.matches("a.example.org"));
    }

    #[test]
    fn middle_wildcard_matches_exactly_one_label() {
        let w = p("www.*.com");
        assert!(w.matches("www.example.com"));
        assert!(!w.matches("www.a.b.com"));
        assert!(!w.matches("www.com"));
        assert!(!w.matches("api.example.com"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        assert_eq!(
            DomainPattern::parse("*.*.com"),
            Err(DomainError::BadWildcard("*.*.com".into()))
        );
        assert!(matches!(
            DomainPattern::parse("*example.com"),
            Err(DomainError::BadWildcard(_))
        ));
        assert!(matches!(
            DomainPattern::parse("example.*"),
            Err(DomainError::BadWildcard(_))
        ));
        assert!(matches!(
            DomainPattern::parse("a..com"),
            Err(DomainError::EmptyLabel(_))
        ));
        assert!(matches!(
            DomainPattern::parse(".com"),
            Err(DomainError::EmptyLabel(_))
        ));
        assert!(matches!(
            DomainPattern::parse("exa mple.com"),
            Err(DomainError::InvalidChar(_))
        ));
        assert_eq!(DomainPattern::parse(""), Err(DomainError::Empty));
        assert!(matches!(
            DomainPattern::parse(&"a".repeat(64)),
            Err(DomainError::TooLong(_))
        ));
    }
}
