//! Waiting on the daemon's event stream (`GET /v1/events`) instead of polling or sleeping: the
//! tests of timeouts, pauses and persistence follow a sandbox through its states this way.

use std::time::Duration;

use belljar_api::{Event, Sandbox, SandboxStatus};
use belljar_client::NdjsonStream;

/// Waits (up to `secs`) for an event on `events` that `pick` accepts, and returns what it
/// picked; panics naming `what` on the deadline or when the stream ends.
pub async fn wait_event<T>(
    events: &mut NdjsonStream<Event>,
    secs: u64,
    what: &str,
    mut pick: impl FnMut(Event) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(secs), async {
        loop {
            let e = events.next().await.unwrap().expect("events stream ended");
            if let Some(v) = pick(e) {
                return v;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Picks sandbox `id` reaching `status`.
pub fn status_of(id: &str, status: SandboxStatus) -> impl FnMut(Event) -> Option<Sandbox> + '_ {
    move |e| match e {
        Event::Sandbox { sandbox, .. } if sandbox.id == id && sandbox.status == status => {
            Some(*sandbox)
        }
        _ => None,
    }
}

/// Picks sandbox `id`'s deletion.
pub fn deleted(id: &str) -> impl FnMut(Event) -> Option<()> + '_ {
    move |e| matches!(e, Event::SandboxDeleted { sandbox_id, .. } if sandbox_id == id).then_some(())
}
