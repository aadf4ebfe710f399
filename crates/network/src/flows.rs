//! The flow log: every connection and DNS question a sandbox made, with the verdict, the rule
//! that decided it and the bytes each way. Bounded per sandbox; the daemon persists and serves
//! it (`GET /v1/sandboxes/{id}/network/flows`), so records are plain serde data.
//!
//! The daemon keeps the records from the log's feed ([`FlowLog::next_record`]), which a
//! flooding guest cannot empty of what it was denied: when the consumer falls behind by
//! [`FEED_CAPACITY`] records, a denied flow is folded into a record for the same destination
//! and rule that says how many it stands for (`coalesced`), and only allowed flows' records
//! are dropped, counted in [`FeedStats`]. A broadcast of the same records, which drops what a
//! slow subscriber misses, was the daemon's path before: under a flood it lost records of
//! denied flows as readily as any (`flow records dropped lost=920`).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// How many records a log keeps unless told otherwise.
pub const DEFAULT_CAPACITY: usize = 1000;
/// Records the feed holds for a consumer that has fallen behind, before it folds denied flows
/// and drops allowed ones.
pub const FEED_CAPACITY: usize = 4096;
/// Destinations whose denied flows are folded apart while the feed is full; past this, the
/// rest of each protocol and rule is folded into one record without a destination.
const MAX_FOLDS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Dns,
}

impl Protocol {
    fn index(self) -> u8 {
        match self {
            Self::Tcp => 0,
            Self::Udp => 1,
            Self::Dns => 2,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowVerdict {
    Allowed,
    Denied,
}

/// One flow. A record is published when the flow is decided and again, with its final byte
/// counts and `ended_ms`, when it ends; both carry the same `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    pub id: u64,
    /// Milliseconds since the Unix epoch.
    pub started_ms: u64,
    pub ended_ms: Option<u64>,
    pub protocol: Protocol,
    /// The sandbox's end.
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// TLS SNI, HTTP `Host`, or the DNS question.
    pub name: Option<String>,
    pub verdict: FlowVerdict,
    /// The rule that decided, as people read it (`subnets.deny 10.0.0.0/8`).
    pub rule: String,
    /// Bytes from the sandbox.
    pub bytes_out: u64,
    /// Bytes to the sandbox.
    pub bytes_in: u64,
    /// How many more denied flows like this one (the same protocol, sandbox address,
    /// destination, name and rule) the record stands for: they came while the feed's consumer
    /// was behind and were folded into it. Zero for an ordinary record. A record folded from
    /// many destinations has the unspecified address and port 0 as `dst`.
    #[serde(default)]
    pub coalesced: u64,
}

/// What the feed could not hand over one by one, since the log began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedStats {
    /// Records of allowed flows (a start or an end) the consumer never got.
    pub dropped: u64,
    /// Denied flows folded into another record's `coalesced`.
    pub coalesced: u64,
}

/// Bytes a sandbox exchanged, all flows together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// A bounded, shared log of flows.
pub struct FlowLog {
    inner: Mutex<Inner>,
    /// Wakes the feed's consumer.
    ready: tokio::sync::Notify,
    capacity: usize,
    next_id: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    events: broadcast::Sender<FlowRecord>,
}

struct Inner {
    records: VecDeque<FlowRecord>,
    feed: Feed,
}

/// What folds a denied flow with others: all but its sandbox port and its times.
#[derive(Clone, PartialEq, Eq, Hash)]
struct FoldKey {
    protocol: u8,
    src: IpAddr,
    dst: SocketAddr,
    name: Option<String>,
    rule: String,
}

/// The records the consumer has not taken yet.
#[derive(Default)]
struct Feed {
    queue: VecDeque<FlowRecord>,
    /// Denied flows that came while `queue` was full, by what they have in common, in the
    /// order they were first folded.
    folds: HashMap<FoldKey, FlowRecord>,
    fold_order: VecDeque<FoldKey>,
    /// Folded flows that have not ended, and their fold: their end belongs to it.
    folded: HashMap<u64, FoldKey>,
    /// The ends of denied flows whose start is in `queue` (or was taken), that came while it
    /// was full: the latest record of each.
    updates: HashMap<u64, FlowRecord>,
    stats: FeedStats,
}

impl Feed {
    /// `first`: the flow's first record (its start); else an update of one published before.
    fn push(&mut self, record: &FlowRecord, first: bool) {
        if !first && let Some(key) = self.folded.get(&record.id) {
            // Its fold stands for it; the fold has its end and bytes too if not taken yet.
            if let Some(fold) = self.folds.get_mut(key) {
                fold.ended_ms = record.ended_ms.max(fold.ended_ms);
                fold.bytes_out += record.bytes_out;
                fold.bytes_in += record.bytes_in;
                // Flows a record stood for already (DNS questions past the rate limit).
                fold.coalesced += record.coalesced;
                self.stats.coalesced += record.coalesced;
            }
            if record.ended_ms.is_some() {
                self.folded.remove(&record.id);
            }
            return;
        }
        if self.queue.len() < FEED_CAPACITY {
            self.queue.push_back(record.clone());
            return;
        }
        if record.verdict == FlowVerdict::Allowed {
            self.stats.dropped += 1;
            return;
        }
        if !first {
            // Bounded by the flows a sandbox may hold: a denied flow that outlives its start
            // is a UDP binding or a connection refused by name.
            if self.updates.len() < MAX_FOLDS || self.updates.contains_key(&record.id) {
                self.updates.insert(record.id, record.clone());
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        let mut key = FoldKey {
            protocol: record.protocol.index(),
            src: record.src.ip(),
            dst: record.dst,
            name: record.name.clone(),
            rule: record.rule.clone(),
        };
        if self.folds.len() >= MAX_FOLDS && !self.folds.contains_key(&key) {
            let any: IpAddr = match record.dst.ip() {
                IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
            };
            key.dst = SocketAddr::new(any, 0);
            key.name = None;
        }
        if record.ended_ms.is_none() {
            self.folded.insert(record.id, key.clone());
        }
        match self.folds.get_mut(&key) {
            Some(fold) => {
                fold.coalesced += 1 + record.coalesced;
                fold.ended_ms = record.ended_ms.max(fold.ended_ms);
                self.stats.coalesced += 1 + record.coalesced;
            }
            None => {
                let mut fold = record.clone();
                fold.dst = key.dst;
                fold.name = key.name.clone();
                self.fold_order.push_back(key.clone());
                self.folds.insert(key, fold);
            }
        }
    }

    fn take(&mut self) -> Option<FlowRecord> {
        if let Some(r) = self.queue.pop_front() {
            return Some(r);
        }
        if let Some(key) = self.fold_order.pop_front() {
            return self.folds.remove(&key);
        }
        let id = *self.updates.keys().next()?;
        self.updates.remove(&id)
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl FlowLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                records: VecDeque::with_capacity(capacity.min(4096)),
                feed: Feed::default(),
            }),
            ready: tokio::sync::Notify::new(),
            capacity: capacity.max(1),
            next_id: AtomicU64::new(1),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            events: broadcast::channel(256).0,
        }
    }

    /// Records a new flow and returns its id (`record.id` is ignored).
    pub fn begin(&self, mut record: FlowRecord) -> u64 {
        record.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = record.id;
        let mut inner = self.lock();
        if inner.records.len() == self.capacity {
            inner.records.pop_front();
        }
        inner.feed.push(&record, true);
        inner.records.push_back(record.clone());
        drop(inner);
        self.ready.notify_one();
        // Nobody listening is fine.
        let _ = self.events.send(record);
        id
    }

    /// Ends flow `id` with its byte counts (added to the totals) and republishes it.
    pub fn finish(&self, id: u64, bytes_out: u64, bytes_in: u64) {
        self.end(id, bytes_out, bytes_in, None);
    }

    /// Ends flow `id`, a record that stands for `1 + coalesced` denied flows.
    pub(crate) fn finish_coalesced(&self, id: u64, bytes_out: u64, bytes_in: u64, coalesced: u64) {
        self.end(id, bytes_out, bytes_in, Some(coalesced));
    }

    fn end(&self, id: u64, bytes_out: u64, bytes_in: u64, coalesced: Option<u64>) {
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        let mut inner = self.lock();
        let Inner { records, feed } = &mut *inner;
        if let Some(r) = records.iter_mut().rev().find(|r| r.id == id) {
            r.ended_ms = Some(now_ms());
            r.bytes_out = bytes_out;
            r.bytes_in = bytes_in;
            if let Some(n) = coalesced {
                r.coalesced = n;
            }
            feed.push(r, false);
            let r = r.clone();
            drop(inner);
            self.ready.notify_one();
            let _ = self.events.send(r);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The records kept, oldest first.
    pub fn records(&self) -> Vec<FlowRecord> {
        self.lock().records.iter().cloned().collect()
    }

    /// Every record published from now on (`?follow=true`). A subscriber that falls behind
    /// misses records (`RecvError::Lagged`); one that must keep them all reads
    /// [`Self::next_record`].
    pub fn subscribe(&self) -> broadcast::Receiver<FlowRecord> {
        self.events.subscribe()
    }

    /// The next record of the feed, in the order published, waiting for one. For one
    /// consumer, the one that keeps the records: a second one would get only some of them.
    pub async fn next_record(&self) -> FlowRecord {
        loop {
            if let Some(r) = self.try_next_record() {
                return r;
            }
            // A record published since the check left a permit: this returns at once.
            self.ready.notified().await;
        }
    }

    /// The next record of the feed, if one is waiting.
    pub fn try_next_record(&self) -> Option<FlowRecord> {
        self.lock().feed.take()
    }

    /// What the feed has dropped or folded so far.
    pub fn feed_stats(&self) -> FeedStats {
        self.lock().feed.stats
    }

    /// Bytes of all finished flows.
    pub fn totals(&self) -> Totals {
        Totals {
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn rec() -> FlowRecord {
        FlowRecord {
            id: 0,
            started_ms: now_ms(),
            ended_ms: None,
            protocol: Protocol::Tcp,
            src: "10.0.2.15:40000".parse().unwrap(),
            dst: "203.0.113.1:443".parse().unwrap(),
            name: None,
            verdict: FlowVerdict::Allowed,
            rule: "allow-all".into(),
            bytes_out: 0,
            bytes_in: 0,
            coalesced: 0,
        }
    }

    fn denied(dst: &str) -> FlowRecord {
        FlowRecord {
            dst: dst.parse().unwrap(),
            verdict: FlowVerdict::Denied,
            rule: "deny-all".into(),
            ..rec()
        }
    }

    /// Takes what the feed holds; the number of flows it accounts for by destination (a flow
    /// counted once however many of its records came).
    fn drain(log: &FlowLog) -> HashMap<SocketAddr, u64> {
        let mut seen = HashSet::new();
        let mut flows = HashMap::new();
        while let Some(r) = log.try_next_record() {
            if seen.insert(r.id) {
                *flows.entry(r.dst).or_default() += 1 + r.coalesced;
            }
        }
        flows
    }

    #[test]
    fn bounded_updated_in_place_and_totalled() {
        let log = FlowLog::new(2);
        let mut sub = log.subscribe();
        let a = log.begin(rec());
        let b = log.begin(rec());
        let c = log.begin(rec());
        assert_eq!(
            log.records().iter().map(|r| r.id).collect::<Vec<_>>(),
            [b, c]
        );
        log.finish(c, 10, 20);
        log.finish(a, 1, 2); // evicted: only the totals see it
        let last = log.records().pop().unwrap();
        assert_eq!((last.bytes_out, last.bytes_in), (10, 20));
        assert!(last.ended_ms.is_some());
        assert_eq!(
            log.totals(),
            Totals {
                bytes_out: 11,
                bytes_in: 22
            }
        );
        let seen: Vec<u64> = std::iter::from_fn(|| sub.try_recv().ok())
            .map(|r| r.id)
            .collect();
        assert_eq!(seen, [a, b, c, c]);
    }

    #[test]
    fn a_flood_never_drops_a_denied_flow_from_the_feed() {
        // Before, the daemon read a 256-record broadcast and lost what it fell behind on,
        // denied flows as much as any: `flow records dropped lost=920`.
        let log = FlowLog::new(DEFAULT_CAPACITY);
        let mut sub = log.subscribe();
        let targets = ["203.0.113.7:443", "203.0.113.8:22", "[2001:db8::9]:80"];
        let mut sent: HashMap<SocketAddr, u64> = HashMap::new();
        for i in 0..6000 {
            let dst = targets[i % 3];
            let id = log.begin(denied(dst));
            log.finish(id, 0, 0);
            *sent.entry(dst.parse().unwrap()).or_default() += 1;
            let id = log.begin(rec());
            log.finish(id, 5, 7);
        }
        let stats = log.feed_stats();
        assert!(
            stats.dropped > 0,
            "allowed records past the feed's room are dropped"
        );
        assert!(stats.coalesced > 0, "denied ones past it are folded");
        let got = drain(&log);
        let allowed = got[&"203.0.113.1:443".parse().unwrap()];
        assert!(allowed < 6000);
        for (dst, n) in &sent {
            assert_eq!(
                got.get(dst),
                Some(n),
                "every denied flow to {dst} is accounted for"
            );
        }
        // The lossy broadcast loses them (what the daemon read before).
        let mut lagged = 0;
        loop {
            match sub.try_recv() {
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Lagged(n)) => lagged += n,
                Err(_) => break,
            }
        }
        assert!(lagged > 0);
    }

    #[test]
    fn past_its_folds_the_feed_folds_by_rule_and_keeps_late_ends() {
        let log = FlowLog::new(10);
        for _ in 0..FEED_CAPACITY {
            log.begin(rec()); // fill the feed
        }
        let mut sent = 0;
        for port in 0..(u16::try_from(MAX_FOLDS).unwrap() + 500) {
            let id = log.begin(denied(&format!("198.51.100.1:{}", port + 1)));
            log.finish(id, 1, 0);
            sent += 1;
        }
        // A denied flow that ends later, folded while the feed is full.
        let late = log.begin(FlowRecord {
            protocol: Protocol::Udp,
            ..denied("198.51.100.2:53")
        });
        log.finish(late, 40, 0);
        let mut denied_flows = 0;
        let mut without_dst = None;
        let mut late_fold = None;
        while let Some(r) = log.try_next_record() {
            if r.verdict == FlowVerdict::Denied {
                denied_flows += 1 + r.coalesced;
                if r.dst.port() == 0 && r.protocol == Protocol::Tcp {
                    without_dst = Some(r.clone());
                }
                if r.id == late {
                    late_fold = Some(r);
                }
            }
        }
        assert_eq!(denied_flows, sent + 1, "each denied flow is counted once");
        let all = without_dst.expect("one record for the destinations past the folds");
        assert_eq!((all.coalesced, all.rule.as_str()), (499, "deny-all"));
        assert_eq!(all.bytes_out, 500, "the folded flows' ends add up in it");
        assert!(all.ended_ms.is_some());
        let late = late_fold.expect("the late flow's fold");
        assert!(late.ended_ms.is_some(), "its end reached its fold");
        assert_eq!(late.bytes_out, 40);
        assert_eq!(log.try_next_record(), None);
    }
}
