//! envd's `filesystem.Filesystem` service (Stat, MakeDir, Move, ListDir with a depth, Remove)
//! (watching is in [`super::watch`]) and its plain HTTP routes: `GET /files` (a file's bytes), `POST /files` (a multipart upload
//! of one or more files, or one file's bytes) and `GET /health`, over the daemon's file
//! service.
//!
//! Paths resolve against the user's home; what is written belongs to that user, and missing
//! parent directories are made. An upload is read whole before it is written, so it is bounded by
//! [`MAX_UPLOAD`].

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use belljar_api::{FileEntry, FileKind, MkdirRequest};
use bytes::Bytes;
use http_body_util::BodyExt;

use super::connect;
use super::error::{E2bError, Result};
use super::wire::{
    EntryBody, EntryInfo, FilesQuery, ListDirRequest, ListDirResponse, MoveRequest, PathRequest,
    WriteInfo,
};
use super::{EnvdUser, sandbox_of, setup};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::time::rfc3339;

/// The largest upload `POST /files` takes.
pub const MAX_UPLOAD: usize = 64 << 20;

/// The most entries one ListDir answers.
const MAX_LIST: usize = 10_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/files", get(download).post(upload))
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_path))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .merge(super::watch::router())
}

/// The sandbox, user and home of an envd request.
struct Ctx {
    sandbox: String,
    user: String,
    home: String,
}

fn ctx(headers: &HeaderMap, user: Option<&str>) -> Result<Ctx> {
    let user = setup::user(user);
    Ok(Ctx {
        sandbox: sandbox_of(headers)?,
        home: setup::home(&user),
        user,
    })
}

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Directory => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    }
}

fn entry_info(e: FileEntry) -> EntryInfo {
    EntryInfo {
        kind: kind_name(e.kind),
        size: e.size.to_string(),
        mode: e.mode,
        permissions: permissions(e.kind, e.mode),
        owner: String::new(),
        group: String::new(),
        modified_time: rfc3339(e.mtime),
        symlink_target: e.link_target,
        name: e.name,
        path: e.path,
    }
}

async fn unary<F>(f: F) -> Response
where
    F: Future<Output = Result<Response>>,
{
    f.await.unwrap_or_else(E2bError::into_connect_response)
}

type User = Option<Extension<EnvdUser>>;

fn name(u: &User) -> Option<&str> {
    u.as_ref().map(|u| u.0.0.as_str())
}

async fn stat(State(st): State<AppState>, headers: HeaderMap, u: User, body: Body) -> Response {
    unary(async {
        let c = ctx(&headers, name(&u))?;
        let req: PathRequest = connect::unary(body).await?;
        let path = setup::resolve(&req.path, &c.home)?;
        let entry = st.sandboxes.stat(&c.sandbox, &path).await?;
        Ok(connect::ok(&EntryBody {
            entry: entry_info(entry),
        }))
    })
    .await
}

async fn make_dir(State(st): State<AppState>, headers: HeaderMap, u: User, body: Body) -> Response {
    unary(async {
        let c = ctx(&headers, name(&u))?;
        let req: PathRequest = connect::unary(body).await?;
        let path = setup::resolve(&req.path, &c.home)?;
        // envd answers `already_exists` for a directory that is there; the SDK returns False.
        if st.sandboxes.stat(&c.sandbox, &path).await.is_ok() {
            return Err(E2bError::Exists(path));
        }
        let entry = st
            .sandboxes
            .mkdir_as(&c.sandbox, MkdirRequest { path }, Some(&c.user))
            .await?;
        Ok(connect::ok(&EntryBody {
            entry: entry_info(entry),
        }))
    })
    .await
}

async fn move_path(
    State(st): State<AppState>,
    headers: HeaderMap,
    u: User,
    body: Body,
) -> Response {
    unary(async {
        let c = ctx(&headers, name(&u))?;
        let req: MoveRequest = connect::unary(body).await?;
        let from = setup::resolve(&req.source, &c.home)?;
        let to = setup::resolve(&req.destination, &c.home)?;
        let entry = st
            .sandboxes
            .move_path(
                &c.sandbox,
                belljar_api::MoveRequest {
                    from,
                    to,
                    overwrite: true,
                },
            )
            .await?;
        Ok(connect::ok(&EntryBody {
            entry: entry_info(entry),
        }))
    })
    .await
}

async fn list_dir(State(st): State<AppState>, headers: HeaderMap, u: User, body: Body) -> Response {
    unary(async {
        let c = ctx(&headers, name(&u))?;
        let req: ListDirRequest = connect::unary(body).await?;
        let root = setup::resolve(&req.path, &c.home)?;
        let depth = req.depth.max(1);
        let mut entries = Vec::new();
        let mut level = vec![root];
        for _ in 0..depth {
            let mut next = Vec::new();
            for dir in level {
                let mut cursor: Option<String> = None;
                loop {
                    let page = st
                        .sandboxes
                        .list_files(&c.sandbox, &dir, None, cursor.as_deref())
                        .await?;
                    for e in page.entries {
                        if entries.len() >= MAX_LIST {
                            return Err(E2bError::Api(ApiError::PayloadTooLarge(MAX_LIST)));
                        }
                        if e.kind == FileKind::Directory {
                            next.push(e.path.clone());
                        }
                        entries.push(entry_info(e));
                    }
                    match page.next_cursor {
                        Some(n) => cursor = Some(n),
                        None => break,
                    }
                }
            }
            level = next;
        }
        Ok(connect::ok(&ListDirResponse { entries }))
    })
    .await
}

async fn remove(State(st): State<AppState>, headers: HeaderMap, u: User, body: Body) -> Response {
    unary(async {
        let c = ctx(&headers, name(&u))?;
        let req: PathRequest = connect::unary(body).await?;
        let path = setup::resolve(&req.path, &c.home)?;
        st.sandboxes.remove(&c.sandbox, &path, true).await?;
        Ok(connect::ok(&super::wire::Empty {}))
    })
    .await
}

fn query(
    q: std::result::Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<FilesQuery> {
    q.map(|q| q.0)
        .map_err(|e| E2bError::BadRequest(format!("query: {}", e.body_text())))
}

/// A file's bytes.
async fn download(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: std::result::Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response> {
    let q = query(q)?;
    let c = ctx(&headers, q.username.as_deref())?;
    let path = q
        .path
        .ok_or_else(|| E2bError::BadRequest("path: missing".into()))?;
    let path = setup::resolve(&path, &c.home)?;
    let (len, bytes) = st.sandboxes.read_file(&c.sandbox, &path).await?;
    let mut resp = (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(bytes),
    )
        .into_response();
    if let Some(len) = len {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, len.into());
    }
    Ok(resp)
}

/// Writes the uploaded files: each multipart part named by its file name (or, for one file,
/// by the `path` query), or the body itself for an octet-stream upload.
async fn upload(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: std::result::Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<Response> {
    let q = query(q)?;
    let c = ctx(&headers, q.username.as_deref())?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = match http_body_util::Limited::new(body, MAX_UPLOAD)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::PayloadTooLarge(MAX_UPLOAD).into());
        }
        Err(e) => return Err(E2bError::BadRequest(format!("body: {e}"))),
    };
    let files: Vec<(String, Bytes)> = if let Some(boundary) = boundary(&content_type) {
        let parts = multipart(&bytes, &boundary)?;
        let single = parts.len() == 1;
        parts
            .into_iter()
            .map(|(filename, data)| {
                let path = match (&q.path, single) {
                    (Some(p), true) => p.clone(),
                    _ => filename.ok_or_else(|| {
                        E2bError::BadRequest("file: a part without a file name".into())
                    })?,
                };
                Ok((path, data))
            })
            .collect::<Result<_>>()?
    } else {
        let path = q
            .path
            .clone()
            .ok_or_else(|| E2bError::BadRequest("path: missing".into()))?;
        vec![(path, bytes)]
    };
    let mut written = Vec::with_capacity(files.len());
    for (path, data) in files {
        let path = setup::resolve(&path, &c.home)?;
        let body =
            belljar_agent_proto::client::body_from_stream(futures::stream::once(async move {
                Ok::<_, std::io::Error>(data)
            }));
        st.sandboxes
            .write_file_as(&c.sandbox, &path, Some(&c.user), body)
            .await?;
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        written.push(WriteInfo {
            name,
            kind: "file",
            path,
        });
    }
    Ok(Json(written).into_response())
}

/// The boundary of a `multipart/form-data` content type.
fn boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The parts of a multipart body: each one's file name (if any) and bytes.
fn multipart(body: &[u8], boundary: &str) -> Result<Vec<(Option<String>, Bytes)>> {
    let bad = |why: &str| E2bError::BadRequest(format!("body: not multipart/form-data ({why})"));
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    let mut rest = body;
    let start = find(rest, delim).ok_or_else(|| bad("no boundary"))?;
    rest = &rest[start + delim.len()..];
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| bad("a boundary without a line end"))?;
        let head_end = find(rest, b"\r\n\r\n").ok_or_else(|| bad("a part without headers"))?;
        let head = std::str::from_utf8(&rest[..head_end]).map_err(|_| bad("headers not text"))?;
        rest = &rest[head_end + 4..];
        let mut close = b"\r\n".to_vec();
        close.extend_from_slice(delim);
        let end = find(rest, &close).ok_or_else(|| bad("a part without an end"))?;
        parts.push((filename(head), Bytes::copy_from_slice(&rest[..end])));
        rest = &rest[end + close.len()..];
    }
}

fn filename(head: &str) -> Option<String> {
    head.lines()
        .find(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
        })?
        .split(';')
        .find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k.trim() == "filename").then(|| v.trim().trim_matches('"').to_owned())
        })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_bodies_split_into_named_files() {
        let body = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c\"\r\n\r\n\r\n--x\r\n--xyz--\r\n";
        let ct = "multipart/form-data; boundary=xyz";
        let parts = multipart(body, &boundary(ct).unwrap()).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0.as_deref(), Some("/a/b.txt"));
        assert_eq!(&parts[0].1[..], b"hello");
        assert_eq!(&parts[1].1[..], b"\r\n--x");
        assert!(multipart(b"junk", "xyz").is_err());
        assert!(boundary("application/octet-stream").is_none());
    }

    #[test]
    fn entries_are_envd_entries() {
        let e = entry_info(FileEntry {
            name: "a".into(),
            path: "/a".into(),
            kind: FileKind::Directory,
            size: 4096,
            mode: 0o755,
            mtime: 0,
            link_target: None,
        });
        assert_eq!(e.permissions, "drwxr-xr-x");
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(json["size"], "4096");
        assert_eq!(json["modifiedTime"], "1970-01-01T00:00:00.000Z");
    }
}
