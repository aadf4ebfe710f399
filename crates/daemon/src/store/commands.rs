//! Command rows: what ran in a sandbox, how it ended, and where its output log is.

use std::path::PathBuf;
use std::sync::LazyLock;

use belljar_api::{Command, CommandStatus, Event};
use rusqlite::{OptionalExtension, Row, params};

use super::{EventBody, Store, StoreError, enum_col, enum_to_sql, in_savepoint, json_col};

const VALUES: &str = "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16";

const COLUMNS: &str = "id, sandbox_id, agent_id, argv, cwd, user, pty, status, exit_code, \
    signal, started_at, finished_at, log_path, idempotency_key, status_reason, \
    output_truncated_bytes";

/// Inserts or replaces the whole row.
fn put_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO commands ({COLUMNS}) VALUES ({VALUES}) ON CONFLICT (id) DO UPDATE SET {}",
            super::sandboxes::update_set(COLUMNS)
        )
    });
    &SQL
}

/// Inserts a new row unless the sandbox has one with the same idempotency key.
fn insert_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO commands ({COLUMNS}) VALUES ({VALUES}) \
         ON CONFLICT (sandbox_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
        )
    });
    &SQL
}

/// Replaces the row only while it is `pending`.
fn promote_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO commands ({COLUMNS}) VALUES ({VALUES}) \
         ON CONFLICT (id) DO UPDATE SET {} WHERE status = 'pending'",
            super::sandboxes::update_set(COLUMNS)
        )
    });
    &SQL
}

/// A command as the daemon keeps it: the public view plus the agent's id for it (none while
/// `pending`), the NDJSON log file its output is appended to, and the client's idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRecord {
    pub command: Command,
    pub agent_id: Option<String>,
    pub log_path: PathBuf,
    pub idempotency_key: Option<String>,
}

impl Store {
    /// Inserts or replaces the whole row.
    pub fn put_command(&self, rec: &CommandRecord) -> Result<(), StoreError> {
        self.write_command(put_sql(), rec)?;
        Ok(())
    }

    /// Replaces the row only while it is still `pending`; `false` when something else (the
    /// sandbox stopping, adoption) settled it first.
    pub fn promote_command(&self, rec: &CommandRecord) -> Result<bool, StoreError> {
        Ok(self.write_command(promote_sql(), rec)? == 1)
    }

    /// Makes a command lost before the agent confirmed it `pending` again; `false` when it is
    /// not in that state (any more).
    pub fn revive_command(
        &self,
        sandbox_id: &str,
        id: &str,
        started_at: i64,
    ) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .prepare_cached(
                "UPDATE commands SET status = 'pending', status_reason = NULL, finished_at = NULL, \
             started_at = ?3 WHERE sandbox_id = ?1 AND id = ?2 AND status = 'lost' \
             AND agent_id IS NULL",
            )?
            .execute(params![sandbox_id, id, started_at])?
            == 1)
    }

    /// Removes a command that never started.
    pub fn delete_command(&self, sandbox_id: &str, id: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "DELETE FROM commands WHERE sandbox_id = ?1 AND id = ?2",
            [sandbox_id, id],
        )?;
        Ok(())
    }

    /// The sandbox's command with this idempotency key.
    pub fn command_by_key(
        &self,
        sandbox_id: &str,
        key: &str,
    ) -> Result<Option<CommandRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM commands WHERE sandbox_id = ?1 AND idempotency_key = ?2"
        );
        Ok(self
            .conn()
            .prepare_cached(&sql)?
            .query_row([sandbox_id, key], row_to_command)
            .optional()?)
    }

    /// [`Store::put_command`] and the command's event, in one transaction (a command's end).
    pub fn put_command_with_event(
        &self,
        rec: &CommandRecord,
        ts: i64,
    ) -> Result<Option<Event>, StoreError> {
        Ok(self.write_command_with_event(put_sql(), rec, ts)?.1)
    }

    /// Writes the row with `sql`; when a row changed, appends the command's event in the same
    /// transaction. An event that cannot be recorded does not undo the change (as with
    /// [`crate::events::Events::emit`]): it is left out and logged.
    fn write_command_with_event(
        &self,
        sql: &str,
        rec: &CommandRecord,
        ts: i64,
    ) -> Result<(bool, Option<Event>), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let written = Self::write_command_with_event_on(&tx, sql, rec, ts)?;
        tx.commit()?;
        Ok(written)
    }

    /// [`Store::write_command_with_event`] on a connection inside a transaction.
    fn write_command_with_event_on(
        conn: &rusqlite::Connection,
        sql: &str,
        rec: &CommandRecord,
        ts: i64,
    ) -> Result<(bool, Option<Event>), StoreError> {
        if Self::write_command_on(conn, sql, rec)? != 1 {
            return Ok((false, None));
        }
        let body = EventBody::Command(Box::new(rec.command.clone()));
        let event = match in_savepoint(conn, |c| super::events::append_event_in(c, body, ts)) {
            Ok(event) => Some(event),
            Err(e) => {
                tracing::warn!(command = %rec.command.id, error = %e, "cannot record an event");
                None
            }
        };
        Ok((true, event))
    }

    /// Inserts a new command inside a group of writes (see `Events::record_grouped`); `false`
    /// (and nothing written) when the sandbox already has a command with the same idempotency
    /// key.
    pub fn insert_command_on(
        conn: &rusqlite::Connection,
        rec: &CommandRecord,
    ) -> Result<bool, StoreError> {
        Ok(Self::write_command_on(conn, insert_sql(), rec)? == 1)
    }

    /// [`Store::promote_command`] and, when it promoted the row, the command's event, inside a
    /// group of writes (see `Events::record_grouped`).
    pub fn promote_command_with_event_on(
        conn: &rusqlite::Connection,
        rec: &CommandRecord,
        ts: i64,
    ) -> Result<(bool, Option<Event>), StoreError> {
        Self::write_command_with_event_on(conn, promote_sql(), rec, ts)
    }

    /// Reads the command and, when `settle` changes it, writes it with its event, inside a
    /// group of writes: the read and the write see no other writer in between. `None` when
    /// the command is gone or `settle` left it alone.
    pub fn settle_command_on(
        conn: &rusqlite::Connection,
        sandbox_id: &str,
        id: &str,
        settle: impl FnOnce(CommandRecord) -> Option<CommandRecord>,
        ts: i64,
    ) -> Result<Option<Event>, StoreError> {
        let Some(rec) = Self::command_on(conn, sandbox_id, id)? else {
            return Ok(None);
        };
        let Some(rec) = settle(rec) else {
            return Ok(None);
        };
        Ok(Self::write_command_with_event_on(conn, put_sql(), &rec, ts)?.1)
    }

    fn write_command(&self, sql: &str, rec: &CommandRecord) -> Result<usize, StoreError> {
        Self::write_command_on(&self.conn(), sql, rec)
    }

    fn write_command_on(
        conn: &rusqlite::Connection,
        sql: &str,
        rec: &CommandRecord,
    ) -> Result<usize, StoreError> {
        let c = &rec.command;
        Ok(conn.prepare_cached(sql)?.execute(params![
            c.id,
            c.sandbox_id,
            rec.agent_id,
            serde_json::to_string(&c.argv)?,
            c.cwd,
            c.user,
            c.pty,
            enum_to_sql(&c.status),
            c.exit_code,
            c.signal,
            c.started_at,
            c.finished_at,
            rec.log_path.to_string_lossy(),
            rec.idempotency_key,
            c.status_reason,
            i64::try_from(c.output_truncated_bytes).unwrap_or(i64::MAX),
        ])?)
    }

    pub fn command(&self, sandbox_id: &str, id: &str) -> Result<Option<CommandRecord>, StoreError> {
        Self::command_on(&self.conn(), sandbox_id, id)
    }

    fn command_on(
        conn: &rusqlite::Connection,
        sandbox_id: &str,
        id: &str,
    ) -> Result<Option<CommandRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM commands WHERE sandbox_id = ?1 AND id = ?2");
        Ok(conn
            .prepare_cached(&sql)?
            .query_row([sandbox_id, id], row_to_command)
            .optional()?)
    }

    /// The sandbox's commands, newest first.
    pub fn commands(&self, sandbox_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        self.query_commands(
            &format!(
                "SELECT {COLUMNS} FROM commands WHERE sandbox_id = ?1 \
                 ORDER BY started_at DESC, id DESC"
            ),
            sandbox_id,
        )
    }

    /// The sandbox's commands still marked running or pending, oldest first.
    pub fn unfinished_commands(&self, sandbox_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        self.query_commands(
            &format!(
                "SELECT {COLUMNS} FROM commands WHERE sandbox_id = ?1 \
                 AND status IN ('running', 'pending') ORDER BY started_at, id"
            ),
            sandbox_id,
        )
    }

    fn query_commands(&self, sql: &str, arg: &str) -> Result<Vec<CommandRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map([arg], row_to_command)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn row_to_command(r: &Row<'_>) -> rusqlite::Result<CommandRecord> {
    let status: CommandStatus = enum_col(7, &r.get::<_, String>(7)?)?;
    Ok(CommandRecord {
        command: Command {
            id: r.get(0)?,
            sandbox_id: r.get(1)?,
            argv: json_col(3, &r.get::<_, String>(3)?)?,
            cwd: r.get(4)?,
            user: r.get(5)?,
            pty: r.get(6)?,
            status,
            exit_code: r.get(8)?,
            signal: r.get(9)?,
            started_at: r.get(10)?,
            finished_at: r.get(11)?,
            status_reason: r.get(14)?,
            output_truncated_bytes: r.get::<_, i64>(15)?.max(0) as u64,
        },
        agent_id: r.get(2)?,
        log_path: PathBuf::from(r.get::<_, String>(12)?),
        idempotency_key: r.get(13)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sandboxes::tests::sample;

    fn cmd(id: &str, started_at: i64, status: CommandStatus) -> CommandRecord {
        CommandRecord {
            command: Command {
                id: id.into(),
                sandbox_id: "sbx_a".into(),
                argv: vec!["echo".into(), "hi there".into()],
                cwd: "/workspace".into(),
                user: "belljar".into(),
                pty: false,
                status,
                exit_code: None,
                signal: None,
                started_at,
                finished_at: None,
                status_reason: None,
                output_truncated_bytes: 0,
            },
            agent_id: Some("a1".into()),
            log_path: PathBuf::from(format!("/logs/{id}.ndjson")),
            idempotency_key: None,
        }
    }

    #[test]
    fn commands_round_trip_and_go_with_their_sandbox() {
        let store = Store::open_in_memory().unwrap();
        store.put_sandbox(&sample("sbx_a", 1)).unwrap();
        let mut a = cmd("cmd_a", 1, CommandStatus::Running);
        store.put_command(&a).unwrap();
        store
            .put_command(&cmd("cmd_b", 2, CommandStatus::Running))
            .unwrap();
        // Updating the sandbox keeps its commands.
        let mut s = sample("sbx_a", 1);
        s.status = belljar_api::SandboxStatus::Stopped;
        store.put_sandbox(&s).unwrap();
        assert_eq!(store.commands("sbx_a").unwrap().len(), 2);
        a.command.status = CommandStatus::Exited;
        a.command.exit_code = Some(3);
        a.command.finished_at = Some(5);
        a.command.output_truncated_bytes = 1 << 40;
        store.put_command(&a).unwrap();
        assert_eq!(store.command("sbx_a", "cmd_a").unwrap().unwrap(), a);
        assert!(store.command("sbx_other", "cmd_a").unwrap().is_none());
        let all: Vec<_> = store
            .commands("sbx_a")
            .unwrap()
            .into_iter()
            .map(|c| c.command.id)
            .collect();
        assert_eq!(all, ["cmd_b", "cmd_a"]);
        assert_eq!(store.unfinished_commands("sbx_a").unwrap().len(), 1);
        store.delete_sandbox("sbx_a").unwrap();
        assert!(store.commands("sbx_a").unwrap().is_empty());
    }

    /// Inserts `rec` as the daemon does, in a group commit.
    fn insert(store: &Store, rec: &CommandRecord) -> bool {
        store
            .group_commit(|c| Store::insert_command_on(c, rec))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn one_command_per_idempotency_key_and_sandbox_and_promotion_only_from_pending() {
        let store = Store::open_in_memory().unwrap();
        store.put_sandbox(&sample("sbx_a", 1)).unwrap();
        let mut first = cmd("cmd_a", 1, CommandStatus::Pending);
        first.idempotency_key = Some("k1".into());
        assert!(insert(&store, &first));
        let mut second = cmd("cmd_b", 2, CommandStatus::Pending);
        second.idempotency_key = Some("k1".into());
        assert!(!insert(&store, &second));
        assert!(store.command("sbx_a", "cmd_b").unwrap().is_none());
        assert_eq!(
            store
                .command_by_key("sbx_a", "k1")
                .unwrap()
                .unwrap()
                .command
                .id,
            "cmd_a"
        );
        // Commands without a key never collide.
        assert!(insert(&store, &cmd("cmd_c", 3, CommandStatus::Pending)));
        assert!(insert(&store, &cmd("cmd_d", 4, CommandStatus::Pending)));
        assert_eq!(store.unfinished_commands("sbx_a").unwrap().len(), 3);

        // Once settled (say lost), a late answer from the agent does not revive it.
        first.command.status = CommandStatus::Running;
        assert!(store.promote_command(&first).unwrap());
        let mut lost = cmd("cmd_c", 3, CommandStatus::Lost);
        lost.command.status_reason = Some("gone".into());
        store.put_command(&lost).unwrap();
        let late = cmd("cmd_c", 3, CommandStatus::Running);
        assert!(!store.promote_command(&late).unwrap());
        assert_eq!(store.command("sbx_a", "cmd_c").unwrap().unwrap(), lost);
        // Lost before the agent confirmed it: revivable once; a confirmed one never.
        let mut unconfirmed = lost.clone();
        unconfirmed.agent_id = None;
        store.put_command(&unconfirmed).unwrap();
        assert!(store.revive_command("sbx_a", "cmd_c", 9).unwrap());
        assert!(!store.revive_command("sbx_a", "cmd_c", 9).unwrap());
        let revived = store.command("sbx_a", "cmd_c").unwrap().unwrap();
        assert_eq!(revived.command.status, CommandStatus::Pending);
        assert!(revived.command.status_reason.is_none());
        assert!(!store.revive_command("sbx_a", "cmd_a", 9).unwrap());
        store.delete_command("sbx_a", "cmd_d").unwrap();
        assert!(store.command("sbx_a", "cmd_d").unwrap().is_none());
    }

    #[test]
    fn a_change_and_its_event_are_committed_together() {
        let store = Store::open_in_memory().unwrap();
        store.put_sandbox(&sample("sbx_a", 1)).unwrap();
        let pending = cmd("cmd_a", 1, CommandStatus::Pending);
        assert!(insert(&store, &pending));
        let statements = store.statements();
        let running = cmd("cmd_a", 1, CommandStatus::Running);
        let promote = |rec: &CommandRecord, ts| {
            store
                .group_commit(|c| Store::promote_command_with_event_on(c, rec, ts))
                .unwrap()
                .unwrap()
        };
        let (promoted, event) = promote(&running, 7);
        // One use of the connection (one transaction) for both.
        assert_eq!(store.statements(), statements + 1);
        assert!(promoted);
        let event = event.unwrap();
        assert!(matches!(
            &event,
            Event::Command { seq: 1, ts: 7, command } if command.status == CommandStatus::Running
        ));
        assert_eq!(store.command("sbx_a", "cmd_a").unwrap().unwrap(), running);
        assert_eq!(store.events_since(0, 10).unwrap(), vec![event]);

        // A row that is no longer pending is not promoted, and no event is recorded.
        let (promoted, event) = promote(&running, 8);
        assert!(!promoted && event.is_none());
        assert_eq!(store.last_event_seq().unwrap(), 1);

        let exited = cmd("cmd_a", 1, CommandStatus::Exited);
        let event = store.put_command_with_event(&exited, 9).unwrap().unwrap();
        assert!(matches!(event, Event::Command { seq: 2, .. }));
        assert_eq!(store.command("sbx_a", "cmd_a").unwrap().unwrap(), exited);
        assert_eq!(store.last_event_seq().unwrap(), 2);
    }
}
