//! The word rules of a Dockerfile's arguments, as Docker applies them to `ENV`, `ARG`,
//! `LABEL`, `COPY`, `ADD`, `WORKDIR`, `USER`, `EXPOSE` and `FROM`: `$NAME`, `${NAME}`,
//! `${NAME:-default}` and `${NAME:+alternative}` are replaced by the build's variables
//! (outside single quotes), double and single quotes group words and are removed, and a
//! backslash escapes the next character. `RUN`, `CMD` and `ENTRYPOINT` are left to the shell.

use std::collections::BTreeMap;

/// What went wrong reading a word (the caller adds the line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WordError {
    /// A quote that is never closed.
    #[error("Unterminated {0} quote")]
    Unterminated(char),
    /// `${` without its `}`, or a name that is not one.
    #[error("Bad variable substitution {0:?}")]
    BadSubstitution(String),
}

/// The words of `text`, substituting `vars` (unset names become empty).
pub fn words(text: &str, vars: &BTreeMap<String, String>) -> Result<Vec<String>, WordError> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(n) => word.push(n),
                        None => return Err(WordError::Unterminated('\'')),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(n @ ('"' | '\\' | '$')) => word.push(n),
                            Some(n) => {
                                word.push('\\');
                                word.push(n);
                            }
                            None => return Err(WordError::Unterminated('"')),
                        },
                        Some('$') => word.push_str(&variable(&mut chars, vars)?),
                        Some(n) => word.push(n),
                        None => return Err(WordError::Unterminated('"')),
                    }
                }
            }
            '$' => {
                in_word = true;
                word.push_str(&variable(&mut chars, vars)?);
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        out.push(word);
    }
    Ok(out)
}

/// `text` as one word: its words (quotes removed, variables substituted) joined by one space,
/// as a `WORKDIR` or `USER` with spaces in it reads.
pub fn word(text: &str, vars: &BTreeMap<String, String>) -> Result<String, WordError> {
    Ok(words(text, vars)?.join(" "))
}

/// The value of the variable after a `$` (`NAME`, `{NAME}`, `{NAME:-x}`, `{NAME:+x}`); a `$`
/// followed by nothing that names a variable is itself.
fn variable(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    vars: &BTreeMap<String, String>,
) -> Result<String, WordError> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if chars.peek() == Some(&'{') {
        chars.next();
        let mut inner = String::new();
        let mut depth = 1;
        for c in chars.by_ref() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            inner.push(c);
        }
        if depth != 0 {
            return Err(WordError::BadSubstitution(format!("${{{inner}")));
        }
        let end = inner.find(|c: char| !is_name(c)).unwrap_or(inner.len());
        let (name, rest) = inner.split_at(end);
        if name.is_empty() {
            return Err(WordError::BadSubstitution(format!("${{{inner}}}")));
        }
        let value = vars.get(name);
        let set = value.is_some_and(|v| !v.is_empty());
        let expand = |w: &str| -> Result<String, WordError> { Ok(words(w, vars)?.join(" ")) };
        return match rest {
            "" => Ok(value.cloned().unwrap_or_default()),
            r if r.starts_with(":-") => match set {
                true => Ok(value.cloned().unwrap_or_default()),
                false => expand(&r[2..]),
            },
            r if r.starts_with(":+") => match set {
                true => expand(&r[2..]),
                false => Ok(String::new()),
            },
            _ => Err(WordError::BadSubstitution(format!("${{{inner}}}"))),
        };
    }
    let mut name = String::new();
    while let Some(&c) = chars.peek() {
        if !is_name(c) {
            break;
        }
        name.push(c);
        chars.next();
    }
    if name.is_empty() {
        return Ok("$".into());
    }
    Ok(vars.get(&name).cloned().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<String, String> {
        [("A", "one"), ("B", "two words"), ("EMPTY", "")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn substitutes_outside_single_quotes() {
        let v = vars();
        assert_eq!(words("$A ${A}x", &v).unwrap(), ["one", "onex"]);
        assert_eq!(words("'$A' \"$A\"", &v).unwrap(), ["$A", "one"]);
        assert_eq!(words("\\$A", &v).unwrap(), ["$A"]);
        assert_eq!(
            words("${NOPE:-dflt} ${A:-dflt}", &v).unwrap(),
            ["dflt", "one"]
        );
        assert_eq!(
            words("x${EMPTY:+alt}y ${A:+alt}", &v).unwrap(),
            ["xy", "alt"]
        );
        assert_eq!(words("\"$B\"", &v).unwrap(), ["two words"]);
        assert_eq!(words("cost$ 5", &v).unwrap(), ["cost$", "5"]);
        assert!(matches!(
            words("${A", &v),
            Err(WordError::BadSubstitution(_))
        ));
        assert!(matches!(
            words("${A%x}", &v),
            Err(WordError::BadSubstitution(_))
        ));
    }

    #[test]
    fn quotes_group_and_must_close() {
        let v = vars();
        assert_eq!(
            words(r#"K="a b" L='c d' M=e\ f"#, &v).unwrap(),
            ["K=a b", "L=c d", "M=e f"]
        );
        assert_eq!(words(r#""say \"hi\"""#, &v).unwrap(), ["say \"hi\""]);
        assert_eq!(
            words("'open", &v).unwrap_err(),
            WordError::Unterminated('\'')
        );
        assert_eq!(
            words("\"open", &v).unwrap_err(),
            WordError::Unterminated('"')
        );
    }

    #[test]
    fn one_word_keeps_inner_spaces() {
        let v = vars();
        assert_eq!(word("/srv/$A", &v).unwrap(), "/srv/one");
        assert_eq!(word("  /my dir/'x y' ", &v).unwrap(), "/my dir/x y");
    }
}
