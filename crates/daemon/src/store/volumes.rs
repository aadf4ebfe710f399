//! Named volumes (one row each) and whose permissions a sandbox's host folders were checked
//! with (`sandboxes.mounts_as`), which every later start of the sandbox opens them as again.

use belljar_api::Volume;
use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError};

impl Store {
    /// Records a new volume; `false` when one of that name exists.
    pub fn insert_volume(
        &self,
        name: &str,
        size_mib: Option<u64>,
        created_at: i64,
    ) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "INSERT OR IGNORE INTO volumes (name, size_mib, created_at) VALUES (?1, ?2, ?3)",
            params![name, size_mib.map(|s| s as i64), created_at],
        )?;
        Ok(n == 1)
    }

    pub fn volume(&self, name: &str) -> Result<Option<Volume>, StoreError> {
        let found = self
            .conn()
            .query_row(
                "SELECT name, size_mib, created_at FROM volumes WHERE name = ?1",
                params![name],
                |r| {
                    Ok(Volume {
                        name: r.get(0)?,
                        size_mib: r.get::<_, Option<i64>>(1)?.map(|s| s as u64),
                        created_at: r.get(2)?,
                        used_by: Vec::new(),
                    })
                },
            )
            .optional()?;
        match found {
            Some(mut v) => {
                v.used_by = self.volume_users(name)?;
                Ok(Some(v))
            }
            None => Ok(None),
        }
    }

    pub fn volumes(&self) -> Result<Vec<Volume>, StoreError> {
        let names: Vec<String> = {
            let conn = self.conn();
            let mut stmt = conn.prepare_cached("SELECT name FROM volumes ORDER BY name")?;
            stmt.query_map([], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        let mut out = Vec::new();
        for n in names {
            if let Some(v) = self.volume(&n)? {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Deletes the volume's row unless a sandbox mounts it, in one statement: `Ok(false)`
    /// when a sandbox does (or the volume is gone).
    pub fn delete_unused_volume(&self, name: &str) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM volumes WHERE name = ?1 AND NOT EXISTS (
                SELECT 1 FROM sandboxes, json_each(sandboxes.volumes)
                WHERE json_extract(json_each.value, '$.source') = ?1)",
            params![name],
        )?;
        Ok(n == 1)
    }

    /// The sandboxes whose mounts name volume `name`, oldest first.
    pub fn volume_users(&self, name: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT DISTINCT sandboxes.id FROM sandboxes, json_each(sandboxes.volumes)
             WHERE json_extract(json_each.value, '$.source') = ?1
             ORDER BY sandboxes.created_at, sandboxes.id",
        )?;
        let ids = stmt
            .query_map(params![name], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Ok(ids)
    }

    /// Records whose permissions the sandbox's host folders were checked with (`None`: a TCP
    /// caller's, held to the daemon's allowed mount roots).
    pub fn set_mounts_as(&self, id: &str, uid: Option<u32>) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE sandboxes SET mounts_as = ?2 WHERE id = ?1",
            params![id, uid],
        )?;
        Ok(())
    }

    pub fn mounts_as(&self, id: &str) -> Result<Option<u32>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT mounts_as FROM sandboxes WHERE id = ?1",
                params![id],
                |r| r.get::<_, Option<u32>>(0),
            )
            .optional()?
            .flatten())
    }
}

#[cfg(test)]
mod tests {
    use belljar_api::VolumeMount;

    use super::super::sandboxes::tests::sample;
    use super::*;

    #[test]
    fn a_volume_in_use_is_not_deleted() {
        let store = Store::open_in_memory().unwrap();
        assert!(store.insert_volume("data", Some(64), 1).unwrap());
        assert!(!store.insert_volume("data", None, 2).unwrap());
        let mut s = sample("sbx_a", 1);
        s.volumes = Some(vec![VolumeMount {
            source: "data".into(),
            path: "/data".into(),
            read_only: None,
        }]);
        store.put_sandbox(&s).unwrap();
        store.set_mounts_as("sbx_a", Some(1000)).unwrap();
        assert_eq!(store.mounts_as("sbx_a").unwrap(), Some(1000));
        assert_eq!(store.volume("data").unwrap().unwrap().used_by, ["sbx_a"]);
        assert!(!store.delete_unused_volume("data").unwrap());
        // Saving the sandbox again keeps whose permissions its mounts were checked with.
        store.put_sandbox(&s).unwrap();
        assert_eq!(store.mounts_as("sbx_a").unwrap(), Some(1000));
        store.delete_sandbox("sbx_a").unwrap();
        assert!(store.delete_unused_volume("data").unwrap());
        assert!(store.volume("data").unwrap().is_none());
    }
}
