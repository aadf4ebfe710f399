//! What the daemon last saw of each image (digest, size, build time), so that `GET /v1/images`
//! can show when an image was built even while its cache directory is being rebuilt.

use belljar_api::{Image, ImageStatus};
use rusqlite::params;

use super::{Store, StoreError};

impl Store {
    /// Records a ready image.
    pub fn put_image(&self, image: &Image, now: i64) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT OR REPLACE INTO images (name, digest, size_bytes, built_at, seen_at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                image.name,
                image.digest,
                image.size_bytes.map(|s| s as i64),
                image.built_at,
                now
            ],
        )?;
        Ok(())
    }

    /// Every image ever recorded, by name, with status `ready` (the caller checks the disk).
    pub fn images(&self) -> Result<Vec<Image>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT name, digest, size_bytes, built_at FROM images ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok(Image {
                name: r.get(0)?,
                status: ImageStatus::Ready,
                digest: r.get(1)?,
                size_bytes: r.get::<_, Option<i64>>(2)?.map(|s| s as u64),
                built_at: r.get(3)?,
                command: None,
                shared_bytes: None,
                last_used_at: None,
                source: None,
                used_by: None,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_upserted_by_name() {
        let store = Store::open_in_memory().unwrap();
        let mut img = Image {
            name: "base".into(),
            status: ImageStatus::Ready,
            digest: Some("d1".into()),
            size_bytes: Some(5),
            built_at: Some(1),
            command: None,
            shared_bytes: None,
            last_used_at: None,
            source: None,
            used_by: None,
        };
        store.put_image(&img, 1).unwrap();
        img.digest = Some("d2".into());
        store.put_image(&img, 2).unwrap();
        assert_eq!(store.images().unwrap(), vec![img]);
    }
}
