//! The client against a deliberately hostile agent: a sandbox controls its agent, so every
//! answer may be oversized, never come, or sit behind a planted symbolic link. The client must
//! bound what it buffers, give up in time, and never follow the link.
#![cfg(feature = "client")]

use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use belljar_agent_proto::client::{
    AgentClient, ClientError, MAX_ERROR_MESSAGE, MAX_JSON_BODY, connect_socket,
};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;

/// Serves HTTP/2 on `path`, answering every request with `answer`.
fn serve<F, Fut>(path: &Path, answer: F)
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(req).await) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

#[tokio::test]
async fn an_oversized_answer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    serve(&sock, |_| async {
        let mut body = b"{\"version\":\"".to_vec();
        body.resize(MAX_JSON_BODY + 4096, b'a');
        body.extend_from_slice(b"\"}");
        Response::new(Full::new(Bytes::from(body)))
    });
    let client = AgentClient::connect_unix(&sock).await.unwrap();
    let err = client.health().await.unwrap_err();
    assert!(
        matches!(err, ClientError::BodyTooLarge { limit } if limit == MAX_JSON_BODY),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_silent_agent_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    serve(&sock, |_| std::future::pending());
    let client = AgentClient::connect_unix(&sock)
        .await
        .unwrap()
        .with_call_timeout(Duration::from_millis(200));
    let err = client.health().await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout(_)), "{err:?}");
    let err = client.list_commands().await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout(_)), "{err:?}");
}

#[tokio::test]
async fn error_messages_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    serve(&sock, |_| async {
        let message = "é".repeat(20_000);
        let body = format!(r#"{{"error":{{"code":"not_found","message":"{message}"}}}}"#);
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        resp
    });
    let client = AgentClient::connect_unix(&sock).await.unwrap();
    match client.health().await.unwrap_err() {
        ClientError::Api { message, code, .. } => {
            assert_eq!(code, "not_found");
            assert!(message.len() <= MAX_ERROR_MESSAGE, "{}", message.len());
            assert!(message.len() > MAX_ERROR_MESSAGE - 4);
        }
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn a_planted_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    // Another sandbox's (or a host service's) socket, and a link to it where the agent's
    // socket should be.
    let other = dir.path().join("other.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&other).unwrap();
    let planted = dir.path().join("agent.sock");
    std::os::unix::fs::symlink(&other, &planted).unwrap();
    let err = connect_socket(&planted).await.unwrap_err();
    assert!(matches!(err, ClientError::NotASocket(_)), "{err:?}");
    assert!(AgentClient::connect_unix(&planted).await.is_err());
    // A regular file is no socket either; the real socket still connects.
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        connect_socket(&file).await.unwrap_err(),
        ClientError::NotASocket(_)
    ));
    connect_socket(&other).await.unwrap();
}
