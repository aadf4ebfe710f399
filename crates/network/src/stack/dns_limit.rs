//! The rate limit on a sandbox's DNS questions to the gateway. Each question the policy
//! allows costs a parse, a decision, a flow record, a lookup (or a cache hit) and an answer;
//! a sandbox asking 190 000 a second took the daemon to 93 % CPU and another sandbox's
//! answers from 5 ms to over 700. Past its [`Limits::dns_qps`](crate::config::Limits), a
//! sandbox gets REFUSED built from its question's bytes, and one flow record a second that
//! counts what was refused (its `coalesced`), not one each.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::Limits;
use crate::dns::{TokenBucket, refuse_raw};
use crate::flows::{FlowLog, Protocol};
use crate::policy::{Rule, Verdict};

use super::Shared;

/// How long one flow record counts refused questions before the next one starts.
const EPISODE: Duration = Duration::from_secs(1);

/// One sandbox's DNS rate limit, over UDP and TCP together.
pub(crate) struct DnsLimit {
    state: Mutex<State>,
    /// Questions refused for the rate, since the network started.
    refused: AtomicU64,
}

struct State {
    bucket: TokenBucket,
    /// The flow record counting the questions refused lately.
    episode: Option<Episode>,
}

struct Episode {
    id: u64,
    since: Instant,
    /// Refused after the record's own.
    more: u64,
    bytes_out: u64,
    bytes_in: u64,
}

impl DnsLimit {
    pub fn new(limits: &Limits) -> Self {
        Self {
            state: Mutex::new(State {
                bucket: TokenBucket::new(limits.dns_qps, limits.dns_burst, Instant::now()),
                episode: None,
            }),
            refused: AtomicU64::new(0),
        }
    }

    /// Whether `query` (from `src` to the gateway's `dst`) may be answered; if not, the
    /// REFUSED to send instead (`None`: nothing, it was not a query).
    pub fn admit(
        &self,
        shared: &Shared,
        src: SocketAddr,
        dst: SocketAddr,
        query: &[u8],
    ) -> Result<(), Option<Vec<u8>>> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.bucket.take(now) {
            if let Some(e) = state.episode.take() {
                e.finish(&shared.flows);
            }
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        let reply = refuse_raw(query);
        let (out, inn) = (
            query.len() as u64,
            reply.as_ref().map_or(0, Vec::len) as u64,
        );
        match &mut state.episode {
            Some(e) if now.saturating_duration_since(e.since) < EPISODE => {
                e.more += 1;
                e.bytes_out += out;
                e.bytes_in += inn;
            }
            episode => {
                if let Some(e) = episode.take() {
                    e.finish(&shared.flows);
                }
                let verdict = Verdict::Deny(Rule::DnsRateLimit);
                *episode = Some(Episode {
                    id: shared.log(Protocol::Dns, src, dst, None, &verdict),
                    since: now,
                    more: 0,
                    bytes_out: out,
                    bytes_in: inn,
                });
            }
        }
        Err(reply)
    }

    /// Ends the record of an episode of refusals that is over.
    pub fn flush(&self, flows: &FlowLog) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state
            .episode
            .as_ref()
            .is_some_and(|e| e.since.elapsed() >= EPISODE)
            && let Some(e) = state.episode.take()
        {
            e.finish(flows);
        }
    }

    /// Questions refused for the rate so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Episode {
    fn finish(self, flows: &FlowLog) {
        flows.finish_coalesced(self.id, self.bytes_out, self.bytes_in, self.more);
    }
}
