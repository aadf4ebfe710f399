//! One stage of a Dockerfile build as it goes: the image its files are in, its configuration
//! so far, its build arguments, and the key of its last step. The instructions that change
//! only the configuration (`ENV`, `ARG`, `LABEL`, `EXPOSE`, `WORKDIR`, `USER`, `CMD`,
//! `ENTRYPOINT`) are applied here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use belljar_oci::dockerfile::words::{self, WordError};
use belljar_oci::dockerfile::{Form, Kind};
use belljar_oci::spec::ImageConfig;

/// What a configuration instruction could not be read as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad(pub String);

impl From<WordError> for Bad {
    fn from(e: WordError) -> Self {
        Bad(e.to_string())
    }
}

#[derive(Debug, Clone)]
pub struct Stage {
    pub alias: Option<String>,
    /// The key of the stage's last step.
    pub key: String,
    /// The image the files are in: a store id (hex), or one of Belljar's own images' names.
    pub files: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// The stage's build arguments (declared by `ARG`).
    pub args: BTreeMap<String, String>,
    /// Whether `Cmd` is still the base image's (an `ENTRYPOINT` then clears it, as Docker).
    pub cmd_inherited: bool,
}

impl Stage {
    /// A stage before its `FROM` has given it files and a config.
    pub fn empty() -> Stage {
        Stage {
            alias: None,
            key: String::new(),
            files: String::new(),
            rootfs: PathBuf::new(),
            config: ImageConfig::default(),
            args: BTreeMap::new(),
            cmd_inherited: true,
        }
    }

    /// The variables substitution sees: the build arguments, under the environment.
    pub fn vars(&self) -> BTreeMap<String, String> {
        let mut v = self.args.clone();
        v.extend(self.config.env());
        v
    }

    fn set_env(&mut self, key: &str, value: &str) {
        let env = self.config.config.env.get_or_insert_with(Vec::new);
        let entry = format!("{key}={value}");
        match env
            .iter_mut()
            .find(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
        {
            Some(e) => *e = entry,
            None => env.push(entry),
        }
    }

    /// The working directory commands start in.
    pub fn workdir(&self) -> String {
        self.config
            .config
            .working_dir
            .clone()
            .filter(|w| w.starts_with('/'))
            .unwrap_or_else(|| "/".into())
    }

    /// Applies a configuration instruction; returns the instruction as the step cache keys it
    /// (after substitution). `build_args` are the `--build-arg`s, `global` the arguments
    /// declared before the first `FROM`.
    pub fn apply(
        &mut self,
        kind: &Kind,
        build_args: &BTreeMap<String, String>,
        global: &BTreeMap<String, String>,
    ) -> Result<String, Bad> {
        let vars = self.vars();
        Ok(match kind {
            Kind::Env(text) => {
                let pairs = pairs(text, &vars, true)?;
                for (k, v) in &pairs {
                    self.set_env(k, v);
                }
                format!("ENV {}", shown(&pairs))
            }
            Kind::Arg(text) => {
                let mut out = Vec::new();
                for (name, default) in args(text, &vars)? {
                    let value = build_args
                        .get(&name)
                        .cloned()
                        .or(default)
                        .or_else(|| global.get(&name).cloned());
                    match value {
                        Some(v) => {
                            out.push(format!("{name}={v}"));
                            self.args.insert(name, v);
                        }
                        None => out.push(name),
                    }
                }
                format!("ARG {}", out.join(" "))
            }
            Kind::Label(text) => {
                let pairs = pairs(text, &vars, false)?;
                let labels = self.config.config.labels.get_or_insert_with(BTreeMap::new);
                for (k, v) in &pairs {
                    labels.insert(k.clone(), v.clone());
                }
                format!("LABEL {}", shown(&pairs))
            }
            Kind::Expose(text) => {
                let mut ports = Vec::new();
                for w in words::words(text, &vars)? {
                    let (port, proto) = w.split_once('/').unwrap_or((&w, "tcp"));
                    let proto = proto.to_ascii_lowercase();
                    if port.parse::<u16>().is_err()
                        || !matches!(proto.as_str(), "tcp" | "udp" | "sctp")
                    {
                        return Err(Bad(format!("EXPOSE {w}: not PORT[/tcp|udp|sctp]")));
                    }
                    ports.push(format!("{port}/{proto}"));
                }
                let exposed = self
                    .config
                    .config
                    .exposed_ports
                    .get_or_insert_with(BTreeMap::new);
                for p in &ports {
                    exposed.insert(p.clone(), serde_json::json!({}));
                }
                format!("EXPOSE {}", ports.join(" "))
            }
            Kind::Workdir(text) => {
                let w = words::word(text, &vars)?;
                let joined = if w.starts_with('/') {
                    w
                } else {
                    format!("{}/{w}", self.workdir())
                };
                let dir = normalise(&joined);
                self.config.config.working_dir = Some(dir.clone());
                format!("WORKDIR {dir}")
            }
            Kind::User(text) => {
                let u = words::word(text, &vars)?;
                if u.is_empty() {
                    return Err(Bad("USER needs a name or id".into()));
                }
                self.config.config.user = Some(u.clone());
                format!("USER {u}")
            }
            Kind::Cmd(form) => {
                let argv = form_argv(form);
                self.config.config.cmd = Some(argv.clone());
                self.cmd_inherited = false;
                format!("CMD {}", serde_json::json!(argv))
            }
            Kind::Entrypoint(form) => {
                let argv = form_argv(form);
                self.config.config.entrypoint = Some(argv.clone());
                if self.cmd_inherited {
                    self.config.config.cmd = None;
                }
                format!("ENTRYPOINT {}", serde_json::json!(argv))
            }
            _ => return Err(Bad("not a configuration instruction".into())),
        })
    }
}

fn form_argv(form: &Form) -> Vec<String> {
    form.argv()
}

fn shown(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", serde_json::json!(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `KEY=value ...`, or (`legacy`, ENV's old form) `KEY value with spaces`.
fn pairs(
    text: &str,
    vars: &BTreeMap<String, String>,
    legacy: bool,
) -> Result<Vec<(String, String)>, Bad> {
    let first = text.split_whitespace().next().unwrap_or_default();
    if legacy && !first.contains('=') {
        let rest = text[first.len()..].trim();
        if rest.is_empty() {
            return Err(Bad(format!("ENV {first} needs a value")));
        }
        return Ok(vec![(first.to_owned(), words::word(rest, vars)?)]);
    }
    words::words(text, vars)?
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Bad(format!("{w:?} is not KEY=value"))),
        })
        .collect()
}

/// `NAME` or `NAME=default`, one or more.
fn args(text: &str, vars: &BTreeMap<String, String>) -> Result<Vec<(String, Option<String>)>, Bad> {
    let valid = |n: &str| {
        !n.is_empty()
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    words::words(text, vars)?
        .into_iter()
        .map(|w| {
            let (name, default) = match w.split_once('=') {
                Some((n, d)) => (n.to_owned(), Some(d.to_owned())),
                None => (w.clone(), None),
            };
            if valid(&name) {
                Ok((name, default))
            } else {
                Err(Bad(format!("ARG {w}: {name:?} is not a variable name")))
            }
        })
        .collect()
}

/// `path` (absolute) without `.`, `..` and repeated slashes; `..` stops at the root.
pub fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(s: &mut Stage, text: &str, build_args: &[(&str, &str)]) -> Result<String, Bad> {
        let ins = belljar_oci::dockerfile::parse(&format!("FROM x\n{text}\n")).unwrap();
        let build_args = build_args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s.apply(&ins[1].kind, &build_args, &BTreeMap::new())
    }

    #[test]
    fn substitutes_args_and_env_in_order() {
        let mut s = Stage::empty();
        assert_eq!(
            apply(&mut s, "ARG V=1.0 W", &[("W", "given")]).unwrap(),
            "ARG V=1.0 W=given"
        );
        apply(&mut s, "ARG V", &[("V", "2.0")]).unwrap();
        assert_eq!(s.args["V"], "2.0");
        apply(&mut s, "ENV APP=/opt/app-$V NAME=\"a b\"", &[]).unwrap();
        apply(&mut s, "ENV OLD legacy form $W", &[]).unwrap();
        assert_eq!(
            s.config.config.env.clone().unwrap(),
            ["APP=/opt/app-2.0", "NAME=a b", "OLD=legacy form given"]
        );
        apply(&mut s, "WORKDIR $APP", &[]).unwrap();
        apply(&mut s, "WORKDIR sub/../src", &[]).unwrap();
        assert_eq!(s.workdir(), "/opt/app-2.0/src");
        apply(&mut s, "LABEL org.v=\"${V}\" x=y", &[]).unwrap();
        assert_eq!(s.config.config.labels.clone().unwrap()["org.v"], "2.0");
        apply(&mut s, "EXPOSE 80 53/udp", &[]).unwrap();
        assert!(apply(&mut s, "EXPOSE http", &[]).is_err());
        assert!(apply(&mut s, "LABEL novalue", &[]).is_err());
        assert!(apply(&mut s, "ARG 9x", &[]).is_err());
    }

    #[test]
    fn entrypoint_clears_an_inherited_cmd() {
        let mut s = Stage::empty();
        s.config.config.cmd = Some(vec!["base-cmd".into()]);
        apply(&mut s, "ENTRYPOINT [\"/bin/app\"]", &[]).unwrap();
        assert_eq!(s.config.config.cmd, None);
        apply(&mut s, "CMD echo hi", &[]).unwrap();
        apply(&mut s, "ENTRYPOINT [\"/bin/other\"]", &[]).unwrap();
        assert_eq!(
            s.config.config.cmd.clone().unwrap(),
            ["/bin/sh", "-c", "echo hi"]
        );
        assert_eq!(normalise("/a/./b/../../../c//"), "/c");
    }
}
