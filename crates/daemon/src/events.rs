//! The event hub: every sandbox and command change is numbered in the store and broadcast
//! to live subscribers (`GET /v1/events`), so the UI follows changes instead of polling and
//! can resume after a disconnect with `?since=seq`.

use std::sync::{Arc, Mutex, mpsc};

use belljar_api::Event;
use futures::Stream;
use rusqlite::Connection;
use tokio::sync::{broadcast, oneshot};

use crate::store::{EventBody, Store, StoreError, in_savepoint};
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
    order: Arc<Mutex<()>>,
    /// Writes waiting for the next group commit (see [`Events::record_grouped`]).
    group: mpsc::Sender<GroupWrite>,
}

/// A write queued for a group commit: run inside the group's transaction (in a savepoint of
/// its own) with the group's timestamp; what it returns is called once the group is committed
/// (to broadcast its event and answer its waiter). Dropped unrun or uncalled when the group
/// could not be committed, which its waiter sees as an error.
type GroupWrite = Box<dyn FnOnce(&Connection, i64) -> Committed + Send>;
type Committed = Box<dyn FnOnce(&broadcast::Sender<Event>) + Send>;

/// The most writes one group commits.
const GROUP_MAX: usize = 512;

/// Commits the queued writes in groups until every sender is gone: all that queued while the
/// last group was being written go into the next one.
fn group_writer(
    store: Store,
    order: Arc<Mutex<()>>,
    tx: broadcast::Sender<Event>,
    queue: mpsc::Receiver<GroupWrite>,
) {
    while let Ok(first) = queue.recv() {
        let mut writes = vec![first];
        writes.extend(queue.try_iter().take(GROUP_MAX - 1));
        // Held from numbering to sending, as in `Events::emit`.
        let _order = order.lock().unwrap_or_else(|e| e.into_inner());
        let ts = now_ms();
        let committed = store.group_commit(|conn| {
            writes
                .into_iter()
                .map(|write| write(conn, ts))
                .collect::<Vec<_>>()
        });
        for done in committed.into_iter().flatten() {
            done(&tx);
        }
    }
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
        let order = Arc::new(Mutex::new(()));
        let (group, queue) = mpsc::channel();
        let writer = (store.clone(), order.clone(), tx.clone());
        std::thread::Builder::new()
            .name("belljard-writer".into())
            .spawn(move || group_writer(writer.0, writer.1, writer.2, queue))
            .expect("cannot start the database writer thread");
        Self {
            store,
            tx,
            order,
            group,
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
    /// commits both in one transaction, see `Store::put_command_with_event`), then
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

    /// [`Events::record`] as part of a group commit: `write` runs in a transaction shared with
    /// the other writes queued meanwhile, and this answers once that transaction is committed
    /// (so what it wrote is on disk), after the event is broadcast. A `write` that fails is
    /// undone alone.
    pub async fn record_grouped<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Connection, i64) -> Result<(T, Option<Event>), StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = oneshot::channel();
        let job: GroupWrite = Box::new(move |conn, ts| {
            let written = in_savepoint(conn, |c| write(c, ts));
            Box::new(move |tx: &broadcast::Sender<Event>| {
                let value = written.map(|(value, event)| {
                    if let Some(event) = event {
                        let _ = tx.send(event);
                    }
                    value
                });
                let _ = answer.send(value);
            })
        });
        self.group.send(job).map_err(|_| StoreError::NotCommitted)?;
        answered.await.map_err(|_| StoreError::NotCommitted)?
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn grouped_writes_are_committed_before_they_answer_and_broadcast_in_order() {
        let store = Store::open_in_memory().unwrap();
        let events = Arc::new(Events::new(store.clone()));
        let mut live = Box::pin(events.stream(None).unwrap());
        let writers = (0..200).map(|i| {
            let (events, store) = (events.clone(), store.clone());
            tokio::spawn(async move {
                let seq = events
                    .record_grouped(move |c, ts| {
                        let body = EventBody::SandboxDeleted(format!("sbx_{i}"));
                        let event = crate::store::append_event_in(c, body, ts)?;
                        Ok((seq_of(&event), Some(event)))
                    })
                    .await
                    .unwrap();
                // Answered only once committed: a reader finds it.
                assert!(store.last_event_seq().unwrap() >= seq);
                seq
            })
        });
        let mut seqs: Vec<u64> = futures::future::join_all(writers)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
        let live: Vec<u64> = (&mut live).take(200).map(|e| seq_of(&e)).collect().await;
        assert_eq!(live, seqs);

        // A write that fails is undone and answers its error; the others are kept.
        let failed = events
            .record_grouped(|c, ts| -> Result<((), Option<Event>), StoreError> {
                crate::store::append_event_in(c, EventBody::SandboxDeleted("x".into()), ts)?;
                Err(StoreError::BadCursor)
            })
            .await;
        assert!(matches!(failed, Err(StoreError::BadCursor)));
        assert_eq!(store.last_event_seq().unwrap(), 200);
    }

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
