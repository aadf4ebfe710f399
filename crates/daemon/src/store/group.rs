//! Group commit: the writes of many concurrent requests in one transaction, so that the WAL
//! frames, locks and commit of each are paid once per group instead of once per write
//! (with 1000 commands in flight, three commits per command were most of the daemon's
//! kernel time). See [`crate::events::Events::record_grouped`], which queues the writes.

use rusqlite::Connection;

use super::{Store, StoreError};

impl Store {
    /// Runs `writes` in one transaction and commits it. `None` when the transaction could not
    /// be begun or committed (it is then rolled back, and nothing of it is on disk).
    pub(crate) fn group_commit<R>(&self, writes: impl FnOnce(&Connection) -> R) -> Option<R> {
        let mut conn = self.conn();
        let tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                tracing::warn!(error = %e, "cannot begin a group of writes");
                return None;
            }
        };
        let out = writes(&tx);
        match tx.commit() {
            Ok(()) => Some(out),
            Err(e) => {
                tracing::warn!(error = %e, "cannot commit a group of writes");
                None
            }
        }
    }
}

/// Runs `f` in a savepoint on `conn`: its writes are kept when it succeeds and undone when it
/// fails, whatever else the enclosing transaction holds.
pub(crate) fn in_savepoint<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    conn.prepare_cached("SAVEPOINT w")?.execute([])?;
    match f(conn) {
        Ok(r) => {
            conn.prepare_cached("RELEASE w")?.execute([])?;
            Ok(r)
        }
        Err(e) => {
            conn.execute_batch("ROLLBACK TO w; RELEASE w")?;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_is_undone_and_the_rest_of_the_group_committed() {
        let store = Store::open_in_memory().unwrap();
        let results = store
            .group_commit(|c| {
                let ok = in_savepoint(c, |c| {
                    Ok(c.execute(
                        "INSERT INTO events (seq, ts, sandbox_id, body) VALUES (1, 1, 's', '{}')",
                        [],
                    )?)
                });
                let failed: Result<(), StoreError> = in_savepoint(c, |c| {
                    c.execute(
                        "INSERT INTO events (seq, ts, sandbox_id, body) VALUES (2, 1, 's', '{}')",
                        [],
                    )?;
                    Err(StoreError::BadCursor)
                });
                (ok.is_ok(), failed.is_err())
            })
            .unwrap();
        assert_eq!(results, (true, true));
        assert_eq!(store.last_event_seq().unwrap(), 1);
    }
}
