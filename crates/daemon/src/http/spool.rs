//! Spooling an upload's body to a file in the image store's scratch directory, up to the
//! store's cap.
//!
//! A body over the cap is refused only after the client has finished sending it (or after
//! [`DRAIN_FOR`]): answering while the client is still writing closes the connection under
//! it, and the client then sees a reset or a broken pipe instead of the daemon's error.

use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::error::ApiError;

/// How long the rest of a refused body is read and dropped before the error is answered.
const DRAIN_FOR: Duration = Duration::from_secs(30);

/// Why a body was not spooled.
#[derive(Debug)]
pub enum SpoolError {
    /// The body is larger than the cap (`limit` bytes); nothing is kept.
    TooLarge { limit: u64 },
    /// Reading the body or writing the file failed; nothing is kept.
    Io(std::io::Error),
}

/// The API's answer: `image_too_large` (the store's cap is the limit), or `bad_request`.
impl From<SpoolError> for ApiError {
    fn from(e: SpoolError) -> Self {
        match e {
            SpoolError::TooLarge { limit } => {
                crate::images::ImageError::from(belljar_oci::Error::TooLarge { limit }).into()
            }
            SpoolError::Io(e) => ApiError::BadRequest(format!("body: {e}")),
        }
    }
}

/// Writes `body` to `path` and syncs it; the file is removed again on any error.
pub async fn spool(body: Body, path: &Path, cap: u64) -> Result<(), SpoolError> {
    let mut stream = body.into_data_stream();
    let written = async {
        let mut file = tokio::fs::File::create(path).await?;
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            written += chunk.len() as u64;
            if written > cap {
                return Ok(false);
            }
            file.write_all(&chunk).await?;
        }
        file.sync_all().await.map(|()| true)
    }
    .await;
    let result = match written {
        Ok(true) => return Ok(()),
        Ok(false) => {
            let drain = async { while let Some(Ok(_)) = stream.next().await {} };
            let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
            Err(SpoolError::TooLarge { limit: cap })
        }
        Err(e) => Err(SpoolError::Io(e)),
    };
    let _ = tokio::fs::remove_file(path).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(n: usize, size: usize) -> Body {
        let items = (0..n).map(move |_| Ok::<_, std::io::Error>(vec![1u8; size]));
        Body::from_stream(futures::stream::iter(items))
    }

    #[tokio::test]
    async fn a_body_under_the_cap_is_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up.tar");
        spool(chunks(4, 1000), &path, 4000).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), 4000);
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_read_to_its_end_and_nothing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("up.tar");
        let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = read.clone();
        let items = (0..10).map(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(vec![1u8; 1000])
        });
        let body = Body::from_stream(futures::stream::iter(items));
        assert!(matches!(
            spool(body, &path, 2500).await,
            Err(SpoolError::TooLarge { limit: 2500 })
        ));
        assert_eq!(read.load(std::sync::atomic::Ordering::SeqCst), 10);
        assert!(!path.exists());
    }
}
