//! A sandbox's flow log as the API serves it: every record its stack publishes is kept in
//! memory (the last [`FLOWS_KEPT`]), appended to `flows.ndjson` beside the sandbox's state (so
//! it survives daemon restarts; compacted when it holds twice the bound) and sent to followers
//! of `GET /v1/sandboxes/{id}/network/flows?follow=true`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use belljar_api as api;
use std::sync::Arc;

use belljar_network::flows::FeedStats;
use belljar_network::{FlowLog, FlowRecord};

use futures::StreamExt;

use crate::sandbox::network::lock;
use crate::sandbox::{SandboxError, Sandboxes};

/// Flow records kept per sandbox, in memory and on disk.
pub const FLOWS_KEPT: usize = 1000;
/// How often a sandbox's dropped and folded flow records are logged while they grow.
const STATS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

pub(in crate::sandbox) fn to_flow(r: &FlowRecord, base: u64) -> api::NetworkFlow {
    let ms = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    api::NetworkFlow {
        id: base + r.id,
        started_at: ms(r.started_ms),
        ended_at: r.ended_ms.map(ms),
        protocol: match r.protocol {
            belljar_network::Protocol::Tcp => api::FlowProtocol::Tcp,
            belljar_network::Protocol::Udp => api::FlowProtocol::Udp,
            belljar_network::Protocol::Dns => api::FlowProtocol::Dns,
        },
        src: r.src.to_string(),
        dst: r.dst.to_string(),
        name: r.name.clone(),
        verdict: match r.verdict {
            belljar_network::FlowVerdict::Allowed => api::FlowVerdict::Allowed,
            belljar_network::FlowVerdict::Denied => api::FlowVerdict::Denied,
        },
        rule: r.rule.clone(),
        bytes_out: r.bytes_out,
        bytes_in: r.bytes_in,
    }
}

impl Sandboxes {
    fn flows_file(&self, id: &str) -> PathBuf {
        self.inner.paths.sandbox_dir(id).join("flows.ndjson")
    }

    /// The flows kept, oldest first.
    pub(in crate::sandbox) fn flow_records(&self, id: &str) -> Vec<api::NetworkFlow> {
        let mut all = lock(&self.inner.network.flows);
        let flows = all.entry(id.to_owned()).or_insert_with(|| {
            let text = std::fs::read_to_string(self.flows_file(id)).unwrap_or_default();
            let mut by_id: BTreeMap<u64, api::NetworkFlow> = BTreeMap::new();
            for f in text
                .lines()
                .filter_map(|l| serde_json::from_str::<api::NetworkFlow>(l).ok())
            {
                by_id.insert(f.id, f);
            }
            let skip = by_id.len().saturating_sub(FLOWS_KEPT);
            by_id.into_values().skip(skip).collect()
        });
        flows.iter().cloned().collect()
    }

    /// `GET /v1/sandboxes/{id}/network/flows`: what is kept, then (`follow`) what comes.
    pub fn flows(
        &self,
        id: &str,
        follow: bool,
    ) -> Result<impl futures::Stream<Item = api::NetworkFlow> + Send + 'static, SandboxError> {
        self.get(id)?;
        // Only a running sandbox's log grows; a stopped one's ends where it is.
        let follow = follow && self.attached(id).is_some();
        let rx = follow.then(|| self.flow_sender(id).subscribe());
        let kept = futures::stream::iter(self.flow_records(id));
        let live = futures::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            loop {
                match rx.recv().await {
                    Ok(flow) => return Some((flow, Some(rx))),
                    // A slow follower misses records rather than holding the sandbox up.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return None,
                }
            }
        });
        Ok(kept.chain(live))
    }

    fn flow_sender(&self, id: &str) -> tokio::sync::broadcast::Sender<api::NetworkFlow> {
        lock(&self.inner.network.follow)
            .entry(id.to_owned())
            .or_insert_with(|| tokio::sync::broadcast::channel(256).0)
            .clone()
    }

    /// Keeps every flow record of a sandbox: in memory (bounded), on disk (appended,
    /// compacted when twice the bound) and to followers. It reads the log's feed, which never
    /// loses a denied flow (a flood's are folded into records that count them) and counts the
    /// allowed ones' records it drops when this falls behind; both counts are logged as they
    /// grow, at most every few seconds.
    pub(in crate::sandbox) fn spawn_flow_pump(
        &self,
        id: &str,
        log: Arc<FlowLog>,
        base: u64,
    ) -> tokio::task::AbortHandle {
        let this = self.clone();
        let id = id.to_owned();
        let sender = self.flow_sender(&id);
        tokio::spawn(async move {
            let mut written = 0usize;
            let mut told = FeedStats::default();
            let mut told_at: Option<std::time::Instant> = None;
            loop {
                let record = log.next_record().await;
                let stats = log.feed_stats();
                if stats != told && told_at.is_none_or(|t| t.elapsed() >= STATS_EVERY) {
                    tracing::warn!(
                        sandbox = %id,
                        dropped = stats.dropped,
                        coalesced = stats.coalesced,
                        "flow records of allowed flows dropped, denied ones folded: the guest opens flows faster than they are kept"
                    );
                    (told, told_at) = (stats, Some(std::time::Instant::now()));
                }
                let flow = to_flow(&record, base);
                this.keep_flow(&id, &flow, &mut written);
                let _ = sender.send(flow);
            }
        })
        .abort_handle()
    }

    fn keep_flow(&self, id: &str, flow: &api::NetworkFlow, written: &mut usize) {
        // Load what earlier daemons kept before the first new record joins it.
        self.flow_records(id);
        {
            let mut all = lock(&self.inner.network.flows);
            let flows = all.entry(id.to_owned()).or_default();
            if let Some(f) = flows.iter_mut().rev().find(|f| f.id == flow.id) {
                *f = flow.clone();
            } else {
                if flows.len() >= FLOWS_KEPT {
                    flows.pop_front();
                }
                flows.push_back(flow.clone());
            }
        }
        let path = self.flows_file(id);
        *written += 1;
        if *written >= 2 * FLOWS_KEPT {
            *written = 0;
            let lines: String = self
                .flow_records(id)
                .iter()
                .filter_map(|f| serde_json::to_string(f).ok())
                .map(|l| l + "\n")
                .collect();
            let tmp = path.with_extension("ndjson.tmp");
            if std::fs::write(&tmp, lines).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
            return;
        }
        let line = serde_json::to_string(flow).unwrap_or_default() + "\n";
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            tracing::warn!(sandbox = %id, error = %e, "cannot keep a flow record");
        }
    }
}
