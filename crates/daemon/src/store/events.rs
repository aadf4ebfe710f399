//! The event log behind `GET /v1/events?since=seq`: every sandbox and command change, numbered.

use belljar_api::Event;
use rusqlite::params;

use super::{Store, StoreError};

/// How many events are kept; older ones are pruned as new ones arrive.
const KEEP: i64 = 10_000;

/// What happened, before it gets its sequence number.
#[derive(Debug, Clone)]
pub enum EventBody {
    Sandbox(Box<belljar_api::Sandbox>),
    SandboxDeleted(String),
    Snapshot(Box<belljar_api::Snapshot>),
    Command(Box<belljar_api::Command>),
}

impl Store {
    /// Records `body` under the next sequence number and returns the numbered event.
    pub fn append_event(&self, body: EventBody, ts: i64) -> Result<Event, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let event = append_event_in(&tx, body, ts)?;
        tx.commit()?;
        Ok(event)
    }

    /// Events after `since`, oldest first, at most `limit`.
    pub fn events_since(&self, since: u64, limit: u32) -> Result<Vec<Event>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
        let rows = stmt.query_map(params![since as i64, limit], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for body in rows {
            out.push(serde_json::from_str(&body?)?);
        }
        Ok(out)
    }

    /// The newest sequence number, 0 when there is none.
    pub fn last_event_seq(&self) -> Result<u64, StoreError> {
        let seq: i64 =
            self.conn()
                .query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get(0))?;
        Ok(seq as u64)
    }
}

/// Appends `body` as the next event on `tx`, a connection inside a transaction or savepoint
/// (so that a change and its event can be committed together).
pub(crate) fn append_event_in(
    tx: &rusqlite::Connection,
    body: EventBody,
    ts: i64,
) -> Result<Event, StoreError> {
    let seq: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM events")?
        .query_row([], |r| r.get(0))?;
    let (event, sandbox_id) = match body {
        EventBody::Sandbox(s) => {
            let id = s.id.clone();
            (
                Event::Sandbox {
                    seq: seq as u64,
                    ts,
                    sandbox: s,
                },
                id,
            )
        }
        EventBody::SandboxDeleted(id) => (
            Event::SandboxDeleted {
                seq: seq as u64,
                ts,
                sandbox_id: id.clone(),
            },
            id,
        ),
        EventBody::Snapshot(snapshot) => {
            let id = snapshot.source_sandbox_id.clone();
            (
                Event::Snapshot {
                    seq: seq as u64,
                    ts,
                    snapshot,
                },
                id,
            )
        }
        EventBody::Command(c) => {
            let id = c.sandbox_id.clone();
            (
                Event::Command {
                    seq: seq as u64,
                    ts,
                    command: c,
                },
                id,
            )
        }
    };
    tx.prepare_cached("INSERT INTO events (seq, ts, sandbox_id, body) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![seq, ts, sandbox_id, serde_json::to_string(&event)?])?;
    if seq % 1000 == 0 {
        tx.execute("DELETE FROM events WHERE seq <= ?1", [seq - KEEP])?;
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sandboxes::tests::sample;

    #[test]
    fn events_are_numbered_and_replayed_after_a_seq() {
        let store = Store::open_in_memory().unwrap();
        let e1 = store
            .append_event(EventBody::Sandbox(Box::new(sample("sbx_a", 1))), 10)
            .unwrap();
        let e2 = store
            .append_event(EventBody::SandboxDeleted("sbx_a".into()), 11)
            .unwrap();
        assert!(matches!(e1, Event::Sandbox { seq: 1, .. }));
        assert!(matches!(e2, Event::SandboxDeleted { seq: 2, .. }));
        assert_eq!(store.events_since(0, 100).unwrap(), vec![e1, e2.clone()]);
        assert_eq!(store.events_since(1, 100).unwrap(), vec![e2]);
        assert_eq!(store.last_event_seq().unwrap(), 2);
    }
}
