//! Command rows: what ran in a sandbox, how it ended, and where its output log is.

use std::path::PathBuf;

use belljar_api::{Command, CommandStatus};
use rusqlite::{OptionalExtension, Row, params};

use super::{Store, StoreError, enum_col, enum_to_sql, json_col};

const COLUMNS: &str = "id, sandbox_id, agent_id, argv, cwd, user, pty, status, exit_code, \
    signal, started_at, finished_at, log_path";

/// A command as the daemon keeps it: the public view plus the agent's id for it and the
/// NDJSON log file its output is appended to.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRecord {
    pub command: Command,
    pub agent_id: Option<String>,
    pub log_path: PathBuf,
}

impl Store {
    /// Inserts or replaces the whole row.
    pub fn put_command(&self, rec: &CommandRecord) -> Result<(), StoreError> {
        let c = &rec.command;
        let sql = format!(
            "INSERT INTO commands ({COLUMNS}) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
             ON CONFLICT (id) DO UPDATE SET {}",
            super::sandboxes::update_set(COLUMNS)
        );
        self.conn().execute(
            &sql,
            params![
                c.id,
                c.sandbox_id,
                rec.agent_id,
                serde_json::to_string(&c.argv)?,
                c.cwd,
                c.user,
                c.pty,
                enum_to_sql(&c.status)?,
                c.exit_code,
                c.signal,
                c.started_at,
                c.finished_at,
                rec.log_path.to_string_lossy(),
            ],
        )?;
        Ok(())
    }

    pub fn command(&self, sandbox_id: &str, id: &str) -> Result<Option<CommandRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM commands WHERE sandbox_id = ?1 AND id = ?2");
        Ok(self
            .conn()
            .query_row(&sql, [sandbox_id, id], row_to_command)
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

    /// The sandbox's commands still marked running, oldest first.
    pub fn running_commands(&self, sandbox_id: &str) -> Result<Vec<CommandRecord>, StoreError> {
        self.query_commands(
            &format!(
                "SELECT {COLUMNS} FROM commands WHERE sandbox_id = ?1 AND status = 'running' \
                 ORDER BY started_at, id"
            ),
            sandbox_id,
        )
    }

    fn query_commands(&self, sql: &str, arg: &str) -> Result<Vec<CommandRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(sql)?;
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
        },
        agent_id: r.get(2)?,
        log_path: PathBuf::from(r.get::<_, String>(12)?),
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
            },
            agent_id: Some("a1".into()),
            log_path: PathBuf::from(format!("/logs/{id}.ndjson")),
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
        assert_eq!(store.running_commands("sbx_a").unwrap().len(), 1);
        store.delete_sandbox("sbx_a").unwrap();
        assert!(store.commands("sbx_a").unwrap().is_empty());
    }
}
