//! The daemon's durable state in SQLite: sandboxes, commands (and where their logs are),
//! images, templates and events.
//!
//! The daemon is the only writer. WAL mode plus `synchronous=NORMAL` keeps every committed
//! transaction across a `kill -9` of the daemon (only a power loss can drop the last ones).
//! One connection behind a mutex: every statement is short, so the lock is never held long.

mod commands;
mod events;
mod group;
mod images;
mod layers;
mod migrations;
mod modal_secrets;
mod mounts;
mod sandboxes;
mod snapshots;
mod templates;
mod volumes;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::Connection;
use serde::de::DeserializeOwned;

pub use commands::CommandRecord;
pub use events::EventBody;
#[cfg(test)]
pub(crate) use events::append_event_in;
pub(crate) use group::in_savepoint;
pub use modal_secrets::ModalSecret;
pub use mounts::{HeldMount, MountRefused, slots as mount_slots};
pub use sandboxes::{ImageUser, ImageUserKind, SandboxPage};
pub use snapshots::{SandboxLayers, SnapshotPage, SnapshotRow};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("Database error")]
    Sqlite(#[from] rusqlite::Error),
    /// A JSON column could not be read or written.
    #[error("Bad JSON in the database")]
    Json(#[from] serde_json::Error),
    /// The database was written by a newer daemon.
    #[error("Database schema version {found} is newer than this daemon's {supported}")]
    TooNew { found: i64, supported: i64 },
    /// The database's schema version is negative, which no daemon writes.
    #[error("Database schema version {0} is not valid")]
    BadVersion(i64),
    /// A group of writes could not be committed (the reason is in the log).
    #[error("Database write not committed")]
    NotCommitted,
    /// A pagination cursor did not come from this daemon.
    #[error("Malformed cursor")]
    BadCursor,
}

/// Prepared statements kept per connection (rusqlite's default is 16; the store has more
/// distinct statements than that on its busy paths).
const STATEMENT_CACHE: usize = 64;

/// A handle on the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    /// Statements run so far, so that tests can check that an idle daemon leaves the
    /// database alone.
    statements: Arc<AtomicU64>,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        Self::setup(conn)
    }

    /// An in-memory database, for tests.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::setup(Connection::open_in_memory()?)
    }

    fn setup(mut conn: Connection) -> Result<Self, StoreError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every statement of the command path is prepared once and reused: parsing the SQL
        // was a tenth of the daemon's CPU time with 1000 commands in flight.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        migrations::migrate(&mut conn)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            statements: Arc::default(),
        })
    }

    /// How many times the database has been used (each read or write) since it was opened.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        // A panic while holding the lock cannot leave SQLite half-written (statements are
        // atomic), so a poisoned lock is still safe to use.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The wire name of a unit enum variant (strum's, the same as serde's), for TEXT columns.
pub(crate) fn enum_to_sql<T: Copy + Into<&'static str>>(value: &T) -> &'static str {
    (*value).into()
}

/// Maps a JSON decoding error inside a row mapper to a rusqlite error.
pub(crate) fn json_col<T: DeserializeOwned>(idx: usize, text: &str) -> rusqlite::Result<T> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A unit enum variant from its wire name in a TEXT column.
pub(crate) fn enum_col<T: std::str::FromStr<Err = strum::ParseError>>(
    idx: usize,
    text: &str,
) -> rusqlite::Result<T> {
    text.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}
