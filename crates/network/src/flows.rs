//! The flow log: every connection and DNS question a sandbox made, with the verdict, the rule
//! that decided it and the bytes each way. Bounded per sandbox; the daemon persists and serves
//! it (`GET /v1/sandboxes/{id}/network/flows`), so records are plain serde data.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// How many records a log keeps unless told otherwise.
pub const DEFAULT_CAPACITY: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Dns,
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
}

/// Bytes a sandbox exchanged, all flows together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// A bounded, shared log of flows.
pub struct FlowLog {
    records: Mutex<VecDeque<FlowRecord>>,
    capacity: usize,
    next_id: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    events: broadcast::Sender<FlowRecord>,
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
            records: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
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
        self.publish(record);
        id
    }

    /// Ends flow `id` with its byte counts (added to the totals) and republishes it.
    pub fn finish(&self, id: u64, bytes_out: u64, bytes_in: u64) {
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = records.iter_mut().rev().find(|r| r.id == id) {
            r.ended_ms = Some(now_ms());
            r.bytes_out = bytes_out;
            r.bytes_in = bytes_in;
            let _ = self.events.send(r.clone());
        }
    }

    fn publish(&self, record: FlowRecord) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() == self.capacity {
            records.pop_front();
        }
        records.push_back(record.clone());
        // Nobody listening is fine.
        let _ = self.events.send(record);
    }

    /// The records kept, oldest first.
    pub fn records(&self) -> Vec<FlowRecord> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.iter().cloned().collect()
    }

    /// Every record published from now on (`?follow=true`).
    pub fn subscribe(&self) -> broadcast::Receiver<FlowRecord> {
        self.events.subscribe()
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
        }
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
}
