//! Dockerfiles: the text read into instructions, each with the line it starts on, so that a
//! build can say where a file is wrong. Comments, line continuations, the exec (JSON) and
//! shell forms and each instruction's flags are read here; variables are substituted by the
//! build, which knows their values ([`words`]).
//!
//! The instructions Belljar builds are `FROM`, `RUN`, `CMD`, `ENTRYPOINT`, `COPY`, `ADD`,
//! `ENV`, `ARG`, `WORKDIR`, `USER`, `EXPOSE` and `LABEL`; any other is refused by name
//! rather than ignored, and so is a parser directive other than the standard syntax and the
//! `\` escape character.

pub mod words;

/// A Dockerfile that cannot be built as written: the line and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// A `RUN`, `CMD` or `ENTRYPOINT` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    /// Run by `/bin/sh -c`.
    Shell(String),
    /// The program and its arguments, as written in a JSON array.
    Exec(Vec<String>),
}

impl Form {
    /// The argument vector this form runs.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Form::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            Form::Exec(v) => v.clone(),
        }
    }
}

/// The sources and destination of a `COPY` or `ADD`, before substitution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paths {
    /// Whitespace-separated words (quotes and variables apply).
    Words(String),
    /// A JSON array; the last element is the destination.
    Json(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyArgs {
    /// `--from=STAGE|IMAGE`.
    pub from: Option<String>,
    /// `--chown=USER[:GROUP]`.
    pub chown: Option<String>,
    /// `--chmod=OCTAL`.
    pub chmod: Option<u32>,
    pub paths: Paths,
}

/// One instruction; texts are as written (variables not yet substituted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    From {
        image: String,
        alias: Option<String>,
    },
    Run(Form),
    Cmd(Form),
    Entrypoint(Form),
    Copy(CopyArgs),
    Add(CopyArgs),
    Env(String),
    Arg(String),
    Label(String),
    Workdir(String),
    User(String),
    Expose(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// The line the instruction starts on (1-based).
    pub line: usize,
    pub kind: Kind,
    /// The instruction as written, continuations joined (for progress and errors).
    pub text: String,
}

/// The most bytes of Dockerfile read.
pub const MAX_DOCKERFILE: usize = 1 << 20;

/// Reads a Dockerfile into its instructions. The first instruction other than `ARG` must be
/// `FROM`.
pub fn parse(text: &str) -> Result<Vec<Instruction>, ParseError> {
    let err = |line, message: String| ParseError { line, message };
    if text.len() > MAX_DOCKERFILE {
        return Err(err(1, format!("longer than {MAX_DOCKERFILE} bytes")));
    }
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    let mut directives = true;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = raw.trim();
        if directives {
            if let Some(d) = directive(trimmed) {
                check_directive(n, d)?;
                continue;
            }
            directives = false;
        }
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let body = raw.trim_end();
        let (piece, more) = match body.strip_suffix('\\') {
            Some(p) => (p, true),
            None => (body, false),
        };
        let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
        joined.push_str(if joined.is_empty() {
            piece.trim_start()
        } else {
            piece
        });
        if more {
            pending = Some((start, joined));
        } else if !joined.trim().is_empty() {
            out.push(instruction(start, joined.trim())?);
        }
    }
    if let Some((start, joined)) = pending
        && !joined.trim().is_empty()
    {
        out.push(instruction(start, joined.trim())?);
    }
    match out.iter().find(|i| !matches!(i.kind, Kind::Arg(_))) {
        None => Err(err(1, "no FROM instruction".into())),
        Some(i) if !matches!(i.kind, Kind::From { .. }) => Err(err(
            i.line,
            "the first instruction (after ARG) must be FROM".into(),
        )),
        Some(_) => Ok(out),
    }
}

/// `# name=value` at the top of the file.
fn directive(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix('#')?.trim();
    let (name, value) = rest.split_once('=')?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    Some((name.to_ascii_lowercase(), value.trim().to_owned()))
}

fn check_directive(line: usize, (name, value): (String, String)) -> Result<(), ParseError> {
    let err = |message: String| Err(ParseError { line, message });
    match name.as_str() {
        "syntax" if value.contains("docker/dockerfile") => Ok(()),
        "syntax" => err(format!(
            "the syntax directive {value:?} names another frontend; Belljar reads the standard Dockerfile syntax only"
        )),
        "escape" if value == "\\" => Ok(()),
        "escape" => err(format!(
            "the escape directive {value:?} is not supported (only the default \\)"
        )),
        // Docker ignores directives it does not know, as comments.
        _ => Ok(()),
    }
}

fn instruction(line: usize, text: &str) -> Result<Instruction, ParseError> {
    let err = |message: String| ParseError { line, message };
    let (keyword, rest) = match text.split_once(char::is_whitespace) {
        Some((k, r)) => (k, r.trim()),
        None => (text, ""),
    };
    let keyword = keyword.to_ascii_uppercase();
    let needs_args = |rest: &str| {
        if rest.is_empty() {
            Err(err(format!("{keyword} needs an argument")))
        } else {
            Ok(())
        }
    };
    let (flags, rest) = flags(rest);
    let allowed: &[&str] = match keyword.as_str() {
        "FROM" => &["platform"],
        "COPY" => &["from", "chown", "chmod"],
        "ADD" => &["chown", "chmod"],
        _ => &[],
    };
    if let Some((name, _)) = flags.iter().find(|(n, _)| !allowed.contains(&n.as_str())) {
        return Err(err(format!("{keyword} --{name} is not supported")));
    }
    let flag = |name: &str| {
        flags
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let kind = match keyword.as_str() {
        "FROM" => {
            needs_args(rest)?;
            if let Some(p) = flag("platform").filter(|p| p != "linux/amd64") {
                return Err(err(format!(
                    "FROM --platform={p}: Belljar builds linux/amd64 only"
                )));
            }
            let parts: Vec<&str> = rest.split_whitespace().collect();
            match parts.as_slice() {
                [image] => Kind::From {
                    image: (*image).to_owned(),
                    alias: None,
                },
                [image, as_, alias] if as_.eq_ignore_ascii_case("as") => {
                    let alias = alias.to_ascii_lowercase();
                    if !valid_alias(&alias) {
                        return Err(err(format!("invalid stage name {alias:?}")));
                    }
                    Kind::From {
                        image: (*image).to_owned(),
                        alias: Some(alias),
                    }
                }
                _ => return Err(err("FROM takes IMAGE [AS NAME]".into())),
            }
        }
        "RUN" => {
            needs_args(rest)?;
            Kind::Run(form(rest))
        }
        "CMD" => {
            needs_args(rest)?;
            Kind::Cmd(form(rest))
        }
        "ENTRYPOINT" => {
            needs_args(rest)?;
            Kind::Entrypoint(form(rest))
        }
        "COPY" | "ADD" => {
            needs_args(rest)?;
            let chmod = flag("chmod")
                .map(|m| {
                    u32::from_str_radix(&m, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| err(format!("--chmod={m}: must be an octal mode")))
                })
                .transpose()?;
            let paths = match json_array(rest) {
                Some(v) => Paths::Json(v),
                None => Paths::Words(rest.to_owned()),
            };
            let args = CopyArgs {
                from: flag("from"),
                chown: flag("chown"),
                chmod,
                paths,
            };
            if keyword == "COPY" {
                Kind::Copy(args)
            } else {
                Kind::Add(args)
            }
        }
        "ENV" => {
            needs_args(rest)?;
            Kind::Env(rest.to_owned())
        }
        "ARG" => {
            needs_args(rest)?;
            Kind::Arg(rest.to_owned())
        }
        "LABEL" => {
            needs_args(rest)?;
            Kind::Label(rest.to_owned())
        }
        "WORKDIR" => {
            needs_args(rest)?;
            Kind::Workdir(rest.to_owned())
        }
        "USER" => {
            needs_args(rest)?;
            Kind::User(rest.to_owned())
        }
        "EXPOSE" => {
            needs_args(rest)?;
            Kind::Expose(rest.to_owned())
        }
        "SHELL" | "HEALTHCHECK" | "ONBUILD" | "STOPSIGNAL" | "VOLUME" | "MAINTAINER" => {
            return Err(err(format!(
                "{keyword} is not supported by Belljar's builder"
            )));
        }
        _ => return Err(err(format!("unknown instruction {keyword}"))),
    };
    Ok(Instruction {
        line,
        kind,
        text: text.to_owned(),
    })
}

/// The leading `--name=value` words of `rest`, and what follows them.
fn flags(mut rest: &str) -> (Vec<(String, String)>, &str) {
    let mut out = Vec::new();
    while let Some(after) = rest.strip_prefix("--") {
        let end = after.find(char::is_whitespace).unwrap_or(after.len());
        let (word, tail) = after.split_at(end);
        let (name, value) = word.split_once('=').unwrap_or((word, ""));
        out.push((name.to_ascii_lowercase(), value.to_owned()));
        rest = tail.trim_start();
    }
    (out, rest)
}

/// The exec form when `rest` is a JSON array of strings, else the shell form (Docker's rule).
fn form(rest: &str) -> Form {
    match json_array(rest) {
        Some(v) => Form::Exec(v),
        None => Form::Shell(rest.to_owned()),
    }
}

fn json_array(rest: &str) -> Option<Vec<String>> {
    rest.starts_with('[')
        .then(|| serde_json::from_str::<Vec<String>>(rest).ok())
        .flatten()
}

fn valid_alias(a: &str) -> bool {
    a.len() <= 128
        && a.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<Kind> {
        parse(text).unwrap().into_iter().map(|i| i.kind).collect()
    }

    #[test]
    fn joins_continuations_and_skips_comments() {
        let text = "# syntax=docker/dockerfile:1\n\nFROM base AS build\n# a comment\nRUN echo one && \\\n  # inside\n\n    echo two\nENV A=1 \\\n    B=\"two words\"\n";
        let got = parse(text).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0].kind,
            Kind::From {
                image: "base".into(),
                alias: Some("build".into())
            }
        );
        assert_eq!(got[1].line, 5);
        assert_eq!(
            got[1].kind,
            Kind::Run(Form::Shell("echo one &&     echo two".into()))
        );
        assert_eq!(got[2].kind, Kind::Env("A=1     B=\"two words\"".into()));
    }

    #[test]
    fn exec_and_shell_forms() {
        let k =
            kinds("FROM x\nCMD [\"/bin/app\", \"--serve\"]\nENTRYPOINT echo hi\nRUN [not json\n");
        assert_eq!(
            k[1],
            Kind::Cmd(Form::Exec(vec!["/bin/app".into(), "--serve".into()]))
        );
        assert_eq!(k[2], Kind::Entrypoint(Form::Shell("echo hi".into())));
        assert_eq!(k[3], Kind::Run(Form::Shell("[not json".into())));
        assert_eq!(
            Form::Shell("echo hi".into()).argv(),
            ["/bin/sh", "-c", "echo hi"]
        );
    }

    #[test]
    fn reads_copy_flags_and_forms() {
        let k = kinds(
            "FROM x\nCOPY --from=build --chown=app:app --chmod=640 a b /dst/\nADD [\"x y\", \"/z\"]\n",
        );
        assert_eq!(
            k[1],
            Kind::Copy(CopyArgs {
                from: Some("build".into()),
                chown: Some("app:app".into()),
                chmod: Some(0o640),
                paths: Paths::Words("a b /dst/".into()),
            })
        );
        assert_eq!(
            k[2],
            Kind::Add(CopyArgs {
                from: None,
                chown: None,
                chmod: None,
                paths: Paths::Json(vec!["x y".into(), "/z".into()]),
            })
        );
    }

    #[test]
    fn refuses_with_the_line() {
        let e = parse("FROM x\nRUN true\nFROBNICATE now\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("FROBNICATE"), "{e}");
        assert_eq!(parse("RUN true\n").unwrap_err().line, 1);
        assert_eq!(parse("ARG V=1\nFROM x:$V\n").unwrap().len(), 2);
        assert!(parse("# only a comment\n").is_err());
        assert_eq!(
            parse("FROM x\nRUN --mount=type=cache true\n")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(parse("FROM x\nVOLUME /data\n").unwrap_err().line, 2);
        assert_eq!(parse("# escape=`\nFROM x\n").unwrap_err().line, 1);
        assert!(parse("# syntax=example/frontend\nFROM x\n").is_err());
        assert_eq!(parse("FROM x\nCOPY --chmod=9 a b\n").unwrap_err().line, 2);
        assert_eq!(parse("FROM x as\n").unwrap_err().line, 1);
        assert_eq!(parse("FROM x\nRUN\n").unwrap_err().line, 2);
        assert_eq!(
            parse("FROM --platform=linux/arm64 x\n").unwrap_err().line,
            1
        );
    }
}
