//! Image references as Docker and Podman read them: `[domain/]path[:tag][@digest]`.
//!
//! The domain is the first `/`-separated component when it has a `.` or a `:`, or is
//! `localhost`; without one the name is short. Belljar writes no registry's host name in
//! itself: a short name means an image this machine already has (imported or built), and is
//! pulled only from a default registry the user configured, as Podman does with its
//! unqualified-search registries.

use std::fmt;

use crate::{Digest, Error};

/// The longest reference accepted (Docker's limit on a repository name is 255).
const MAX_LEN: usize = 512;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `host[:port]`, when the reference names one.
    pub domain: Option<String>,
    /// The repository path, e.g. `library/alpine` or `tools/cli`.
    pub path: String,
    /// The tag (`latest` when neither a tag nor a digest is given).
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |reason: &str| Error::BadReference {
            reference: text.chars().take(MAX_LEN).collect(),
            reason: reason.to_owned(),
        };
        if text.is_empty() || text.len() > MAX_LEN {
            return Err(bad("it must be 1 to 512 characters"));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((r, d)) => (
                r,
                Some(
                    Digest::parse(d)
                        .map_err(|_| bad("the digest is not sha256:<64 hex digits>"))?,
                ),
            ),
            None => (text, None),
        };
        // A tag follows the last `:` after the last `/` (a port's `:` comes before a `/`).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag
            && !valid_tag(t)
        {
            return Err(bad(
                "a tag is 1 to 128 of [A-Za-z0-9_.-], not starting with . or -",
            ));
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                if !valid_domain(first) {
                    return Err(bad("the registry must be host[:port]"));
                }
                (Some(first.to_owned()), path)
            }
            _ => (None, name),
        };
        if !path.split('/').all(valid_component) {
            return Err(bad(
                "a repository is lowercase letters and digits, separated by /, ., _, __ or -",
            ));
        }
        Ok(Self {
            domain,
            path: path.to_owned(),
            tag: match (tag, &digest) {
                (Some(t), _) => Some(t.to_owned()),
                (None, Some(_)) => None,
                (None, None) => Some("latest".to_owned()),
            },
            digest,
        })
    }

    /// `domain/path` or `path`: the repository, without tag or digest.
    pub fn repository(&self) -> String {
        match &self.domain {
            Some(d) => format!("{d}/{}", self.path),
            None => self.path.clone(),
        }
    }

    /// What the registry's manifest endpoint is asked for: the digest when there is one.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// This reference on `registry` when it names none (a short name pulled from the
    /// configured default registry).
    pub fn on(&self, registry: &str) -> Self {
        let mut r = self.clone();
        if r.domain.is_none() {
            r.domain = Some(registry.to_owned());
        }
        r
    }

    /// Whether the registry is this machine (`localhost`, 127.0.0.0/8, `[::1]`), which is
    /// spoken to over plain HTTP, as Docker does.
    pub fn is_loopback(&self) -> bool {
        self.domain.as_deref().is_some_and(is_loopback_host)
    }
}

/// Whether `host[:port]` names this machine.
pub fn is_loopback_host(domain: &str) -> bool {
    let host = match domain.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => domain.split(':').next().unwrap_or(""),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repository())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

fn valid_tag(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && !t.starts_with(['.', '-'])
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// `[a-z0-9]+` runs joined by one `.`, one or two `_`, or any number of `-`.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|s| s == b'-')) {
            return false;
        }
    }
    true
}

fn alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn valid_domain(d: &str) -> bool {
    let (host, port) = if let Some(v6) = d.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, rest)) if h.parse::<std::net::Ipv6Addr>().is_ok() => ("x", rest),
            _ => return false,
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (h, &d[h.len()..][..p.len() + 1]),
            None => (d, ""),
        }
    };
    let port_ok = port.is_empty()
        || port.strip_prefix(':').is_some_and(|p| {
            !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
        });
    port_ok
        && !host.is_empty()
        && host.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_docker_parses() {
        let r = Reference::parse("alpine").unwrap();
        assert_eq!(
            (r.domain.as_deref(), r.path.as_str(), r.tag.as_deref()),
            (None, "alpine", Some("latest"))
        );
        assert_eq!(r.to_string(), "alpine:latest");
        let r = Reference::parse("localhost:5000/tools/cli:1.2").unwrap();
        assert_eq!(r.domain.as_deref(), Some("localhost:5000"));
        assert_eq!(r.path, "tools/cli");
        assert_eq!(r.tag.as_deref(), Some("1.2"));
        assert!(r.is_loopback());
        let d = Digest::of(b"x");
        let r = Reference::parse(&format!("127.0.0.1:5000/a@{d}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), d.to_string());
        assert!(r.is_loopback());
        let r = Reference::parse("[::1]:5000/a/b-c__d:v1").unwrap();
        assert!(r.is_loopback());
        assert_eq!(r.to_string(), "[::1]:5000/a/b-c__d:v1");
        assert!(!Reference::parse("example.test/a").unwrap().is_loopback());
        assert_eq!(Reference::parse("team/app").unwrap().domain, None);
    }

    #[test]
    fn refuses_what_docker_refuses() {
        for bad in [
            "",
            "Alpine",
            "a//b",
            "a/../b",
            "../a",
            "/a",
            "a:",
            "a:-x",
            "a@sha256:00",
            "local host/a",
            "a/b_",
            "a...b",
            "x.test:99999999/a",
            "a/b:c/d",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Reference::parse(&"a".repeat(600)).is_err());
    }
}
