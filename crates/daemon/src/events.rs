//! The event hub: every sandbox and command change is numbered in the store and broadcast
//! to live subscribers (`GET /v1/events`), so the UI follows changes instead of polling and
//! can resume after a disconnect with `?since=seq`.

use std::sync::Mutex;

use belljar_api::Event;
use futures::Stream;
use tokio::sync::broadcast;

use crate::store::{EventBody, Store, StoreError};
use crate::util::now_ms;

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// Reading past events failed.
    #[error("Cannot read past events")]
    Store(#[from] StoreError),
}

pub struct Events {
    store: Store,
    tx: broadcast::Sender<Event>,
    /// Numbering and sending happen together, so subscribers see events in `seq` order.
    order: Mutex<()>,
}

fn seq_of(e: &Event) -> u64 {
    match e {
        Event::Sandbox { seq, .. }
        | Event::SandboxDeleted { seq, .. }
        | Event::Snapshot { seq, .. }
        | Event::Command { seq, .. } => *seq,
    }
}

impl Events {
    pub fn new(store: Store) -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            store,
            tx,
            order: Mutex::new(()),
        }
    }

    /// Records and broadcasts a change. A failure to record is logged: the change itself has
    /// already happened and must not fail because its notification could not be stored.
    pub fn emit(&self, body: EventBody) {
        let _order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        match self.store.append_event(body, now_ms()) {
            Ok(event) => {
                let _ = self.tx.send(event);
            }
            Err(e) => tracing::warn!(error = %e, "cannot record an event"),
        }
    }

    /// Records a change together with its event (`write` gets the event's timestamp and
    /// commits both in one transaction, see `Store::promote_command_with_event`), then
    /// broadcasts the event. What `write` returns besides the event is passed back.
    pub fn record<T>(
        &self,
        write: impl FnOnce(i64) -> Result<(T, Option<Event>), StoreError>,
    ) -> Result<T, StoreError> {
        let _order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let (value, event) = write(now_ms())?;
        if let Some(event) = event {
            let _ = self.tx.send(event);
        }
        Ok(value)
    }

    /// Events after `since` (or only new ones when `None`), then live ones, in order.
    pub fn stream(
        &self,
        since: Option<u64>,
    ) -> Result<impl Stream<Item = Event> + use<>, EventsError> {
        let rx = self.tx.subscribe();
        let last = match since {
            Some(s) => s,
            None => self.store.last_event_seq()?,
        };
        let store = self.store.clone();
        struct St {
            rx: broadcast::Receiver<Event>,
            store: Store,
            last: u64,
            backlog: std::collections::VecDeque<Event>,
        }
        let st = St {
            rx,
            store,
            last,
            backlog: Default::default(),
        };
        Ok(futures::stream::unfold(st, |mut st| async move {
            loop {
                if st.backlog.is_empty() {
                    // Replay what the store has past `last` (the start, or after a lag).
                    match st.store.events_since(st.last, 500) {
                        Ok(past) => st.backlog.extend(past),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot replay events");
                            return None;
                        }
                    }
                }
                if let Some(e) = st.backlog.pop_front() {
                    st.last = seq_of(&e);
                    return Some((e, st));
                }
                match st.rx.recv().await {
                    Ok(e) if seq_of(&e) > st.last => {
                        st.last = seq_of(&e);
                        return Some((e, st));
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn replays_from_a_seq_then_follows_live() {
        let store = Store::open_in_memory().unwrap();
        let events = Events::new(store);
        events.emit(EventBody::SandboxDeleted("sbx_a".into()));
        events.emit(EventBody::SandboxDeleted("sbx_b".into()));
        let mut all = Box::pin(events.stream(Some(0)).unwrap());
        let mut new_only = Box::pin(events.stream(None).unwrap());
        events.emit(EventBody::SandboxDeleted("sbx_c".into()));
        let seqs: Vec<u64> = (&mut all).take(3).map(|e| seq_of(&e)).collect().await;
        assert_eq!(seqs, [1, 2, 3]);
        let e = new_only.next().await.unwrap();
        assert!(
            matches!(e, Event::SandboxDeleted { seq: 3, ref sandbox_id, .. } if sandbox_id == "sbx_c")
        );
    }
}
