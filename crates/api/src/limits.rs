//! The bounds of every request field, checked at the daemon's edge before anything else sees
//! a request, and published in the OpenAPI document as schema constraints.
//!
//! They exist because an unbounded field hurts later and elsewhere: a 200 kB environment value
//! is accepted at create and then breaks every exec with "Argument list too long" (the kernel's
//! `MAX_ARG_STRLEN` is 128 KiB, `ARG_MAX` about 2 MiB), 10 000 tags per sandbox cost the daemon
//! a core, and a `disk_mib` of 2^64−1 overflows whatever adds to it. Each bound is well inside
//! what the kernel and the store can take; a request outside one is answered 400 `bad_request`
//! with a message that names the field.

use std::collections::BTreeMap;

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};

/// The most vCPUs a sandbox may have.
pub const MAX_VCPUS: u32 = 32;
/// The least memory a sandbox may have, MiB.
pub const MIN_MEMORY_MIB: u64 = 64;
/// The most memory a sandbox may ask for, MiB (256 GiB; admission then checks the host).
pub const MAX_MEMORY_MIB: u64 = 256 * 1024;
/// The smallest writable layer, MiB.
pub const MIN_DISK_MIB: u64 = 64;
/// The largest writable layer, MiB (1 TiB).
pub const MAX_DISK_MIB: u64 = 1024 * 1024;
/// The longest timeout or extension a request may carry, ms (30 days; the daemon's configured
/// maximum, 24 h by default, is checked after this).
pub const MAX_TIMEOUT_MS: i64 = 30 * 24 * 3600 * 1000;

/// The most environment variables in one map.
pub const MAX_ENV_VARS: usize = 256;
/// The longest environment variable name, bytes.
pub const MAX_ENV_KEY: usize = 256;
/// The longest environment value, bytes.
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// The most bytes of one environment map (`KEY=value\0` each).
pub const MAX_ENV_TOTAL: usize = 256 * 1024;
/// What an environment variable name looks like.
pub const ENV_KEY_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

/// The most tags on a sandbox.
pub const MAX_TAGS: usize = 50;
/// The longest tag key, bytes.
pub const MAX_TAG_KEY: usize = 64;
/// The longest tag value, bytes.
pub const MAX_TAG_VALUE: usize = 256;
/// What a tag key looks like: no `=` (a `key=value` filter splits on it), no control characters.
pub const TAG_KEY_PATTERN: &str = "^[^=\\x00-\\x1f\\x7f]+$";

/// The most arguments of a command, the program included.
pub const MAX_ARGS: usize = 4096;
/// The longest single argument, bytes.
pub const MAX_ARG: usize = 32 * 1024;
/// The most bytes of all arguments together (`arg\0` each).
pub const MAX_ARGV_TOTAL: usize = 256 * 1024;

/// The longest path inside a sandbox (Linux `PATH_MAX`).
pub const MAX_PATH: usize = 4096;
/// The longest sandbox name or image name, bytes.
pub const MAX_NAME: usize = 128;
/// The longest signal name (`SIGRTMIN+15`).
pub const MAX_SIGNAL: usize = 16;
/// The largest terminal, in rows or columns.
pub const MAX_PTY_CELLS: u16 = 1000;

/// The largest JSON request body, bytes.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

/// A request field out of its bounds; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct Invalid {
    pub field: String,
    pub problem: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// A request body or query that checks its own bounds (a type without any keeps the default).
pub trait Validate {
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }
}

/// `value`, when present, within `min..=max`.
pub fn range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    value: Option<T>,
    min: T,
    max: T,
) -> Result<(), Invalid> {
    match value {
        Some(v) if v < min || v > max => Err(Invalid::new(field, format!("must be {min}..={max}"))),
        _ => Ok(()),
    }
}

/// `text` no longer than `max` bytes and free of NUL.
pub fn text(field: &str, text: &str, max: usize) -> Result<(), Invalid> {
    if text.len() > max {
        return Err(Invalid::new(field, format!("longer than {max} bytes")));
    }
    if text.contains('\0') {
        return Err(Invalid::new(field, "contains a NUL byte"));
    }
    Ok(())
}

/// A path inside the sandbox: not empty, no longer than `PATH_MAX`, free of NUL.
pub fn path(field: &str, p: &str) -> Result<(), Invalid> {
    if p.is_empty() {
        return Err(Invalid::new(field, "must not be empty"));
    }
    text(field, p, MAX_PATH)
}

/// A file inside the sandbox: an absolute [`path`].
pub fn sandbox_path(field: &str, p: &str) -> Result<(), Invalid> {
    path(field, p)?;
    if !p.starts_with('/') {
        return Err(Invalid::new(field, "must be an absolute path"));
    }
    Ok(())
}

fn is_env_key(k: &str) -> bool {
    let mut bytes = k.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// An environment map within [`MAX_ENV_VARS`], [`MAX_ENV_KEY`], [`MAX_ENV_VALUE`] and
/// [`MAX_ENV_TOTAL`], with names matching [`ENV_KEY_PATTERN`].
pub fn env(field: &str, env: Option<&BTreeMap<String, String>>) -> Result<(), Invalid> {
    let Some(env) = env else { return Ok(()) };
    if env.len() > MAX_ENV_VARS {
        return Err(Invalid::new(
            field,
            format!("more than {MAX_ENV_VARS} variables"),
        ));
    }
    let mut total = 0usize;
    for (k, v) in env {
        if k.len() > MAX_ENV_KEY || !is_env_key(k) {
            return Err(Invalid::new(
                field,
                format!(
                    "name {k:.64?} must match [A-Za-z_][A-Za-z0-9_]* and be at most {MAX_ENV_KEY} bytes"
                ),
            ));
        }
        text(&format!("{field}.{k}"), v, MAX_ENV_VALUE)?;
        total += k.len() + v.len() + 2;
    }
    if total > MAX_ENV_TOTAL {
        return Err(Invalid::new(
            field,
            format!("larger than {MAX_ENV_TOTAL} bytes in all"),
        ));
    }
    Ok(())
}

/// Tags within [`MAX_TAGS`], [`MAX_TAG_KEY`] and [`MAX_TAG_VALUE`], keys non-empty, without
/// `=` or control characters.
pub fn tags(field: &str, tags: Option<&BTreeMap<String, String>>) -> Result<(), Invalid> {
    let Some(tags) = tags else { return Ok(()) };
    if tags.len() > MAX_TAGS {
        return Err(Invalid::new(field, format!("more than {MAX_TAGS} tags")));
    }
    for (k, v) in tags {
        if k.is_empty()
            || k.len() > MAX_TAG_KEY
            || k.contains('=')
            || k.chars().any(char::is_control)
        {
            return Err(Invalid::new(
                field,
                format!(
                    "key {k:.64?} must be 1..={MAX_TAG_KEY} bytes without '=' or control characters"
                ),
            ));
        }
        text(&format!("{field}.{k}"), v, MAX_TAG_VALUE)?;
    }
    Ok(())
}

/// A command line within [`MAX_ARGS`], [`MAX_ARG`] and [`MAX_ARGV_TOTAL`]; the program is not
/// empty.
pub fn argv(field: &str, argv: &[String]) -> Result<(), Invalid> {
    if argv.first().is_none_or(String::is_empty) {
        return Err(Invalid::new(field, "must not be empty"));
    }
    if argv.len() > MAX_ARGS {
        return Err(Invalid::new(
            field,
            format!("more than {MAX_ARGS} arguments"),
        ));
    }
    let mut total = 0usize;
    for (i, a) in argv.iter().enumerate() {
        text(&format!("{field}[{i}]"), a, MAX_ARG)?;
        total += a.len() + 1;
    }
    if total > MAX_ARGV_TOTAL {
        return Err(Invalid::new(
            field,
            format!("larger than {MAX_ARGV_TOTAL} bytes in all"),
        ));
    }
    Ok(())
}

/// The schema of a command line: what [`argv`] accepts.
pub fn argv_schema() -> Schema {
    let arg = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(MAX_ARG));
    Schema::Array(
        ArrayBuilder::new()
            .items(arg)
            .min_items(Some(1))
            .max_items(Some(MAX_ARGS))
            .build(),
    )
}

/// The schema of an environment map: what [`env`] accepts.
pub fn env_schema() -> Schema {
    string_map(
        MAX_ENV_VARS,
        Some(ENV_KEY_PATTERN),
        MAX_ENV_KEY,
        MAX_ENV_VALUE,
    )
}

/// The schema of a tag map: what [`tags`] accepts.
pub fn tags_schema() -> Schema {
    string_map(MAX_TAGS, Some(TAG_KEY_PATTERN), MAX_TAG_KEY, MAX_TAG_VALUE)
}

fn string_map(entries: usize, key_pattern: Option<&str>, key: usize, value: usize) -> Schema {
    let value = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(value));
    let keys = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(key))
        .pattern(key_pattern);
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .max_properties(Some(entries))
            .property_names(Some(keys))
            .additional_properties(Some(value))
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn env_names_sizes_and_totals_are_bounded() {
        assert!(env("env", Some(&map(&[("PATH", "/bin"), ("_x1", "")]))).is_ok());
        for bad in ["", "1A", "A-B", "A=B", "A B"] {
            let e = env("env", Some(&map(&[(bad, "v")]))).unwrap_err();
            assert_eq!(e.field, "env", "{bad:?}");
        }
        let big = "x".repeat(200_000);
        let e = env("env", Some(&map(&[("BIG", &big)]))).unwrap_err();
        assert_eq!(e.to_string(), "env.BIG: longer than 32768 bytes");
        let many: BTreeMap<String, String> = (0..9)
            .map(|i| (format!("V{i}"), "y".repeat(30_000)))
            .collect();
        assert!(
            env("env", Some(&many))
                .unwrap_err()
                .problem
                .contains("in all")
        );
    }

    #[test]
    fn tags_are_bounded() {
        assert!(tags("tags", Some(&map(&[("team", "a b"), ("é", "")]))).is_ok());
        let many: BTreeMap<String, String> = (0..=MAX_TAGS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(tags("tags", Some(&many)).is_err());
        for bad in ["", "a=b", "a\nb", &"k".repeat(65)] {
            assert!(tags("tags", Some(&map(&[(bad, "v")]))).is_err(), "{bad:?}");
        }
        assert!(tags("tags", Some(&map(&[("k", &"v".repeat(257))]))).is_err());
    }

    #[test]
    fn argv_is_bounded() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(argv("argv", &v(&["ls", "-l"])).is_ok());
        assert!(argv("argv", &[]).is_err());
        assert!(argv("argv", &v(&[""])).is_err());
        assert!(argv("argv", &v(&["a\0b"])).is_err());
        let e = argv("argv", &["echo".into(), "x".repeat(40_000)]).unwrap_err();
        assert_eq!(e.field, "argv[1]");
        let many = vec!["x".to_string(); MAX_ARGS + 1];
        assert!(argv("argv", &many).is_err());
    }

    #[test]
    fn ranges_name_their_bounds() {
        assert!(range("vcpus", Some(2u32), 1, MAX_VCPUS).is_ok());
        assert!(range::<u32>("vcpus", None, 1, MAX_VCPUS).is_ok());
        let e = range("vcpus", Some(256u32), 1, MAX_VCPUS).unwrap_err();
        assert_eq!(e.to_string(), "vcpus: must be 1..=32");
    }
}
