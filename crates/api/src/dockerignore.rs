//! `.dockerignore`: which files of a build context are left out, by Docker's rules. The CLI
//! leaves them out of the context it sends, and the daemon leaves them out of the context it
//! receives (an API client may send a whole directory), so both read the file the same way.
//!
//! The file: one pattern a line; blank lines and lines starting with `#` are skipped; a
//! leading `!` makes an exception (what matches is kept after all); the last pattern that
//! matches a path decides. A pattern is cleaned as a path (`./a//b/` is `a/b`, a leading `/`
//! dropped) and matches a path relative to the context, or any of the path's parent
//! directories: `*` is any run of characters but `/`, `?` one such character, `[a-z]` /
//! `[^a-z]` a class, `**` any run of directories (none included), `\` quotes the next character.
//!
//! The file used is `<Dockerfile>.dockerignore` beside the Dockerfile when there is one,
//! else `.dockerignore` at the context's root ([`candidates`]). The Dockerfile and the ignore
//! file are always sent (the daemon reads them) but, when they are excluded, no `COPY` sees
//! them.

use thiserror::Error;

/// The longest pattern line read, in bytes.
pub const MAX_PATTERN: usize = 4096;

/// A `.dockerignore` that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line} of the .dockerignore: {message}")]
pub struct IgnoreError {
    pub line: usize,
    pub message: String,
}

/// The parsed patterns of one `.dockerignore`.
#[derive(Debug, Clone, Default)]
pub struct Ignore {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Rule {
    tokens: Vec<Token>,
    exception: bool,
    /// The pattern's bytes before its first wildcard, for [`Ignore::may_keep_inside`].
    literal_prefix: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Byte(u8),
    /// `?`
    One,
    /// `[...]`: ranges (inclusive), negated or not.
    Class(Vec<(u8, u8)>, bool),
    /// `*`
    Star,
    /// `**` not followed by `/`: any bytes, `/` included.
    Deep,
    /// `**/`: nothing, or any bytes that end with `/`.
    DeepDir,
}

/// The ignore files a build with `dockerfile` (its path in the context) reads, the first
/// that exists winning.
pub fn candidates(dockerfile: &str) -> [String; 2] {
    [
        format!("{dockerfile}.dockerignore"),
        ".dockerignore".to_owned(),
    ]
}

impl Ignore {
    /// Parses the text of a `.dockerignore`.
    pub fn parse(text: &str) -> Result<Self, IgnoreError> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |message: &str| IgnoreError {
                line,
                message: message.to_owned(),
            };
            if raw.len() > MAX_PATTERN {
                return Err(err("the pattern is too long"));
            }
            let mut p = raw.trim();
            if p.is_empty() || p.starts_with('#') {
                continue;
            }
            let exception = p.starts_with('!');
            if exception {
                p = p[1..].trim();
                if p.is_empty() {
                    return Err(err("`!` with no pattern after it"));
                }
            }
            let cleaned = clean(p);
            let tokens = tokens(cleaned.as_bytes()).map_err(err)?;
            let literal_prefix = cleaned
                .bytes()
                .take_while(|b| !matches!(b, b'*' | b'?' | b'[' | b'\\'))
                .collect();
            rules.push(Rule {
                tokens,
                exception,
                literal_prefix,
            });
        }
        Ok(Self { rules })
    }

    /// Whether nothing is ever excluded.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `path` (relative to the context, `/`-separated, no `.` or `..` elements) is
    /// left out.
    pub fn excludes(&self, path: &str) -> bool {
        let path = path.trim_matches('/').as_bytes();
        let parents: Vec<usize> = path
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(i, _)| i)
            .collect();
        let mut excluded = false;
        for rule in &self.rules {
            // An exclusion cannot change an excluded path, nor an exception a kept one.
            if rule.exception != excluded {
                continue;
            }
            let hit = matches(&rule.tokens, path)
                || parents
                    .iter()
                    .any(|&end| matches(&rule.tokens, &path[..end]));
            if hit {
                excluded = !rule.exception;
            }
        }
        excluded
    }

    /// Whether an exception could keep something inside the excluded directory `dir`, so
    /// that it must be looked into rather than left out whole.
    pub fn may_keep_inside(&self, dir: &str) -> bool {
        let mut inside = dir.trim_matches('/').as_bytes().to_vec();
        inside.push(b'/');
        self.rules.iter().filter(|r| r.exception).any(|r| {
            let p = &r.literal_prefix;
            // The pattern's fixed start and the directory agree as far as both go.
            let n = p.len().min(inside.len());
            p[..n] == inside[..n]
        })
    }
}

/// A pattern as a path, lexically cleaned as Go's `filepath.Clean` does, without its
/// leading `/`.
fn clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

fn tokens(p: &[u8]) -> Result<Vec<Token>, &'static str> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'*' if p.get(i + 1) == Some(&b'*') => {
                i += 2;
                // Stars after the second add nothing.
                while p.get(i) == Some(&b'*') {
                    i += 1;
                }
                if p.get(i) == Some(&b'/') {
                    i += 1;
                    out.push(Token::DeepDir);
                } else {
                    out.push(Token::Deep);
                }
                continue;
            }
            b'*' => out.push(Token::Star),
            b'?' => out.push(Token::One),
            b'\\' => {
                i += 1;
                let &b = p.get(i).ok_or("a `\\` at the end of the pattern")?;
                out.push(Token::Byte(b));
            }
            b'[' => {
                let (class, used) = class(&p[i + 1..])?;
                out.push(class);
                i += 1 + used;
                continue;
            }
            b => out.push(Token::Byte(b)),
        }
        i += 1;
    }
    Ok(out)
}

/// A class after its `[`: the token and how many bytes it took, its `]` included.
fn class(p: &[u8]) -> Result<(Token, usize), &'static str> {
    const UNCLOSED: &str = "a `[` with no `]`";
    let mut i = 0;
    let negated = matches!(p.first(), Some(b'^' | b'!'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let one = |i: &mut usize| -> Result<u8, &'static str> {
        let mut b = *p.get(*i).ok_or(UNCLOSED)?;
        if b == b'\\' {
            *i += 1;
            b = *p.get(*i).ok_or(UNCLOSED)?;
        }
        *i += 1;
        Ok(b)
    };
    loop {
        match p.get(i) {
            None => return Err(UNCLOSED),
            Some(b']') if !ranges.is_empty() => return Ok((Token::Class(ranges, negated), i + 1)),
            Some(b']') => return Err("an empty `[]`"),
            Some(_) => {
                let lo = one(&mut i)?;
                let hi = if p.get(i) == Some(&b'-') && p.get(i + 1).is_some_and(|b| *b != b']') {
                    i += 1;
                    one(&mut i)?
                } else {
                    lo
                };
                if hi < lo {
                    return Err("a range in `[...]` that ends before it starts");
                }
                ranges.push((lo, hi));
            }
        }
    }
}

/// Whether `tokens` match all of `s`: a table over (token, position), filled from the end,
/// so any pattern costs its length times the path's, whatever its stars.
fn matches(tokens: &[Token], s: &[u8]) -> bool {
    let m = s.len();
    // `next[j]`: whether the tokens after the current one match `s[j..]`.
    let mut next = vec![false; m + 1];
    next[m] = true;
    let mut cur = vec![false; m + 1];
    for t in tokens.iter().rev() {
        match t {
            Token::Star | Token::Deep => {
                cur[m] = next[m];
                for j in (0..m).rev() {
                    let crosses = *t == Token::Deep || s[j] != b'/';
                    cur[j] = next[j] || (crosses && cur[j + 1]);
                }
            }
            Token::DeepDir => {
                // Nothing, or up to and including some `/` at or after j.
                let mut slash_after = false;
                cur[m] = next[m];
                for j in (0..m).rev() {
                    slash_after = slash_after || (s[j] == b'/' && next[j + 1]);
                    cur[j] = next[j] || slash_after;
                }
            }
            _ => {
                cur[m] = false;
                for j in 0..m {
                    let b = s[j];
                    let hit = match t {
                        Token::Byte(c) => b == *c,
                        Token::One => b != b'/',
                        Token::Class(ranges, negated) => {
                            b != b'/'
                                && ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&b))
                                    != *negated
                        }
                        _ => unreachable!("the stars are matched above"),
                    };
                    cur[j] = hit && next[j + 1];
                }
            }
        }
        std::mem::swap(&mut cur, &mut next);
    }
    next[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ignore(text: &str) -> Ignore {
        Ignore::parse(text).unwrap()
    }

    #[test]
    fn docker_s_examples() {
        // The examples of Docker's documentation of the file.
        let i = ignore("# comment\n*/temp*\n*/*/temp*\ntemp?\n");
        assert!(i.excludes("somedir/temporary.txt"));
        assert!(i.excludes("somedir/temp"));
        assert!(i.excludes("somedir/subdir/temporary.txt"));
        assert!(i.excludes("tempa"));
        assert!(i.excludes("tempb/inside"));
        assert!(!i.excludes("temp"));
        assert!(!i.excludes("temporary.txt"));
        assert!(!i.excludes("a/b/c/temp"));
        assert!(!i.excludes("comment"));
        let i = ignore("*.md\n!README*.md\nREADME-secret.md\n");
        assert!(i.excludes("CHANGES.md"));
        assert!(!i.excludes("README.md"));
        assert!(i.excludes("README-secret.md"));
        assert!(!i.excludes("docs/CHANGES.md"), "`*` does not cross a `/`");
    }

    #[test]
    fn double_stars_cross_directories() {
        let i = ignore("**/*.go\n");
        assert!(i.excludes("main.go"));
        assert!(i.excludes("a/b/c.go"));
        assert!(!i.excludes("a/b/c.rs"));
        let i = ignore("a/**/z\n");
        assert!(i.excludes("a/z"));
        assert!(i.excludes("a/b/c/z"));
        assert!(!i.excludes("a/bz"));
        let i = ignore("node_modules/**\n");
        assert!(i.excludes("node_modules/x/y.js"));
        let i = ignore("**\n!keep\n");
        assert!(i.excludes("anything/at/all"));
        assert!(!i.excludes("keep"));
    }

    #[test]
    fn a_directory_excludes_what_is_inside_it() {
        let i = ignore("/.git/\nbuild\n./target//debug\n");
        assert!(i.excludes(".git"));
        assert!(i.excludes(".git/objects/ab/cdef"));
        assert!(i.excludes("build/out.o"));
        assert!(
            !i.excludes("src/build"),
            "patterns are anchored at the context's root"
        );
        assert!(i.excludes("target/debug/belljar"));
        assert!(!i.excludes("target/release"));
    }

    #[test]
    fn exceptions_reopen_excluded_directories() {
        let i = ignore("vendor\n!vendor/keep.txt\n");
        assert!(i.excludes("vendor"));
        assert!(i.excludes("vendor/other.txt"));
        assert!(!i.excludes("vendor/keep.txt"));
        assert!(i.may_keep_inside("vendor"));
        assert!(!i.may_keep_inside("build"));
        let i = ignore("*\n!**/keep\n");
        assert!(
            i.may_keep_inside("deep"),
            "a wildcard exception may match anywhere"
        );
        assert!(!i.excludes("a/b/keep"));
    }

    #[test]
    fn classes_and_quotes() {
        let i = ignore("file[0-9].txt\nx[^a]y\n\\*star\nq[\\]]\n");
        assert!(i.excludes("file7.txt"));
        assert!(!i.excludes("fileA.txt"));
        assert!(i.excludes("xby"));
        assert!(!i.excludes("xay"));
        assert!(!i.excludes("x/y"), "a class never matches a `/`");
        assert!(i.excludes("*star"));
        assert!(!i.excludes("astar"));
        assert!(i.excludes("q]"));
    }

    #[test]
    fn bad_patterns_name_their_line() {
        for (text, line) in [
            ("ok\n[abc\n", 2),
            ("!\n", 1),
            ("a\\", 1),
            ("x\n\n[]\n", 3),
            ("[z-a]", 1),
        ] {
            let e = Ignore::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
        }
        let long = "a".repeat(MAX_PATTERN + 1);
        assert!(Ignore::parse(&long).is_err());
    }

    #[test]
    fn stars_cost_no_more_than_the_table() {
        // A pattern of many stars against a long path that it does not match: exponential
        // for a backtracking matcher, a table's size here.
        let pattern = "*a".repeat(200) + "b";
        let i = ignore(&pattern);
        let path = "a".repeat(3000);
        assert!(!i.excludes(&path));
    }

    #[test]
    fn the_dockerfile_s_own_ignore_file_comes_first() {
        assert_eq!(
            candidates("docker/app.Dockerfile"),
            ["docker/app.Dockerfile.dockerignore", ".dockerignore"]
        );
    }
}
