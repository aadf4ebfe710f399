//! Sandbox rows: one row per sandbox, written whole on every change.

use belljar_api::{ListSandboxesQuery, Sandbox, SandboxStatus};
use rusqlite::{OptionalExtension, Row, params};

use super::{Store, StoreError, enum_col, enum_to_sql, json_col};

const COLUMNS: &str = "id, name, status, status_reason, image, backend, backend_reason, vcpus, \
    memory_mib, disk_mib, env, tags, source, created_at, started_at, stopped_at, timeout_ms, \
    expires_at, limits, lifecycle, volumes, image_id, template";

/// One page of a listing and the cursor of the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxPage {
    pub sandboxes: Vec<Sandbox>,
    pub next_cursor: Option<String>,
}

/// What stands on an image ([`Store::image_users`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUser {
    pub kind: ImageUserKind,
    /// The sandbox's or snapshot's id, the template's name.
    pub id: String,
    /// The image's name as it was made with.
    pub image: String,
    /// The image's id, when it is a user's image made with one.
    pub image_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageUserKind {
    Sandbox,
    Snapshot,
    Template,
}

impl Store {
    /// Inserts or replaces the whole row of `sandbox`.
    pub fn put_sandbox(&self, s: &Sandbox) -> Result<(), StoreError> {
        // An upsert, not `INSERT OR REPLACE`: a replace deletes the row first, and the
        // delete would cascade to the sandbox's commands.
        let sql = format!(
            "INSERT INTO sandboxes ({COLUMNS}) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23) \
             ON CONFLICT (id) DO UPDATE SET {}",
            update_set(COLUMNS)
        );
        let source = s.source.as_ref().map(serde_json::to_string).transpose()?;
        self.conn().execute(
            &sql,
            params![
                s.id,
                s.name,
                enum_to_sql(&s.status),
                s.status_reason,
                s.image,
                enum_to_sql(&s.backend),
                s.backend_reason,
                s.vcpus,
                s.memory_mib as i64,
                s.disk_mib as i64,
                serde_json::to_string(&s.env)?,
                serde_json::to_string(&s.tags)?,
                source,
                s.created_at,
                s.started_at,
                s.stopped_at,
                s.timeout_ms,
                s.expires_at,
                serde_json::to_string(&s.limits)?,
                serde_json::to_string(&s.lifecycle)?,
                s.volumes.as_ref().map(serde_json::to_string).transpose()?,
                s.image_id,
                s.template,
            ],
        )?;
        Ok(())
    }

    pub fn sandbox(&self, id: &str) -> Result<Option<Sandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1");
        Ok(self
            .conn()
            .prepare_cached(&sql)?
            .query_row([id], row_to_sandbox)
            .optional()?)
    }

    /// Deletes the sandbox and its commands; `false` when there was none.
    pub fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])?
            > 0)
    }

    /// Gives the sandbox a client's idempotency key; `false` when another sandbox has it.
    pub fn claim_sandbox_key(&self, id: &str, key: &str) -> Result<bool, StoreError> {
        match self.conn().execute(
            "UPDATE sandboxes SET idempotency_key = ?2 WHERE id = ?1",
            [id, key],
        ) {
            Ok(n) => Ok(n == 1),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The id of the sandbox created with this idempotency key.
    pub fn sandbox_by_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT id FROM sandboxes WHERE idempotency_key = ?1",
                [key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Each sandbox, usable snapshot and template with the image it stands on.
    pub fn image_users(&self) -> Result<Vec<ImageUser>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT 0, id, image, image_id FROM sandboxes \
             UNION ALL SELECT 1, id, image, image_id FROM snapshots WHERE status = 'created' \
             UNION ALL SELECT 2, name, image, NULL FROM templates",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(ImageUser {
                kind: match r.get::<_, i64>(0)? {
                    0 => ImageUserKind::Sandbox,
                    1 => ImageUserKind::Snapshot,
                    _ => ImageUserKind::Template,
                },
                id: r.get(1)?,
                image: r.get(2)?,
                image_id: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The image names that sandboxes (in any state but gone), usable snapshots and
    /// templates stand on: their images must stay.
    pub fn images_in_use(&self) -> Result<Vec<(String, Option<String>)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT image, image_id FROM sandboxes \
             UNION SELECT image, image_id FROM snapshots WHERE status = 'created' \
             UNION SELECT image, NULL FROM templates",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Sandboxes in any of `statuses`, oldest first.
    pub fn sandboxes_with_status(
        &self,
        statuses: &[SandboxStatus],
    ) -> Result<Vec<Sandbox>, StoreError> {
        let wanted: Vec<&str> = statuses.iter().map(enum_to_sql).collect();
        let sql = format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE status IN (SELECT value FROM json_each(?1)) \
             ORDER BY created_at, id"
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([serde_json::to_string(&wanted)?], row_to_sandbox)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// A page of sandboxes, newest first, filtered as `query` asks.
    pub fn list_sandboxes(&self, query: &ListSandboxesQuery) -> Result<SandboxPage, StoreError> {
        let limit = query.limit.unwrap_or(50).clamp(1, 200) as i64;
        let status = query.status.as_ref().map(enum_to_sql);
        let (tag_key, tag_value) = match query.tag.as_deref() {
            Some(tag) => match tag.split_once('=') {
                Some((k, v)) => (Some(k.to_owned()), Some(v.to_owned())),
                None => (Some(tag.to_owned()), None),
            },
            None => (None, None),
        };
        let (cur_created, cur_id) = match query.cursor.as_deref() {
            Some(c) => {
                let (t, id) = c.split_once('_').ok_or(StoreError::BadCursor)?;
                (
                    Some(t.parse::<i64>().map_err(|_| StoreError::BadCursor)?),
                    Some(id.to_owned()),
                )
            }
            None => (None, None),
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE \
             (?1 IS NULL OR status = ?1) \
             AND (?2 IS NULL OR EXISTS (SELECT 1 FROM json_each(sandboxes.tags) \
                  WHERE key = ?2 AND (?3 IS NULL OR value = ?3))) \
             AND (?4 IS NULL OR created_at >= ?4) \
             AND (?5 IS NULL OR created_at < ?5) \
             AND (?6 IS NULL OR created_at < ?6 OR (created_at = ?6 AND id < ?7)) \
             ORDER BY created_at DESC, id DESC LIMIT ?8"
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(
            params![
                status,
                tag_key,
                tag_value,
                query.since,
                query.until,
                cur_created,
                cur_id,
                limit + 1
            ],
            row_to_sandbox,
        )?;
        let mut sandboxes: Vec<Sandbox> = rows.collect::<Result<_, _>>()?;
        let next_cursor = if sandboxes.len() as i64 > limit {
            sandboxes.truncate(limit as usize);
            sandboxes
                .last()
                .map(|s| format!("{}_{}", s.created_at, s.id))
        } else {
            None
        };
        Ok(SandboxPage {
            sandboxes,
            next_cursor,
        })
    }
}

/// `a = excluded.a, ...` for every column but the first (the key).
pub(crate) fn update_set(columns: &str) -> String {
    columns
        .split(',')
        .map(str::trim)
        .skip(1)
        .map(|c| format!("{c} = excluded.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn row_to_sandbox(r: &Row<'_>) -> rusqlite::Result<Sandbox> {
    let source: Option<String> = r.get(12)?;
    Ok(Sandbox {
        id: r.get(0)?,
        name: r.get(1)?,
        status: enum_col(2, &r.get::<_, String>(2)?)?,
        status_reason: r.get(3)?,
        image: r.get(4)?,
        image_id: r.get(21)?,
        template: r.get(22)?,
        backend: enum_col(5, &r.get::<_, String>(5)?)?,
        backend_reason: r.get(6)?,
        vcpus: r.get(7)?,
        memory_mib: r.get::<_, i64>(8)? as u64,
        disk_mib: r.get::<_, i64>(9)? as u64,
        env: json_col(10, &r.get::<_, String>(10)?)?,
        tags: json_col(11, &r.get::<_, String>(11)?)?,
        source: source.map(|s| json_col(12, &s)).transpose()?,
        created_at: r.get(13)?,
        started_at: r.get(14)?,
        stopped_at: r.get(15)?,
        timeout_ms: r.get(16)?,
        expires_at: r.get(17)?,
        limits: json_col(18, &r.get::<_, String>(18)?)?,
        network_policy: None,
        mounts: None,
        volumes: r
            .get::<_, Option<String>>(20)?
            .map(|v| json_col(20, &v))
            .transpose()?,
        lifecycle: r
            .get::<_, Option<String>>(19)?
            .map(|l| json_col(19, &l))
            .transpose()?
            .unwrap_or_default(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use belljar_api::{Backend, LimitsReport, Source};

    use super::*;

    pub(crate) fn sample(id: &str, created_at: i64) -> Sandbox {
        Sandbox {
            id: id.to_owned(),
            name: None,
            status: SandboxStatus::Running,
            status_reason: None,
            image: "base".into(),
            image_id: None,
            template: None,
            backend: Backend::Namespace,
            backend_reason: "test".into(),
            vcpus: 2,
            memory_mib: 1024,
            disk_mib: 4096,
            env: BTreeMap::new(),
            tags: BTreeMap::new(),
            source: None,
            created_at,
            started_at: Some(created_at),
            stopped_at: None,
            timeout_ms: 300_000,
            expires_at: Some(created_at + 300_000),
            limits: LimitsReport::default(),
            network_policy: None,
            mounts: None,
            volumes: None,
            lifecycle: Default::default(),
        }
    }

    #[test]
    fn an_idempotency_key_names_one_sandbox() {
        let store = Store::open_in_memory().unwrap();
        store.put_sandbox(&sample("sbx_a", 1)).unwrap();
        store.put_sandbox(&sample("sbx_b", 2)).unwrap();
        assert!(store.claim_sandbox_key("sbx_a", "k").unwrap());
        assert!(!store.claim_sandbox_key("sbx_b", "k").unwrap());
        // Saving the sandbox again keeps its key.
        store.put_sandbox(&sample("sbx_a", 1)).unwrap();
        assert_eq!(store.sandbox_by_key("k").unwrap().as_deref(), Some("sbx_a"));
        assert_eq!(store.sandbox_by_key("other").unwrap(), None);
    }

    #[test]
    fn round_trips_every_field() {
        let store = Store::open_in_memory().unwrap();
        let mut s = sample("sbx_a", 10);
        s.name = Some("ünïcode name".into());
        s.env.insert("A".into(), "1".into());
        s.tags.insert("team".into(), "x".into());
        s.source = Some(Source::Git {
            url: "/tmp/repo".into(),
            revision: Some("main".into()),
        });
        s.status = SandboxStatus::Failed;
        s.status_reason = Some("boom".into());
        s.lifecycle.persistent = true;
        s.lifecycle.idle_timeout_ms = Some(1_000);
        s.lifecycle.deletes_at = Some(99);
        s.lifecycle.auto_resume = false;
        store.put_sandbox(&s).unwrap();
        assert_eq!(store.sandbox("sbx_a").unwrap().unwrap(), s);
        assert!(store.sandbox("sbx_b").unwrap().is_none());
        assert!(store.delete_sandbox("sbx_a").unwrap());
        assert!(!store.delete_sandbox("sbx_a").unwrap());
    }

    #[test]
    fn lists_newest_first_with_filters_and_cursor() {
        let store = Store::open_in_memory().unwrap();
        for i in 0..5 {
            let mut s = sample(&format!("sbx_{i}"), 100 + i);
            if i % 2 == 0 {
                s.tags.insert("even".into(), "yes".into());
                s.status = SandboxStatus::Stopped;
            }
            store.put_sandbox(&s).unwrap();
        }
        let q = ListSandboxesQuery {
            limit: Some(2),
            ..Default::default()
        };
        let page = store.list_sandboxes(&q).unwrap();
        let ids: Vec<_> = page.sandboxes.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["sbx_4", "sbx_3"]);
        let page2 = store
            .list_sandboxes(&ListSandboxesQuery {
                cursor: page.next_cursor.clone(),
                ..q.clone()
            })
            .unwrap();
        let ids: Vec<_> = page2.sandboxes.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["sbx_2", "sbx_1"]);

        let tagged = store
            .list_sandboxes(&ListSandboxesQuery {
                tag: Some("even=yes".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(tagged.sandboxes.len(), 3);
        assert!(tagged.next_cursor.is_none());

        let running = store
            .list_sandboxes(&ListSandboxesQuery {
                status: Some(SandboxStatus::Running),
                since: Some(102),
                until: Some(104),
                ..Default::default()
            })
            .unwrap();
        let ids: Vec<_> = running.sandboxes.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["sbx_3"]);

        let active = store
            .sandboxes_with_status(&[SandboxStatus::Running, SandboxStatus::Pending])
            .unwrap();
        assert_eq!(active.len(), 2);
        assert!(matches!(
            store.list_sandboxes(&ListSandboxesQuery {
                cursor: Some("garbage".into()),
                ..Default::default()
            }),
            Err(StoreError::BadCursor)
        ));
    }
}
