//! The daemon's side of the agent protocol against a malicious agent: a stand-in agent on an
//! in-memory HTTP/2 connection answers every request with the status and body (split into
//! chunks where the input says) that the fuzz input chose, and the real `AgentClient` parses
//! it: JSON answers, `ErrorBody` error answers, NDJSON streams (`ndjson()`), byte streams.
//! The client must turn every answer into a value or an error, never a panic or a hang, and
//! an error status must never pass for success.

use std::convert::Infallible;
use std::sync::OnceLock;

use belljar_agent_proto::client::{AgentClient, ClientError, JsonStream};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::input::Input;

/// The one runtime every async target runs on (a runtime per input would cost more than
/// the input).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// What the stand-in agent answers.
#[derive(Clone)]
struct Answer {
    status: u16,
    content_length: Option<u64>,
    chunks: Vec<Bytes>,
}

fn answer(input: &mut Input) -> Answer {
    let status = match input.u8() % 8 {
        0 => match input.u16() {
            s @ 200..=599 => s,
            _ => 200,
        },
        1 => 204,
        2 => 400,
        3 => 404,
        4 => 500,
        _ => 200,
    };
    let content_length = (input.one_in(8)).then(|| u64::from(input.u32()));
    let chunk = usize::from(input.u8()).max(1);
    let chunks = input
        .rest()
        .chunks(chunk)
        .map(Bytes::copy_from_slice)
        .collect();
    Answer {
        status,
        content_length,
        chunks,
    }
}

async fn serve(server: tokio::io::DuplexStream, answer: Answer) {
    let service = service_fn(move |_req| {
        let answer = answer.clone();
        async move {
            let frames = answer
                .chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(c)));
            let mut resp = http::Response::new(StreamBody::new(futures::stream::iter(frames)));
            *resp.status_mut() =
                http::StatusCode::from_u16(answer.status).expect("status in 200..=599");
            if let Some(len) = answer.content_length {
                resp.headers_mut()
                    .insert(http::header::CONTENT_LENGTH, len.into());
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(server), service)
        .await;
}

/// Reads a parsed stream to its end or its first error.
async fn drain<T>(
    stream: Result<JsonStream<T>, ClientError>,
    mut each: impl FnMut(T),
) -> Result<(), ClientError> {
    let mut s = stream?;
    while let Some(item) = s.next().await {
        match item {
            Ok(v) => each(v),
            Err(_) => break,
        }
    }
    Ok(())
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let call = input.u8();
    let answer = answer(&mut input);
    let status = answer.status;
    runtime().block_on(async move {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(serve(server_io, answer));
        let Ok(client) = AgentClient::handshake(client_io).await else {
            return;
        };
        let result: Result<(), ClientError> = match call % 12 {
            0 => client.health().await.map(drop),
            1 => client.command("c1").await.map(drop),
            2 => client.list_commands().await.map(drop),
            10 => client.list_commands_fenced(7).await.map(drop),
            11 => {
                let start = belljar_agent_proto::StartCommand::default();
                match client.start_following(&start).await {
                    Ok((_, Some(life))) => drain(Ok(life), drop).await,
                    Ok((_, None)) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            3 => {
                drain(client.output("c1", 0, true).await, |line| {
                    let _ = line.bytes();
                })
                .await
            }
            4 => drain(client.watch("/w", true).await, drop).await,
            5 => client.list("/").await.map(drop),
            6 => client.stat("/etc").await.map(drop),
            7 => client.metrics().await.map(drop),
            8 => match client.read_file("/f").await {
                Ok((_, mut bytes)) => {
                    while let Some(Ok(_)) = bytes.next().await {}
                    Ok(())
                }
                Err(e) => Err(e),
            },
            _ => client.signal("c1", "TERM").await,
        };
        // An error status is an error, with that status, whatever the body says.
        if (400..=599).contains(&status) {
            match &result {
                Err(ClientError::Api { status: got, .. }) => assert_eq!(*got, status),
                Err(_) => {}
                Ok(()) => panic!("status {status} taken as success"),
            }
        }
        drop(client);
        server.abort();
    });
}
