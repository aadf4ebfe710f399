//! DNS over TCP on the gateway, for clients sent there by a truncated UDP answer. The stack
//! terminates the connection like any other and hands its byte stream here; each question is
//! decided by the policy in force and logged, as over UDP.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::Shared;
use crate::dns::Dns;
use crate::flows::Protocol;

/// Answers length-prefixed questions until the client closes or sends something else.
pub(crate) async fn serve(
    mut stream: DuplexStream,
    src: SocketAddr,
    dst: SocketAddr,
    shared: Arc<Shared>,
    dns: Arc<Dns>,
) {
    loop {
        let Ok(len) = stream.read_u16().await else {
            return;
        };
        let mut query = vec![0; usize::from(len)];
        if stream.read_exact(&mut query).await.is_err() {
            return;
        }
        if let Err(refused) = shared.dns_limit.admit(&shared, src, dst, &query) {
            let Some(reply) = refused else { return };
            let Ok(len) = u16::try_from(reply.len()) else {
                return;
            };
            if stream.write_u16(len).await.is_err() || stream.write_all(&reply).await.is_err() {
                return;
            }
            continue;
        }
        let Some(question) = Dns::parse(&query) else {
            return;
        };
        let verdict = shared.policy().decide_dns(&question.name);
        let id = shared.log(
            Protocol::Dns,
            src,
            dst,
            Some(question.name.clone()),
            &verdict,
        );
        let reply = if verdict.is_allow() {
            dns.resolve(&question).await
        } else {
            Dns::refuse(&question)
        };
        shared
            .flows
            .finish(id, query.len() as u64, reply.len() as u64);
        let Ok(len) = u16::try_from(reply.len()) else {
            return;
        };
        if stream.write_u16(len).await.is_err() || stream.write_all(&reply).await.is_err() {
            return;
        }
    }
}
