//! The Modal layer's named secrets (`Secret.objects.create`, `Secret.from_name`): their
//! variables by environment and name. They are the user's secrets, so they live here and
//! nowhere else: never in a sandbox's snapshot, an event or a log line.

use std::collections::HashMap;

use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError};

/// A named secret: its id and variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModalSecret {
    pub id: String,
    pub env: HashMap<String, String>,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String)> {
    Ok((r.get(0)?, r.get(1)?))
}

fn secret((id, env): (String, String)) -> Result<ModalSecret, StoreError> {
    let env = serde_json::from_str(&env)?;
    Ok(ModalSecret { id, env })
}

impl Store {
    /// Records a named secret; `false` when one of that name exists (nothing changes then),
    /// unless `replace`, when the existing one takes the new id and variables.
    pub fn put_modal_secret(
        &self,
        environment: &str,
        name: &str,
        secret: &ModalSecret,
        created_at: i64,
        replace: bool,
    ) -> Result<bool, StoreError> {
        let env = serde_json::to_string(&secret.env)?;
        let sql = if replace {
            "INSERT INTO modal_secrets (id, environment, name, env, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (environment, name) DO UPDATE SET id = ?1, env = ?4, created_at = ?5"
        } else {
            "INSERT OR IGNORE INTO modal_secrets (id, environment, name, env, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)"
        };
        let n = self
            .conn()
            .execute(sql, params![secret.id, environment, name, env, created_at])?;
        Ok(n == 1)
    }

    pub fn modal_secret_named(
        &self,
        environment: &str,
        name: &str,
    ) -> Result<Option<ModalSecret>, StoreError> {
        self.conn()
            .query_row(
                "SELECT id, env FROM modal_secrets WHERE environment = ?1 AND name = ?2",
                params![environment, name],
                row,
            )
            .optional()?
            .map(secret)
            .transpose()
    }

    pub fn modal_secret(&self, id: &str) -> Result<Option<ModalSecret>, StoreError> {
        self.conn()
            .query_row(
                "SELECT id, env FROM modal_secrets WHERE id = ?1",
                params![id],
                row,
            )
            .optional()?
            .map(secret)
            .transpose()
    }

    /// Deletes a named secret by id; `false` when there is none.
    pub fn delete_modal_secret(&self, id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn()
            .execute("DELETE FROM modal_secrets WHERE id = ?1", params![id])?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_secrets_are_kept_replaced_and_deleted() {
        let store = Store::open_in_memory().unwrap();
        let a = ModalSecret {
            id: "st-a".into(),
            env: HashMap::from([("K".into(), "v".into())]),
        };
        assert!(store.put_modal_secret("main", "s", &a, 1, false).unwrap());
        let b = ModalSecret {
            id: "st-b".into(),
            env: HashMap::from([("K".into(), "w".into())]),
        };
        assert!(!store.put_modal_secret("main", "s", &b, 2, false).unwrap());
        assert_eq!(
            store.modal_secret_named("main", "s").unwrap(),
            Some(a.clone())
        );
        assert_eq!(store.modal_secret_named("dev", "s").unwrap(), None);
        assert!(store.put_modal_secret("main", "s", &b, 2, true).unwrap());
        assert_eq!(store.modal_secret("st-b").unwrap(), Some(b));
        assert_eq!(store.modal_secret("st-a").unwrap(), None);
        assert!(store.delete_modal_secret("st-b").unwrap());
        assert!(!store.delete_modal_secret("st-b").unwrap());
    }
}
