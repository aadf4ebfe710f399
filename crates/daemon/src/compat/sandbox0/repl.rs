//! REPL contexts: a long-lived interpreter in the sandbox (a daemon command with its stdin
//! open), so that state persists between `run` calls as in Sandbox0's REPLs.
//!
//! The interpreter runs a small driver. The layer writes one line per request to its stdin,
//! `<request id> <code, base64>`; the driver runs the code in the same interpreter (Python:
//! one globals dict, the value of a last expression printed as the REPL prints it; bash: one
//! shell, `eval`), with stderr on stdout so that the output keeps its order, and then prints
//! the line `\x1eBELLJAR-DONE <request id>`. A follower task reads the command's output from
//! the daemon's log, hands each request its output up to that line, and tells the context's
//! WebSocket subscribers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use base64::Engine;
use belljar_agent_proto::client::body_from_bytes;
use futures::StreamExt;
use tokio::sync::{broadcast, oneshot};

use super::error::{Result, Sandbox0Error};
use crate::http::AppState;

/// What starts a request's end marker in the interpreter's output.
const MARK: &str = "\u{1e}BELLJAR-DONE ";
/// The longest end marker line: a request id is 16 hex digits.
const MAX_MARK_LINE: usize = 64;
/// The most output one request answers with; the rest still reaches subscribers and the
/// daemon's log. The interpreter's output is the sandbox's, so nothing it prints may grow
/// without bound here.
const MAX_OUTPUT: usize = 16 << 20;

/// The Python driver: one namespace for every request.
const PYTHON: &str = r#"import ast, base64, os, sys, traceback
os.dup2(1, 2)
sys.stderr = sys.stdout
ns = {"__name__": "__main__"}
def run(code):
    try:
        tree = ast.parse(code, "<input>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<input>", "exec"), ns)
        if last is not None:
            value = eval(compile(last, "<input>", "eval"), ns)
            if value is not None:
                ns["_"] = value
                print(repr(value))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
while True:
    line = sys.stdin.readline()
    if not line:
        break
    rid, _, code = line.strip().partition(" ")
    run(base64.b64decode(code).decode("utf-8", "replace"))
    sys.stdout.flush()
    sys.stdout.write("\x1eBELLJAR-DONE " + rid + "\n")
    sys.stdout.flush()
"#;

/// The bash driver: one shell for every request.
const BASH: &str = r#"exec 2>&1
while IFS=' ' read -r __belljar_id __belljar_code; do
  eval "$(printf '%s' "$__belljar_code" | base64 -d)"
  printf '\036BELLJAR-DONE %s\n' "$__belljar_id"
done
"#;

/// The interpreter of an alias, with its driver.
pub fn argv_for(alias: &str) -> Result<Vec<String>> {
    let argv: &[&str] = match alias {
        "python" | "python3" => &["python3", "-u", "-c", PYTHON],
        "bash" | "sh" | "shell" => &["bash", "--noprofile", "--norc", "-c", BASH],
        other => {
            return Err(Sandbox0Error::BadRequest(format!(
                "repl.alias: {other:?} is not a REPL here (python or bash)"
            )));
        }
    };
    Ok(argv.iter().map(|s| (*s).to_owned()).collect())
}

/// What a REPL context's subscribers see.
#[derive(Debug, Clone)]
pub enum Event {
    Output(String),
    /// A request finished.
    Done(String),
    /// The interpreter ended.
    Exited,
}

#[derive(Default)]
struct Progress {
    /// The requests written, oldest first, each with where its output goes.
    waiting: VecDeque<(String, oneshot::Sender<String>)>,
    /// The output of the oldest waiting request so far.
    output: String,
    /// Output held back because it may be the start of an end marker.
    held: String,
    ended: bool,
}

/// One interpreter.
pub struct Repl {
    sandbox_id: String,
    command_id: String,
    /// One request at a time, so that each output is its own.
    turn: tokio::sync::Mutex<()>,
    progress: Mutex<Progress>,
    pub events: broadcast::Sender<Event>,
}

impl Repl {
    /// Follows the interpreter's output from its start.
    pub fn start(st: &AppState, sandbox_id: &str, command_id: &str) -> Result<Arc<Self>> {
        let logs = st.sandboxes.command_logs(sandbox_id, command_id, true)?;
        let repl = Arc::new(Self {
            sandbox_id: sandbox_id.to_owned(),
            command_id: command_id.to_owned(),
            turn: Default::default(),
            progress: Default::default(),
            events: broadcast::channel(256).0,
        });
        let this = repl.clone();
        tokio::spawn(async move {
            let mut lines = std::pin::pin!(super::contexts::log_lines(logs));
            while let Some((_, text)) = lines.next().await {
                this.take(&text);
            }
            this.end();
        });
        Ok(repl)
    }

    /// Runs `code`; returns its output once the driver says it is done (or the interpreter
    /// ended).
    pub async fn run(&self, st: &AppState, code: &str) -> Result<String> {
        let _turn = self.turn.lock().await;
        let id = format!("{:016x}", rand::random::<u64>());
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            if p.ended {
                return Err(Sandbox0Error::Conflict(format!(
                    "Context {} has ended; create another",
                    self.command_id
                )));
            }
            p.waiting.push_back((id.clone(), tx));
        }
        let line = format!(
            "{id} {}\n",
            base64::engine::general_purpose::STANDARD.encode(code.as_bytes())
        );
        let written = st
            .sandboxes
            .write_stdin(
                &self.sandbox_id,
                &self.command_id,
                body_from_bytes(line),
                false,
            )
            .await;
        if let Err(e) = written {
            self.progress
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .waiting
                .retain(|(w, _)| *w != id);
            return Err(e.into());
        }
        Ok(rx.await.unwrap_or_default())
    }

    /// Output from the interpreter.
    fn take(&self, text: &str) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = std::mem::take(&mut p.held);
        buf.push_str(text);
        loop {
            let Some(at) = buf.find('\u{1e}') else {
                self.emit(&mut p, &buf);
                return;
            };
            let (before, rest) = buf.split_at(at);
            let before = before.to_owned();
            self.emit(&mut p, &before);
            let rest = rest.to_owned();
            if rest.len() < MARK.len() && MARK.starts_with(rest.as_str()) {
                p.held = rest;
                return;
            }
            if !rest.starts_with(MARK) {
                // Not a marker: the separator is output like any other.
                self.emit(&mut p, "\u{1e}");
                buf = rest['\u{1e}'.len_utf8()..].to_owned();
                continue;
            }
            let Some(nl) = rest.find('\n').filter(|nl| *nl <= MAX_MARK_LINE) else {
                if rest.len() <= MAX_MARK_LINE {
                    p.held = rest;
                    return;
                }
                // Too long for a marker: output.
                self.emit(&mut p, "\u{1e}");
                buf = rest['\u{1e}'.len_utf8()..].to_owned();
                continue;
            };
            let id = rest[MARK.len()..nl].trim().to_owned();
            let output = std::mem::take(&mut p.output);
            if let Some(pos) = p.waiting.iter().position(|(w, _)| *w == id) {
                let (_, tx) = p.waiting.remove(pos).expect("position is in range");
                let _ = tx.send(output);
            }
            let _ = self.events.send(Event::Done(id));
            buf = rest[nl + 1..].to_owned();
        }
    }

    fn emit(&self, p: &mut Progress, text: &str) {
        if text.is_empty() {
            return;
        }
        if p.output.len() + text.len() <= MAX_OUTPUT {
            p.output.push_str(text);
        }
        let _ = self.events.send(Event::Output(text.to_owned()));
    }

    /// The interpreter ended: waiting requests get what they printed.
    fn end(&self) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let held = std::mem::take(&mut p.held);
        self.emit(&mut p, &held);
        p.ended = true;
        let output = std::mem::take(&mut p.output);
        for (_, tx) in p.waiting.drain(..) {
            let _ = tx.send(output.clone());
        }
        let _ = self.events.send(Event::Exited);
    }

    pub fn ended(&self) -> bool {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repl() -> Repl {
        Repl {
            sandbox_id: "sbx_a".into(),
            command_id: "cmd_a".into(),
            turn: Default::default(),
            progress: Default::default(),
            events: broadcast::channel(16).0,
        }
    }

    #[test]
    fn output_is_cut_at_markers_even_across_chunks() {
        let r = repl();
        let (tx, mut rx) = oneshot::channel();
        r.progress
            .lock()
            .unwrap()
            .waiting
            .push_back(("r1".into(), tx));
        r.take("2\n\u{1e}x");
        r.take("\u{1e}BELLJAR-");
        r.take("DONE r1\nlater");
        assert_eq!(rx.try_recv().unwrap(), "2\n\u{1e}x");
        assert_eq!(r.progress.lock().unwrap().output, "later");
        r.end();
        assert!(r.ended());
    }

    #[test]
    fn a_marker_that_never_ends_is_output() {
        let r = repl();
        let long = format!("{MARK}{}", "x".repeat(100));
        r.take(&long);
        let p = r.progress.lock().unwrap();
        assert!(p.held.is_empty());
        assert_eq!(p.output, long);
    }

    #[test]
    fn aliases_name_interpreters() {
        assert_eq!(argv_for("python").unwrap()[0], "python3");
        assert_eq!(argv_for("bash").unwrap()[0], "bash");
        assert!(argv_for("cobol").is_err());
    }
}
