//! `GET .../logs`: the sandbox's process output as text, oldest command first, from the
//! daemon's command logs (Sandbox0's procd container log). `tail_lines` and `limit_bytes`
//! bound a snapshot answer; `follow` streams each command's output until it ends.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::contexts::log_lines;
use super::error::{Result, Sandbox0Error};
use super::wire::LogsQuery;
use super::{S0Path, S0Query};
use crate::http::AppState;

const DEFAULT_TAIL: i64 = 200;
const MAX_TAIL: usize = 5000;
const DEFAULT_BYTES: i64 = 1 << 20;
const MAX_BYTES: usize = 8 << 20;

/// `value` if it is in `1..=max`.
fn in_range(value: i64, max: usize) -> Option<usize> {
    usize::try_from(value)
        .ok()
        .filter(|v| (1..=max).contains(v))
}

fn text(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

pub async fn logs(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Query(q): S0Query<LogsQuery>,
) -> Result<Response> {
    let Some(tail) = in_range(q.tail_lines.unwrap_or(DEFAULT_TAIL), MAX_TAIL) else {
        return Err(Sandbox0Error::BadRequest(format!(
            "tail_lines: must be 1..={MAX_TAIL}"
        )));
    };
    let Some(limit) = in_range(q.limit_bytes.unwrap_or(DEFAULT_BYTES), MAX_BYTES) else {
        return Err(Sandbox0Error::BadRequest(format!(
            "limit_bytes: must be 1..={MAX_BYTES}"
        )));
    };
    if q.container.as_deref().is_some_and(|c| c != "procd") {
        return Err(Sandbox0Error::BadRequest(
            "container: only procd (the sandbox's processes) is here".into(),
        ));
    }
    let since = q
        .since_seconds
        .filter(|s| *s > 0)
        .map(|s| crate::util::now_ms().saturating_sub(s.saturating_mul(1000)));
    let mut commands = st.sandboxes.commands(&id)?;
    commands.reverse();
    commands.retain(|c| since.is_none_or(|t| c.finished_at.is_none_or(|f| f >= t)));
    if q.follow.unwrap_or(false) {
        let (tx, rx) = mpsc::channel::<std::result::Result<Bytes, Infallible>>(16);
        tokio::spawn(async move {
            for c in commands {
                let Ok(logs) = st.sandboxes.command_logs(&id, &c.id, true) else {
                    continue;
                };
                let mut lines = std::pin::pin!(log_lines(logs));
                while let Some((_, data)) = lines.next().await {
                    if tx.send(Ok(Bytes::from(data))).await.is_err() {
                        return;
                    }
                }
            }
        });
        return Ok(text(Body::from_stream(ReceiverStream::new(rx))));
    }
    let mut all = String::new();
    for c in commands {
        let logs = st.sandboxes.command_logs(&id, &c.id, false)?;
        let mut lines = std::pin::pin!(log_lines(logs));
        while let Some((_, data)) = lines.next().await {
            all.push_str(&data);
            // Only the tail is answered: what is far before it can go.
            if all.len() > 2 * MAX_BYTES {
                let cut = all.len() - MAX_BYTES;
                let cut = (cut..all.len())
                    .find(|i| all.is_char_boundary(*i))
                    .unwrap_or(all.len());
                all.drain(..cut);
            }
        }
    }
    Ok(text(Body::from(tail_of(&all, tail, limit))))
}

/// The last `lines` lines of `text`, at most its last `bytes` bytes.
fn tail_of(text: &str, lines: usize, bytes: usize) -> String {
    let mut start = text.len();
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut seen = 0;
    for (i, _) in body.match_indices('\n').rev() {
        seen += 1;
        if seen == lines {
            start = i + 1;
            break;
        }
    }
    if seen < lines {
        start = 0;
    }
    let mut start = start.max(text.len().saturating_sub(bytes));
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        assert_eq!(tail_of("a\nb\nc\n", 2, 100), "b\nc\n");
        assert_eq!(tail_of("a\nb\nc", 2, 100), "b\nc");
        assert_eq!(tail_of("a\nb\n", 5, 100), "a\nb\n");
        assert_eq!(tail_of("abcdef", 5, 3), "def");
        assert_eq!(tail_of("", 5, 3), "");
    }
}
