//! Files inside a running sandbox, passed through to its agent as streams so that any size
//! moves in constant memory; thumbnails are made on the host from the file's bytes.

use std::io::Cursor;

use belljar_agent_proto::client::{ByteStream, RequestBody};
use belljar_agent_proto::{
    FileEntry as AgentEntry, FileKind as AgentKind, MkdirRequest as AgentMkdir,
    MoveRequest as AgentMove,
};
use belljar_api::{
    FileEntry, FileKind, FileList, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT, MkdirRequest, MoveRequest,
    WatchEvent, WatchKind,
};
use futures::{Stream, StreamExt};

use super::{SandboxError, Sandboxes};

/// The largest file a thumbnail is made of.
const THUMBNAIL_MAX_BYTES: u64 = 32 << 20;

/// The largest image a thumbnail is made of, per side. A small file can claim any size (a
/// decompression bomb), so the decoder checks its header against these before it allocates.
const THUMBNAIL_MAX_SIDE: u32 = 16_384;

/// The most pixels a thumbnail is made of: a 32-megapixel photo fits, an 11000×11000 bomb
/// (121 megapixels in a few hundred KB of PNG) does not. Checked from the header, before
/// anything is decoded.
const THUMBNAIL_MAX_PIXELS: u64 = 32_000_000;

/// Memory one decode may allocate (32 megapixels of RGBA, and some).
const THUMBNAIL_MAX_ALLOC: u64 = 160 << 20;

/// Thumbnails made at once; the rest wait. Each holds up to [`THUMBNAIL_MAX_BYTES`] of file
/// and [`THUMBNAIL_MAX_ALLOC`] of pixels, so this bounds the daemon's memory for them.
static THUMBNAIL_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// A PNG thumbnail.
pub struct Thumbnail(pub Vec<u8>);

/// Why a thumbnail could not be made (the API's `not_an_image`).
#[derive(Debug, thiserror::Error)]
pub enum ThumbnailError {
    /// The file is past [`THUMBNAIL_MAX_BYTES`].
    #[error("The file is larger than {THUMBNAIL_MAX_BYTES} bytes")]
    TooLarge,
    /// The image's header claims more than [`THUMBNAIL_MAX_PIXELS`].
    #[error("{width}×{height} is past the limit of {THUMBNAIL_MAX_PIXELS} pixels")]
    TooManyPixels { width: u32, height: u32 },
    /// The bytes are no image the decoder reads, or one past its limits.
    #[error("Not an image that can be decoded")]
    Decode(#[source] image::ImageError),
    /// The format could not be guessed from the bytes.
    #[error("Cannot tell the image's format")]
    Format(#[source] std::io::Error),
    /// The thumbnail could not be written as PNG.
    #[error("Cannot write the thumbnail")]
    Encode(#[source] image::ImageError),
    /// The decoding thread ended without an answer.
    #[error("The thumbnail's worker ended")]
    Worker(#[source] tokio::task::JoinError),
}

fn check_path(field: &str, path: &str) -> Result<(), SandboxError> {
    if !path.starts_with('/') {
        return Err(SandboxError::BadRequest(format!(
            "{field}: must be an absolute path"
        )));
    }
    Ok(())
}

pub(crate) fn entry(e: AgentEntry) -> FileEntry {
    FileEntry {
        name: e.name,
        path: e.path,
        kind: match e.kind {
            AgentKind::File => FileKind::File,
            AgentKind::Directory => FileKind::Directory,
            AgentKind::Symlink => FileKind::Symlink,
            AgentKind::Other => FileKind::Other,
        },
        size: e.size,
        mode: e.mode,
        mtime: e.mtime,
        link_target: e.link_target,
    }
}

impl Sandboxes {
    /// A file's length (when known) and its bytes.
    pub async fn read_file(
        &self,
        id: &str,
        path: &str,
    ) -> Result<(Option<u64>, ByteStream), SandboxError> {
        check_path("path", path)?;
        let agent = self.agent_of(id).await?;
        agent
            .read_file(path)
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    /// Writes `body` to `path` (parents created) with `mode` (octal text, e.g. `644`).
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        mode: Option<&str>,
        body: RequestBody,
    ) -> Result<FileEntry, SandboxError> {
        check_path("path", path)?;
        let mode = mode
            .map(|m| {
                u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| SandboxError::BadRequest("mode: must be octal, e.g. 644".into()))
            })
            .transpose()?;
        let agent = self.agent_of(id).await?;
        agent
            .write_file(path, mode, None, body)
            .await
            .map(entry)
            .map_err(|e| self.agent_error(id, e))
    }

    /// Writes a file as `user`, who then owns it (the compatibility layers' users).
    pub async fn write_file_as(
        &self,
        id: &str,
        path: &str,
        user: Option<&str>,
        body: RequestBody,
    ) -> Result<FileEntry, SandboxError> {
        check_path("path", path)?;
        let agent = self.agent_of(id).await?;
        agent
            .write_file(path, None, user, body)
            .await
            .map(entry)
            .map_err(|e| self.agent_error(id, e))
    }

    pub async fn mkdir(&self, id: &str, req: MkdirRequest) -> Result<FileEntry, SandboxError> {
        self.mkdir_as(id, req, None).await
    }

    /// [`Sandboxes::mkdir`], the directories it creates owned by `user` (default `belljar`).
    pub async fn mkdir_as(
        &self,
        id: &str,
        req: MkdirRequest,
        user: Option<&str>,
    ) -> Result<FileEntry, SandboxError> {
        check_path("path", &req.path)?;
        let agent = self.agent_of(id).await?;
        let req = AgentMkdir {
            path: req.path,
            parents: true,
            mode: None,
            user: user.map(str::to_owned),
        };
        agent
            .mkdir(&req)
            .await
            .map(entry)
            .map_err(|e| self.agent_error(id, e))
    }

    /// One page of a directory: at most `limit` entries after `cursor`. The agent bounds the
    /// page and the client reads it with a bound, so no directory costs the daemon more.
    pub async fn list_files(
        &self,
        id: &str,
        path: &str,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<FileList, SandboxError> {
        check_path("path", path)?;
        let limit = limit.unwrap_or(LIST_DEFAULT_LIMIT);
        if !(1..=LIST_MAX_LIMIT).contains(&limit) {
            return Err(SandboxError::BadRequest(format!(
                "limit: must be 1..={LIST_MAX_LIMIT}"
            )));
        }
        if cursor.is_some_and(|c| c.is_empty() || c.len() > 2 * 4096) {
            return Err(SandboxError::BadRequest("cursor: not a cursor".into()));
        }
        let agent = self.agent_of(id).await?;
        let page = agent
            .list_page(path, Some(limit as usize), cursor)
            .await
            .map_err(|e| self.agent_error(id, e))?;
        Ok(FileList {
            path: path.to_owned(),
            entries: page.entries.into_iter().map(entry).collect(),
            next_cursor: page.next_cursor,
        })
    }

    pub async fn stat(&self, id: &str, path: &str) -> Result<FileEntry, SandboxError> {
        check_path("path", path)?;
        let agent = self.agent_of(id).await?;
        agent
            .stat(path)
            .await
            .map(entry)
            .map_err(|e| self.agent_error(id, e))
    }

    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), SandboxError> {
        check_path("path", path)?;
        if path == "/" {
            return Err(SandboxError::BadRequest(
                "path: refusing to remove /".into(),
            ));
        }
        let agent = self.agent_of(id).await?;
        agent
            .remove(path, recursive)
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    pub async fn move_path(&self, id: &str, req: MoveRequest) -> Result<FileEntry, SandboxError> {
        check_path("from", &req.from)?;
        check_path("to", &req.to)?;
        let agent = self.agent_of(id).await?;
        let req = AgentMove {
            from: req.from,
            to: req.to,
            overwrite: req.overwrite,
        };
        agent
            .move_path(&req)
            .await
            .map(entry)
            .map_err(|e| self.agent_error(id, e))
    }

    /// The tree under `path` as a tar stream.
    pub async fn download_tar(&self, id: &str, path: &str) -> Result<ByteStream, SandboxError> {
        check_path("path", path)?;
        let agent = self.agent_of(id).await?;
        agent
            .download_tar(path)
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    /// Extracts the tar stream `body` under `path`.
    pub async fn upload_tar(
        &self,
        id: &str,
        path: &str,
        body: RequestBody,
    ) -> Result<(), SandboxError> {
        self.upload_tar_as(id, path, None, body).await
    }

    /// [`Sandboxes::upload_tar`], what it extracts owned by `user` (default `belljar`).
    pub async fn upload_tar_as(
        &self,
        id: &str,
        path: &str,
        user: Option<&str>,
        body: RequestBody,
    ) -> Result<(), SandboxError> {
        check_path("path", path)?;
        let agent = self.agent_of(id).await?;
        agent
            .upload_tar(path, user, body)
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    /// Changes under `path` until the stream is dropped.
    pub async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<impl Stream<Item = WatchEvent> + use<>, SandboxError> {
        check_path("path", path)?;
        let agent = self.agent_of(id).await?;
        let events = agent
            .watch(path, recursive)
            .await
            .map_err(|e| self.agent_error(id, e))?;
        Ok(events
            .take_while(|e| futures::future::ready(e.is_ok()))
            .filter_map(|e| async move {
                let e = e.ok()?;
                Some(WatchEvent {
                    kind: match e.kind {
                        belljar_agent_proto::WatchKind::Create => WatchKind::Create,
                        belljar_agent_proto::WatchKind::Modify => WatchKind::Modify,
                        belljar_agent_proto::WatchKind::Remove => WatchKind::Remove,
                        belljar_agent_proto::WatchKind::Rename => WatchKind::Rename,
                    },
                    path: e.path,
                    to: e.to,
                    is_dir: e.is_dir,
                    ts: e.ts,
                })
            }))
    }

    /// A PNG of at most `size`×`size` pixels of an image file.
    pub async fn thumbnail(
        &self,
        id: &str,
        path: &str,
        size: u32,
    ) -> Result<Thumbnail, SandboxError> {
        if !(1..=1024).contains(&size) {
            return Err(SandboxError::BadRequest("size: must be 1..=1024".into()));
        }
        // The semaphore is a static that nothing closes, so `acquire` cannot fail.
        let _slot = THUMBNAIL_SLOTS.acquire().await.ok();
        let (len, mut body) = self.read_file(id, path).await?;
        if len.is_some_and(|l| l > THUMBNAIL_MAX_BYTES) {
            return Err(ThumbnailError::TooLarge.into());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk.map_err(|e| self.agent_error(id, e))?);
            if bytes.len() as u64 > THUMBNAIL_MAX_BYTES {
                return Err(ThumbnailError::TooLarge.into());
            }
        }
        let made = tokio::task::spawn_blocking(move || make_thumbnail(&bytes, size))
            .await
            .map_err(ThumbnailError::Worker)?;
        Ok(made?)
    }
}

/// Decodes an image and scales it to fit `size`×`size`, as PNG.
pub fn make_thumbnail(bytes: &[u8], size: u32) -> Result<Thumbnail, ThumbnailError> {
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(THUMBNAIL_MAX_SIDE);
    limits.max_image_height = Some(THUMBNAIL_MAX_SIDE);
    limits.max_alloc = Some(THUMBNAIL_MAX_ALLOC);
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(ThumbnailError::Format)?;
    reader.limits(limits);
    // One decoder: its header gives the size, checked before any pixel is decoded.
    let decoder = reader.into_decoder().map_err(ThumbnailError::Decode)?;
    let (width, height) = image::ImageDecoder::dimensions(&decoder);
    if u64::from(width) * u64::from(height) > THUMBNAIL_MAX_PIXELS {
        return Err(ThumbnailError::TooManyPixels { width, height });
    }
    let img = image::DynamicImage::from_decoder(decoder).map_err(ThumbnailError::Decode)?;
    let thumb = img.thumbnail(size, size);
    let mut out = Cursor::new(Vec::new());
    thumb
        .write_to(&mut out, image::ImageFormat::Png)
        .map_err(ThumbnailError::Encode)?;
    Ok(Thumbnail(out.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbnails_fit_the_box_and_refuse_non_images() {
        let img = image::RgbImage::from_pixel(300, 150, image::Rgb([200, 10, 10]));
        let mut png = Cursor::new(Vec::new());
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut png, image::ImageFormat::Png)
            .unwrap();
        let t = make_thumbnail(png.get_ref(), 64).unwrap();
        let back = image::load_from_memory(&t.0).unwrap();
        assert_eq!((back.width(), back.height()), (64, 32));
        assert!(matches!(
            make_thumbnail(b"not an image", 64),
            Err(ThumbnailError::Decode(_))
        ));
    }

    /// A PNG of `width`×`height` grey pixels, all zero: tiny on disk, huge in memory.
    fn png_bomb(width: u32, height: u32) -> Vec<u8> {
        use std::io::Write;
        fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
            out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
            let start = out.len();
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            let crc = crc32(&out[start..]);
            out.extend_from_slice(&crc.to_be_bytes());
        }
        fn crc32(bytes: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in bytes {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 {
                        (crc >> 1) ^ 0xEDB8_8320
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&width.to_be_bytes());
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // 8-bit greyscale
        chunk(&mut out, b"IHDR", &ihdr);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        let row = vec![0u8; width as usize + 1];
        for _ in 0..height {
            z.write_all(&row).unwrap();
        }
        chunk(&mut out, b"IDAT", &z.finish().unwrap());
        chunk(&mut out, b"IEND", &[]);
        out
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_it_costs_memory() {
        // Within the limits the hand-made PNG decodes: the file format is right.
        let small = png_bomb(512, 512);
        let t = make_thumbnail(&small, 64).unwrap();
        let back = image::load_from_memory(&t.0).unwrap();
        assert_eq!((back.width(), back.height()), (64, 64));
        // 6000×6000 (36 megapixels) is a file of a few dozen KB.
        let bomb = png_bomb(6_000, 6_000);
        assert!(bomb.len() < 1 << 20, "{}", bomb.len());
        let err = make_thumbnail(&bomb, 64).map(|_| ()).unwrap_err();
        assert!(
            matches!(
                &err,
                ThumbnailError::TooManyPixels {
                    width: 6_000,
                    height: 6_000
                }
            ),
            "{err:?}"
        );
        // Past the side limit too, whatever the memory.
        let tall = png_bomb(1, THUMBNAIL_MAX_SIDE + 1);
        assert!(make_thumbnail(&tall, 64).is_err());
    }

    #[test]
    fn paths_must_be_absolute() {
        assert!(check_path("path", "/a b/ü").is_ok());
        assert!(
            matches!(check_path("from", "rel"), Err(SandboxError::BadRequest(m)) if m.starts_with("from:"))
        );
    }
}
