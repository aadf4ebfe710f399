//! Versioned schema migrations, applied in order at start and recorded in `user_version`.
//!
//! A migration is never edited once shipped; a schema change is a new entry at the end.

use rusqlite::Connection;

use super::StoreError;

const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    r#"
    CREATE TABLE sandboxes (
        id              TEXT PRIMARY KEY,
        name            TEXT,
        status          TEXT NOT NULL,
        status_reason   TEXT,
        image           TEXT NOT NULL,
        backend         TEXT NOT NULL,
        backend_reason  TEXT NOT NULL,
        vcpus           INTEGER NOT NULL,
        memory_mib      INTEGER NOT NULL,
        disk_mib        INTEGER NOT NULL,
        env             TEXT NOT NULL,
        tags            TEXT NOT NULL,
        source          TEXT,
        created_at      INTEGER NOT NULL,
        started_at      INTEGER,
        stopped_at      INTEGER,
        timeout_ms      INTEGER NOT NULL,
        expires_at      INTEGER,
        limits          TEXT NOT NULL
    );
    CREATE INDEX sandboxes_created ON sandboxes (created_at DESC, id DESC);
    CREATE INDEX sandboxes_status ON sandboxes (status);

    CREATE TABLE commands (
        id              TEXT PRIMARY KEY,
        sandbox_id      TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
        agent_id        TEXT,
        argv            TEXT NOT NULL,
        cwd             TEXT NOT NULL,
        user            TEXT NOT NULL,
        pty             INTEGER NOT NULL,
        status          TEXT NOT NULL,
        exit_code       INTEGER,
        signal          INTEGER,
        started_at      INTEGER NOT NULL,
        finished_at     INTEGER,
        log_path        TEXT NOT NULL
    );
    CREATE INDEX commands_sandbox ON commands (sandbox_id, started_at DESC);

    CREATE TABLE images (
        name            TEXT PRIMARY KEY,
        digest          TEXT,
        size_bytes      INTEGER,
        built_at        INTEGER,
        seen_at         INTEGER NOT NULL
    );

    CREATE TABLE events (
        seq             INTEGER PRIMARY KEY,
        ts              INTEGER NOT NULL,
        sandbox_id      TEXT,
        body            TEXT NOT NULL
    );
    "#,
    // 2: commands are recorded before they start (`pending`), may carry a client's
    // idempotency key (one command per key and sandbox), say why they were lost, and count
    // the output the agent dropped; sandboxes may carry an idempotency key too.
    r#"
    ALTER TABLE commands ADD COLUMN idempotency_key TEXT;
    ALTER TABLE commands ADD COLUMN status_reason TEXT;
    ALTER TABLE commands ADD COLUMN output_truncated_bytes INTEGER NOT NULL DEFAULT 0;
    CREATE UNIQUE INDEX commands_idempotency_key ON commands (sandbox_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    ALTER TABLE sandboxes ADD COLUMN idempotency_key TEXT;
    CREATE UNIQUE INDEX sandboxes_idempotency_key ON sandboxes (idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    "#,
    // 3: snapshots. A layer directory lives while `refs` (snapshots in status `created` and
    // sandboxes whose chain holds it) is above zero; each snapshot and each sandbox made from
    // one lists its whole chain of layers, topmost first.
    r#"
    CREATE TABLE layers (
        digest          TEXT PRIMARY KEY,
        size_bytes      INTEGER NOT NULL,
        refs            INTEGER NOT NULL
    );
    CREATE TABLE snapshots (
        id                  TEXT PRIMARY KEY,
        status              TEXT NOT NULL,
        status_reason       TEXT,
        source_sandbox_id   TEXT NOT NULL,
        parent_id           TEXT,
        image               TEXT NOT NULL,
        layers              TEXT NOT NULL,
        size_bytes          INTEGER NOT NULL,
        created_at          INTEGER NOT NULL,
        expiration_ms       INTEGER NOT NULL,
        expires_at          INTEGER,
        frozen_ms           INTEGER
    );
    CREATE INDEX snapshots_created ON snapshots (created_at DESC, id DESC);
    CREATE INDEX snapshots_sandbox ON snapshots (source_sandbox_id, created_at DESC);
    CREATE INDEX snapshots_expiry ON snapshots (expires_at) WHERE status = 'created';
    CREATE TABLE sandbox_layers (
        sandbox_id              TEXT PRIMARY KEY,
        snapshot_id             TEXT,
        layers                  TEXT NOT NULL,
        snapshot_expiration_ms  INTEGER,
        keep_last               TEXT
    );
    "#,
    // 4: a sandbox's lifecycle settings (persistence, idle pause, hard TTL, auto-resume) as
    // one JSON column; NULL reads as the defaults.
    r#"
    ALTER TABLE sandboxes ADD COLUMN lifecycle TEXT;
    "#,
    // 5: what each squash merged (a chain of layers, as JSON) into which layer, so that a
    // chain squashed once is never copied again (see `layers.rs`).
    r#"
    CREATE TABLE squashes (
        chain           TEXT PRIMARY KEY,
        merged          TEXT NOT NULL
    );
    CREATE INDEX squashes_merged ON squashes (merged);
    "#,
    // 6: directory snapshots (the directory they hold) and the directory snapshots a sandbox
    // mounts (JSON: snapshot id, path and layer digests), held like its own chain.
    r#"
    ALTER TABLE snapshots ADD COLUMN path TEXT;
    ALTER TABLE sandbox_layers ADD COLUMN mounts TEXT;
    "#,
    // 7: the host folders and volumes a sandbox mounts (JSON), the uid whose permissions
    // they were checked with (NULL: a TCP caller, held to `--allow-mount-root`), and the
    // named volumes.
    r#"
    ALTER TABLE sandboxes ADD COLUMN volumes TEXT;
    ALTER TABLE sandboxes ADD COLUMN mounts_as INTEGER;
    CREATE TABLE volumes (
        name            TEXT PRIMARY KEY,
        size_mib        INTEGER,
        created_at      INTEGER NOT NULL
    );
    "#,
    // 8: templates: an image plus the defaults of the sandboxes made from it and the size
    // of its warm pool (the whole `CreateTemplate` as JSON in `body`).
    r#"
    CREATE TABLE templates (
        name            TEXT PRIMARY KEY,
        image           TEXT NOT NULL,
        body            TEXT NOT NULL,
        created_at      INTEGER NOT NULL
    );
    CREATE INDEX templates_image ON templates (image);
    "#,
    // 9: the named secrets of the Modal layer (`Secret.objects.create`): their variables
    // (JSON), by environment and name.
    r#"
    CREATE TABLE modal_secrets (
        id              TEXT PRIMARY KEY,
        environment     TEXT NOT NULL,
        name            TEXT NOT NULL,
        env             TEXT NOT NULL,
        created_at      INTEGER NOT NULL,
        UNIQUE (environment, name)
    );
    "#,
    // 10: the id of the user's image a sandbox or snapshot stands on, fixed when it was made
    // (a name may come to name another image).
    r#"
    ALTER TABLE sandboxes ADD COLUMN image_id TEXT;
    ALTER TABLE snapshots ADD COLUMN image_id TEXT;
    "#,
    // 11: the template a sandbox was made from.
    r#"
    ALTER TABLE sandboxes ADD COLUMN template TEXT;
    "#,
];

/// The schema version this daemon writes.
pub fn latest() -> i64 {
    MIGRATIONS.len() as i64
}

/// Applies every migration newer than the database's `user_version`, each in a transaction.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if current > latest() {
        return Err(StoreError::TooNew {
            found: current,
            supported: latest(),
        });
    }
    let applied = usize::try_from(current).map_err(|_| StoreError::BadVersion(current))?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_is_a_no_op_and_newer_or_negative_schemas_are_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, latest());
        conn.pragma_update(None, "user_version", latest() + 1)
            .unwrap();
        assert!(matches!(migrate(&mut conn), Err(StoreError::TooNew { .. })));
        conn.pragma_update(None, "user_version", -1).unwrap();
        assert!(matches!(
            migrate(&mut conn),
            Err(StoreError::BadVersion(-1))
        ));
    }
}
