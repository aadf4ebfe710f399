//! Templates (one row each): the request that made the template, as JSON, so that a new
//! field of `CreateTemplate` needs no new column.

use belljar_api::CreateTemplate;
use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError, json_col};

impl Store {
    /// Records a new template; `false` when one of that name exists.
    pub fn insert_template(&self, t: &CreateTemplate, created_at: i64) -> Result<bool, StoreError> {
        let body = serde_json::to_string(t)?;
        let n = self.conn().execute(
            "INSERT OR IGNORE INTO templates (name, image, body, created_at) \
             VALUES (?1, ?2, ?3, ?4)",
            params![t.name, t.image, body, created_at],
        )?;
        Ok(n == 1)
    }

    /// The template `name` and when it was made.
    pub fn template(&self, name: &str) -> Result<Option<(CreateTemplate, i64)>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT body, created_at FROM templates WHERE name = ?1",
                params![name],
                |r| Ok((json_col(0, &r.get::<_, String>(0)?)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// Every template, by name.
    pub fn templates(&self) -> Result<Vec<(CreateTemplate, i64)>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare_cached("SELECT body, created_at FROM templates ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok((json_col(0, &r.get::<_, String>(0)?)?, r.get(1)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Replaces template `t.name`'s request, keeping when it was made; `false` when there is
    /// none.
    pub fn replace_template(&self, t: &CreateTemplate) -> Result<bool, StoreError> {
        let body = serde_json::to_string(t)?;
        let n = self.conn().execute(
            "UPDATE templates SET image = ?2, body = ?3 WHERE name = ?1",
            params![t.name, t.image, body],
        )?;
        Ok(n == 1)
    }

    /// Deletes the template; `false` when there was none.
    pub fn delete_template(&self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .conn()
            .execute("DELETE FROM templates WHERE name = ?1", params![name])?;
        Ok(n == 1)
    }

    /// The templates over image `image` (as they name it), by name.
    pub fn templates_of_image(&self, image: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare_cached("SELECT name FROM templates WHERE image = ?1 ORDER BY name")?;
        let rows = stmt.query_map(params![image], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_kept_by_name_and_found_by_image() {
        let store = Store::open_in_memory().unwrap();
        let t = CreateTemplate {
            name: "py".into(),
            image: "python3.13".into(),
            memory_mib: Some(512),
            pool: Some(2),
            ..CreateTemplate::default()
        };
        assert!(store.insert_template(&t, 7).unwrap());
        let mut other = t.clone();
        other.image = "base".into();
        assert!(
            !store.insert_template(&other, 8).unwrap(),
            "a duplicate name"
        );
        assert_eq!(store.template("py").unwrap(), Some((t.clone(), 7)));
        assert_eq!(store.templates().unwrap(), vec![(t, 7)]);
        assert_eq!(store.templates_of_image("python3.13").unwrap(), ["py"]);
        assert!(store.templates_of_image("base").unwrap().is_empty());
        assert!(
            store
                .images_in_use()
                .unwrap()
                .contains(&("python3.13".into(), None))
        );
        assert!(store.delete_template("py").unwrap());
        assert!(!store.delete_template("py").unwrap());
        assert!(store.template("py").unwrap().is_none());
    }
}
