//! A client of the OCI distribution API: manifests and blobs, with the registry's token flow
//! (`WWW-Authenticate: Bearer realm=…`) or basic auth, redirects (blobs are often served from
//! elsewhere), and every byte checked against its digest and declared size while it streams.
//!
//! Plain HTTP is spoken only to loopback registries and to those the user named insecure;
//! everything else is HTTPS, verified against the bundled web PKI roots.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::digest::Check;
use crate::spec::{ACCEPT, Descriptor, MAX_MANIFEST};
use crate::{Digest, Error, Reference};

/// How a client reaches registries.
#[derive(Debug, Clone)]
pub struct Options {
    /// Registries (`host[:port]`) spoken to over plain HTTP although they are not loopback.
    pub insecure: Vec<String>,
    pub credentials: Credentials,
    pub connect_timeout: Duration,
    /// How long a response may send nothing before the transfer is abandoned.
    pub stall_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            insecure: Vec::new(),
            credentials: Credentials::default(),
            connect_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(60),
        }
    }
}

/// User names and passwords by registry (`host[:port]`).
#[derive(Debug, Clone, Default)]
pub struct Credentials(HashMap<String, (String, String)>);

impl Credentials {
    /// Reads the auth files Docker and Podman write (`{"auths": {"host": {"auth":
    /// base64("user:password")}}}`); earlier files win. Missing files are skipped; a file
    /// that is not such JSON is skipped with a warning.
    pub fn load(files: &[PathBuf]) -> Self {
        let mut all = HashMap::new();
        for file in files.iter().rev() {
            let Ok(bytes) = std::fs::read(file) else {
                continue;
            };
            match parse_auth_file(&bytes) {
                Some(map) => all.extend(map),
                None => tracing::warn!(file = %file.display(), "not an auth file; ignored"),
            }
        }
        Self(all)
    }

    pub fn insert(&mut self, registry: &str, user: &str, password: &str) {
        self.0
            .insert(registry.to_owned(), (user.to_owned(), password.to_owned()));
    }

    fn get(&self, registry: &str) -> Option<&(String, String)> {
        self.0.get(registry).or_else(|| {
            // Docker writes some hosts with their scheme.
            self.0.get(&format!("https://{registry}"))
        })
    }
}

fn parse_auth_file(bytes: &[u8]) -> Option<HashMap<String, (String, String)>> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let auths = v.get("auths")?.as_object()?;
    let mut out = HashMap::new();
    for (host, entry) in auths {
        let pair = if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) {
            let text = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .ok()?;
            let text = String::from_utf8(text).ok()?;
            let (u, p) = text.split_once(':')?;
            (u.to_owned(), p.to_owned())
        } else {
            let u = entry.get("username")?.as_str()?;
            let p = entry.get("password")?.as_str()?;
            (u.to_owned(), p.to_owned())
        };
        out.insert(host.trim_end_matches('/').to_owned(), pair);
    }
    Some(out)
}

/// One registry, for one repository's pull.
pub struct Registry {
    domain: String,
    repository: String,
    scheme: &'static str,
    options: Options,
    /// The `Authorization` header the registry last accepted or asked for.
    auth: Mutex<Option<String>>,
    tls: Arc<rustls::ClientConfig>,
}

/// The most redirects followed for one request.
const MAX_REDIRECTS: usize = 5;

impl Registry {
    /// A client for `reference`'s registry and repository (which must name a registry).
    pub fn new(reference: &Reference, options: Options) -> Result<Self, Error> {
        let domain = reference
            .domain
            .clone()
            .ok_or_else(|| Error::BadReference {
                reference: reference.to_string(),
                reason: "it names no registry, and no default registry is configured".into(),
            })?;
        let scheme = if reference.is_loopback() || options.insecure.contains(&domain) {
            "http"
        } else {
            "https"
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        #[allow(
            deprecated,
            reason = "ring's provider, deprecated from rustls 0.23.48 for lacking post-quantum key exchange; no lockfile is committed, so builds take either version"
        )]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Registry {
                registry: domain.clone(),
                detail: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            domain,
            repository: reference.path.clone(),
            scheme,
            options,
            auth: Mutex::new(None),
            tls: Arc::new(tls),
        })
    }

    /// The manifest or index `reference` names (a tag or a digest): its media type, bytes and
    /// digest. A digest reference, or a `Docker-Content-Digest` the registry sends, must match
    /// the bytes.
    pub async fn manifest(&self, reference: &str) -> Result<(String, Vec<u8>, Digest), Error> {
        let path = format!("/v2/{}/manifests/{reference}", self.repository);
        let resp = self.get(&path, Some(ACCEPT), reference).await?;
        let content_type = header_text(&resp, header::CONTENT_TYPE);
        let claimed = header_text(&resp, "docker-content-digest");
        let bytes = self.read_bounded(resp, MAX_MANIFEST).await?;
        let digest = Digest::of(&bytes);
        if reference.starts_with("sha256:") && reference != digest.as_str() {
            return Err(Error::Invalid(format!(
                "the registry sent a manifest of digest {digest} for {reference}"
            )));
        }
        if !claimed.is_empty() && claimed != digest.as_str() {
            return Err(Error::Invalid(format!(
                "the registry says the manifest is {claimed}, its bytes are {digest}"
            )));
        }
        Ok((content_type, bytes, digest))
    }

    /// A blob held in memory (a config), at most `max` bytes and verified.
    pub async fn blob_bytes(&self, desc: &Descriptor, max: u64) -> Result<Vec<u8>, Error> {
        if desc.size > max {
            return Err(Error::Invalid(format!(
                "blob {} is {} bytes, more than {max}",
                desc.digest, desc.size
            )));
        }
        let path = format!("/v2/{}/blobs/{}", self.repository, desc.digest);
        let resp = self.get(&path, None, desc.digest.as_str()).await?;
        let bytes = self.read_bounded(resp, desc.size).await?;
        if bytes.len() as u64 != desc.size || Digest::of(&bytes) != desc.digest {
            return Err(Error::Invalid(format!(
                "blob {} does not match its digest or size",
                desc.digest
            )));
        }
        Ok(bytes)
    }

    /// Streams a blob into `dest` (created anew), calling `progress` with the bytes so far;
    /// the file is complete and verified when this returns `Ok`, and removed when it fails.
    pub async fn blob_to_file(
        &self,
        desc: &Descriptor,
        dest: &Path,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), Error> {
        let got = self.fetch_blob(desc, dest, progress).await;
        if got.is_err() {
            let _ = tokio::fs::remove_file(dest).await;
        }
        got
    }

    async fn fetch_blob(
        &self,
        desc: &Descriptor,
        dest: &Path,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), Error> {
        let path = format!("/v2/{}/blobs/{}", self.repository, desc.digest);
        let resp = self.get(&path, None, desc.digest.as_str()).await?;
        let mut file = tokio::fs::File::create(dest)
            .await
            .map_err(Error::io(format!("Cannot create {}", dest.display())))?;
        let mut check = Check::new(desc.digest.clone(), Some(desc.size));
        let mut done = 0u64;
        let mut body = resp.into_body();
        while let Some(chunk) = self.next_chunk(&mut body).await? {
            done += chunk.len() as u64;
            check.update(&chunk)?;
            file.write_all(&chunk)
                .await
                .map_err(Error::io(format!("Cannot write {}", dest.display())))?;
            progress(done);
        }
        check.finish()?;
        file.sync_all()
            .await
            .map_err(Error::io(format!("Cannot write {}", dest.display())))?;
        Ok(())
    }

    async fn next_chunk(&self, body: &mut Incoming) -> Result<Option<Bytes>, Error> {
        loop {
            let frame = tokio::time::timeout(self.options.stall_timeout, body.frame())
                .await
                .map_err(|_| {
                    self.failed(format!("sent nothing for {:?}", self.options.stall_timeout))
                })?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(self.failed(format!("the transfer broke: {e}"))),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    async fn read_bounded(&self, resp: Response<Incoming>, max: u64) -> Result<Vec<u8>, Error> {
        let mut body = resp.into_body();
        let mut out = Vec::new();
        while let Some(chunk) = self.next_chunk(&mut body).await? {
            if (out.len() + chunk.len()) as u64 > max {
                return Err(Error::Invalid(format!(
                    "the registry's answer is longer than {max} bytes"
                )));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn failed(&self, detail: String) -> Error {
        Error::Registry {
            registry: self.domain.clone(),
            detail,
        }
    }

    /// GET `path` on the registry, authenticating when it asks, following redirects; any
    /// answer but 200 becomes the matching error.
    async fn get(
        &self,
        path: &str,
        accept: Option<&str>,
        what: &str,
    ) -> Result<Response<Incoming>, Error> {
        let url: Uri = format!("{}://{}{path}", self.scheme, self.domain)
            .parse()
            .map_err(|e| self.failed(format!("bad URL: {e}")))?;
        let mut authenticated = false;
        loop {
            let auth = self.auth.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let resp = self.follow(url.clone(), accept, auth).await?;
            let status = resp.status();
            if status == StatusCode::OK {
                return Ok(resp);
            }
            if status == StatusCode::UNAUTHORIZED && !authenticated {
                authenticated = true;
                let challenge = header_text(&resp, header::WWW_AUTHENTICATE);
                let new_auth = self.answer_challenge(&challenge, what).await?;
                *self.auth.lock().unwrap_or_else(|e| e.into_inner()) = Some(new_auth);
                continue;
            }
            let detail = self.error_detail(resp).await;
            let reference = format!("{}/{}@{what}", self.domain, self.repository);
            return Err(match status {
                StatusCode::NOT_FOUND => Error::NotFound { reference, detail },
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    Error::Denied { reference, detail }
                }
                s => self.failed(format!("answered {s} for {what}: {detail}")),
            });
        }
    }

    /// The registry's error text (its JSON `errors`, else the first bytes of the body).
    async fn error_detail(&self, resp: Response<Incoming>) -> String {
        let status = resp.status();
        let body = self.read_bounded(resp, 64 << 10).await.unwrap_or_default();
        let parsed: Option<Vec<String>> = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                let errors = v.get("errors")?.as_array()?.clone();
                Some(
                    errors
                        .iter()
                        .map(|e| {
                            let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
                            let msg = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
                            format!("{code}: {msg}")
                        })
                        .collect(),
                )
            });
        match parsed {
            Some(e) if !e.is_empty() => e.join("; "),
            _ if body.is_empty() => status.to_string(),
            _ => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        }
    }

    /// The `Authorization` value that answers a 401's challenge: a token from the realm it
    /// names (asked with our credentials, if any), or basic auth.
    async fn answer_challenge(&self, challenge: &str, what: &str) -> Result<String, Error> {
        let creds = self.options.credentials.get(&self.domain);
        let basic = creds.map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        });
        let denied = |detail: &str| Error::Denied {
            reference: format!("{}/{}@{what}", self.domain, self.repository),
            detail: detail.to_owned(),
        };
        let (scheme, params) = parse_challenge(challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => basic.ok_or_else(|| {
                denied("the registry wants a user name and password; run `belljar login`")
            }),
            "bearer" => {
                let realm = params
                    .get("realm")
                    .ok_or_else(|| self.failed("a Bearer challenge without a realm".into()))?;
                let mut query = Vec::new();
                if let Some(s) = params.get("service") {
                    query.push(format!("service={}", url_escape(s)));
                }
                let scope = params
                    .get("scope")
                    .cloned()
                    .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                query.push(format!("scope={}", url_escape(&scope)));
                let sep = if realm.contains('?') { '&' } else { '?' };
                let url: Uri = format!("{realm}{sep}{}", query.join("&"))
                    .parse()
                    .map_err(|e| self.failed(format!("bad token realm {realm:?}: {e}")))?;
                let resp = self.follow(url, None, basic).await?;
                if resp.status() != StatusCode::OK {
                    let status = resp.status();
                    let detail = self.error_detail(resp).await;
                    return Err(
                        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                            denied(&detail)
                        } else {
                            self.failed(format!("the token service answered {status}: {detail}"))
                        },
                    );
                }
                let body = self.read_bounded(resp, 1 << 20).await?;
                let v: serde_json::Value = serde_json::from_slice(&body)
                    .map_err(|e| self.failed(format!("the token service sent no JSON: {e}")))?;
                let token = v
                    .get("token")
                    .or_else(|| v.get("access_token"))
                    .and_then(|t| t.as_str())
                    .ok_or_else(|| self.failed("the token service sent no token".into()))?;
                Ok(format!("Bearer {token}"))
            }
            _ => Err(self.failed(format!(
                "an authentication challenge we do not know: {challenge:?}"
            ))),
        }
    }

    /// One GET, following redirects; `Authorization` goes only to the registry's own host.
    async fn follow(
        &self,
        mut url: Uri,
        accept: Option<&str>,
        auth: Option<String>,
    ) -> Result<Response<Incoming>, Error> {
        let origin = url.authority().map(|a| a.to_string());
        for _ in 0..=MAX_REDIRECTS {
            let same_host = url.authority().map(|a| a.to_string()) == origin;
            let resp = self
                .request(&url, accept, auth.as_deref().filter(|_| same_host))
                .await?;
            if !resp.status().is_redirection() {
                return Ok(resp);
            }
            let location = header_text(&resp, header::LOCATION);
            let next: Uri = location
                .parse()
                .map_err(|e| self.failed(format!("a redirect to {location:?}: {e}")))?;
            url = if next.scheme().is_some() {
                next
            } else {
                let mut parts = url.into_parts();
                parts.path_and_query = next.path_and_query().cloned();
                Uri::from_parts(parts).map_err(|e| self.failed(format!("a redirect: {e}")))?
            };
        }
        Err(self.failed(format!("more than {MAX_REDIRECTS} redirects")))
    }

    async fn request(
        &self,
        url: &Uri,
        accept: Option<&str>,
        auth: Option<&str>,
    ) -> Result<Response<Incoming>, Error> {
        let https = match url.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => return Err(self.failed(format!("a URL of scheme {other:?}"))),
        };
        let host = url
            .host()
            .ok_or_else(|| self.failed(format!("a URL without a host: {url}")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let connect = TcpStream::connect((host.as_str(), port));
        let tcp = tokio::time::timeout(self.options.connect_timeout, connect)
            .await
            .map_err(|_| self.failed(format!("cannot connect to {host}:{port}: timed out")))?
            .map_err(|e| self.failed(format!("cannot connect to {host}:{port}: {e}")))?;
        let mut req = Request::get(url.path_and_query().map_or("/", |p| p.as_str()))
            .header(
                header::HOST,
                url.authority().map_or(host.clone(), |a| a.to_string()),
            )
            .header(
                header::USER_AGENT,
                concat!("belljar/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(a) = accept {
            req = req.header(header::ACCEPT, a);
        }
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| self.failed(e.to_string()))?;
        let send = async {
            if https {
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| self.failed(format!("{host}: {e}")))?;
                let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| self.failed(format!("TLS with {host}: {e}")))?;
                self.exchange(TokioIo::new(tls), req).await
            } else {
                self.exchange(TokioIo::new(tcp), req).await
            }
        };
        tokio::time::timeout(self.options.stall_timeout, send)
            .await
            .map_err(|_| {
                self.failed(format!(
                    "no answer from {host}:{port} in {:?}",
                    self.options.stall_timeout
                ))
            })?
    }

    async fn exchange<T>(
        &self,
        io: T,
        req: Request<Empty<Bytes>>,
    ) -> Result<Response<Incoming>, Error>
    where
        T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| self.failed(format!("HTTP: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender
            .send_request(req)
            .await
            .map_err(|e| self.failed(format!("HTTP: {e}")))
    }
}

fn header_text<B>(resp: &Response<B>, name: impl header::AsHeaderName) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// `Bearer realm="…",service="…"` → ("Bearer", {realm, service}).
fn parse_challenge(text: &str) -> (String, HashMap<String, String>) {
    let text = text.trim();
    let (scheme, rest) = text.split_once(' ').unwrap_or((text, ""));
    let mut params = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        params.insert(key, value.to_owned());
        rest = next.trim_start_matches(',').trim();
    }
    (scheme.to_owned(), params)
}

fn url_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_challenges() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="http://127.0.0.1:1/token?x=1",service="reg",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(s, "Bearer");
        assert_eq!(p["realm"], "http://127.0.0.1:1/token?x=1");
        assert_eq!(p["service"], "reg");
        assert_eq!(p["scope"], "repository:a/b:pull,push");
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(s, "Basic");
        assert_eq!(p["realm"], "Registry Realm");
    }

    #[test]
    fn reads_auth_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        let b = dir.path().join("b.json");
        std::fs::write(
            &a,
            r#"{"auths":{"127.0.0.1:5000":{"auth":"dXNlcjpwYTpzcw=="}}}"#,
        )
        .unwrap();
        std::fs::write(&b, r#"{"auths":{"127.0.0.1:5000":{"username":"other","password":"x"},"r.test":{"username":"u","password":"p"}}}"#).unwrap();
        let c = Credentials::load(&[a, b, dir.path().join("missing")]);
        assert_eq!(
            c.get("127.0.0.1:5000").unwrap(),
            &("user".into(), "pa:ss".into())
        );
        assert_eq!(c.get("r.test").unwrap(), &("u".into(), "p".into()));
    }
}
