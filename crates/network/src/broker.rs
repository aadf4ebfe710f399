//! Credential brokering: for domains whose policy entry carries header transforms, the daemon
//! terminates the sandbox's TLS with a certificate from a per-sandbox CA (which the sandbox
//! trusts), sets the headers on every HTTP/1.1 request, and talks TLS to the real server,
//! verifying its certificate. The secret lives only in the daemon: the sandbox sees neither the
//! headers nor anything signed with them.
//!
//! The secret is meant for one domain, the one the sandbox's TLS was for; but the server behind
//! it may be a shared front end that routes on the `Host` header. So a request gets the headers
//! only when its `Host` (and an absolute-form target's authority) names that domain, on the
//! port the connection was made to or none; any other request, and `TRACE` (which would echo
//! the secret back) and `CONNECT`, are answered here with an error and never reach the server.
//! The guest's own copies of the set headers are replaced, not kept beside the secret.
//!
//! ALPN offers only `http/1.1`, so clients do not switch to HTTP/2 (whose `:authority` would
//! need the same check); protocol upgrades (WebSocket) are not carried.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::domain::DomainPattern;

/// Why brokering could not be set up or a brokered connection failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The CA or a leaf certificate could not be made.
    #[error("Cannot make a certificate")]
    Certificate(#[from] rcgen::Error),
    /// TLS failed (configuration or handshake).
    #[error("TLS failed")]
    Tls(#[from] rustls::Error),
    /// A header name is not a valid HTTP header name.
    #[error("Invalid header name {0:?}")]
    HeaderName(String),
    /// A header value holds characters HTTP does not allow.
    #[error("Invalid value for header {0:?}")]
    HeaderValue(String),
    /// The server name is not a DNS name.
    #[error("Invalid server name {0:?}")]
    ServerName(String),
    /// I/O with the sandbox or the server failed.
    #[error("Connection failed")]
    Io(#[from] std::io::Error),
    /// HTTP with the sandbox or the server failed.
    #[error("HTTP failed")]
    Http(#[from] hyper::Error),
}

/// Why a request on a brokered connection is answered by the daemon instead of being
/// forwarded with the secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request names another host than the brokered domain.
    #[error("This connection is brokered for {0}; a request for another host is not forwarded")]
    OtherHost(String),
    /// The request carries more than one `Host` header.
    #[error("A request to a brokered domain must carry one Host header")]
    SeveralHosts,
    /// `TRACE` would echo the secret back; `CONNECT` would tunnel past the broker.
    #[error("{0} is not forwarded to a brokered domain")]
    Method(Method),
}

impl Refusal {
    /// The stable code in the answer's body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::OtherHost(_) => "broker_other_host",
            Self::SeveralHosts => "broker_several_hosts",
            Self::Method(_) => "broker_method_not_allowed",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::OtherHost(_) => StatusCode::MISDIRECTED_REQUEST,
            Self::SeveralHosts => StatusCode::BAD_REQUEST,
            Self::Method(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The answer the guest gets, in the API's error shape.
    fn response(&self) -> hyper::Response<Full<Bytes>> {
        // The message holds only a DNS name or a method token, but a quote must not end the
        // string whatever a variant comes to hold.
        let message = self.to_string().replace(['"', '\\'], "'");
        let body = format!(
            "{{\"error\":{{\"code\":\"{}\",\"message\":\"{message}\"}}}}\n",
            self.code()
        );
        let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, Self::Method(_)) {
            headers.insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
            );
        }
        response
    }
}

/// Checks that `req`, on a connection brokered for `name` made to `port`, is for that domain,
/// and readies it for the server: the target in origin form (its authority checked, so the
/// server cannot route on one the check did not see) and a `Host` (set when the guest sent
/// none, as an HTTP/1.0 client may).
fn admit<B>(req: &mut hyper::Request<B>, name: &str, port: u16) -> Result<(), Refusal> {
    if matches!(*req.method(), Method::TRACE | Method::CONNECT) {
        return Err(Refusal::Method(req.method().clone()));
    }
    let other = || Refusal::OtherHost(name.to_string());
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::SeveralHosts);
    }
    if host.is_some_and(|h| !names(h.as_bytes(), name, port)) {
        return Err(other());
    }
    let has_host = host.is_some();
    if let Some(authority) = req.uri().authority() {
        if !names(authority.as_str().as_bytes(), name, port) {
            return Err(other());
        }
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|_| other())?;
        *req.uri_mut() = path;
    }
    if !has_host {
        let value = if port == 443 {
            name.to_string()
        } else {
            format!("{name}:{port}")
        };
        let value = HeaderValue::from_str(&value).map_err(|_| other())?;
        req.headers_mut().insert(header::HOST, value);
    }
    Ok(())
}

/// Whether `authority` (a `Host` value or a target's authority) is `name`, in any case, with
/// `port` or no port. Anything else (another name, user info, an address) is not.
fn names(authority: &[u8], name: &str, port: u16) -> bool {
    let (host, given) = match authority.iter().rposition(|&b| b == b':') {
        Some(i) => (&authority[..i], &authority[i + 1..]),
        None => (authority, &b""[..]),
    };
    let port_ok = given.is_empty()
        || (given.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(given)
                .ok()
                .and_then(|p| p.parse::<u16>().ok())
                == Some(port));
    port_ok && host.eq_ignore_ascii_case(name.as_bytes())
}

/// A policy entry's transform: the headers set on every request to matching domains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transform {
    pub domain: DomainPattern,
    /// Values are marked sensitive: they are never printed.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Transform {
    /// Validates the header names and values.
    pub fn new(domain: DomainPattern, headers: &[(&str, &str)]) -> Result<Self, BrokerError> {
        let headers = headers
            .iter()
            .map(|(k, v)| {
                let name = HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| BrokerError::HeaderName((*k).into()))?;
                let mut value =
                    HeaderValue::from_str(v).map_err(|_| BrokerError::HeaderValue((*k).into()))?;
                value.set_sensitive(true);
                Ok((name, value))
            })
            .collect::<Result<_, BrokerError>>()?;
        Ok(Self { domain, headers })
    }
}

/// The subject of every sandbox CA: a leaf signed by the same key chains to the CA whatever
/// copy of its certificate the sandbox holds.
const CA_NAME: &str = "Belljar sandbox CA";

/// A sandbox's CA and the trust used towards real servers.
pub struct Broker {
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
    ca_pem: String,
    roots: Arc<RootCertStore>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Broker")
            .field("ca", &CA_NAME)
            .finish_non_exhaustive()
    }
}

#[allow(
    deprecated,
    reason = "ring's provider, deprecated from rustls 0.23.48 for lacking post-quantum key exchange; no lockfile is committed, so builds take either version"
)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Broker {
    /// A broker with a new CA, trusting `roots` upstream (the public web's roots when `None`).
    pub fn generate(roots: Option<RootCertStore>) -> Result<Self, BrokerError> {
        Self::with_key(rcgen::KeyPair::generate()?, roots)
    }

    /// A broker whose CA key is `key_pem` (from [`ca_key_pem`](Self::ca_key_pem)), so that a
    /// restarted daemon signs for the CA the sandbox already trusts.
    pub fn from_key_pem(key_pem: &str, roots: Option<RootCertStore>) -> Result<Self, BrokerError> {
        Self::with_key(rcgen::KeyPair::from_pem(key_pem)?, roots)
    }

    fn with_key(ca_key: rcgen::KeyPair, roots: Option<RootCertStore>) -> Result<Self, BrokerError> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, CA_NAME);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca_cert = params.self_signed(&ca_key)?;
        let roots = roots.unwrap_or_else(|| RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        });
        Ok(Self {
            ca_pem: ca_cert.pem(),
            ca_cert,
            ca_key,
            roots: Arc::new(roots),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate the sandbox must trust (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA key, for the daemon to keep (PEM). Never give it to the sandbox.
    pub fn ca_key_pem(&self) -> String {
        self.ca_key.serialize_pem()
    }

    /// The TLS server configuration presenting a certificate for `name`.
    fn server_config(&self, name: &str) -> Result<Arc<ServerConfig>, BrokerError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(name) {
            return Ok(config.clone());
        }
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.ca_cert, &self.ca_key)?;
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() > 1024 {
            leaves.clear();
        }
        leaves.insert(name.to_string(), config.clone());
        Ok(config)
    }

    fn client_config(&self) -> Result<Arc<ClientConfig>, BrokerError> {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Serves one brokered connection: `guest` carries the sandbox's TLS (from its
    /// ClientHello on) for `name`; requests go to `dst` with `headers` set.
    pub(crate) async fn serve<S>(
        self: Arc<Self>,
        guest: S,
        name: String,
        dst: SocketAddr,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Result<(), BrokerError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server_config(&name)?);
        let guest = acceptor.accept(guest).await?;
        let server_name = ServerName::try_from(name.clone())
            .map_err(|_| BrokerError::ServerName(name.clone()))?;
        let upstream = TcpStream::connect(dst).await?;
        let _ = upstream.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(self.client_config()?);
        let upstream = connector.connect(server_name, upstream).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await?;
        let upstream_task = tokio::spawn(conn);
        let sender = Arc::new(tokio::sync::Mutex::new(sender));
        let headers = Arc::new(headers);
        let name = Arc::new(name);
        let port = dst.port();
        let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            let (sender, headers, name) = (sender.clone(), headers.clone(), name.clone());
            async move {
                if let Err(refusal) = admit(&mut req, &name, port) {
                    tracing::debug!(domain = %name, code = refusal.code(), "brokered request refused");
                    return Ok(refusal.response().map(Either::Right));
                }
                for (name, value) in headers.iter() {
                    // `insert` drops every value the guest sent under this name.
                    req.headers_mut().insert(name.clone(), value.clone());
                }
                let response = sender.lock().await.send_request(req).await?;
                Ok::<_, hyper::Error>(response.map(Either::Left))
            }
        });
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(guest), service)
            .await;
        upstream_task.abort();
        Ok(served?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    /// Runs a TLS handshake in memory; `Err` when the client rejects the server.
    fn handshake(
        client_root: &str,
        server: Arc<ServerConfig>,
        name: &str,
    ) -> Result<(), rustls::Error> {
        handshake_offering(client_root, server, name, &[]).map(drop)
    }

    /// [`handshake`] with the client offering `alpn`; the protocol the server chose.
    fn handshake_offering(
        client_root: &str,
        server: Arc<ServerConfig>,
        name: &str,
        alpn: &[&[u8]],
    ) -> Result<Option<Vec<u8>>, rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(client_root.as_bytes()).unwrap())
            .unwrap();
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let mut client = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from(name.to_string()).unwrap(),
        )
        .unwrap();
        let mut server = rustls::ServerConnection::new(server).unwrap();
        while client.is_handshaking() || server.is_handshaking() {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            server.read_tls(&mut buf.as_slice()).unwrap();
            server.process_new_packets()?;
            let mut buf = Vec::new();
            server.write_tls(&mut buf).unwrap();
            client.read_tls(&mut buf.as_slice()).unwrap();
            client.process_new_packets()?;
        }
        Ok(server.alpn_protocol().map(<[u8]>::to_vec))
    }

    #[test]
    fn a_restarted_broker_signs_for_the_ca_the_sandbox_already_trusts() {
        let first = Broker::generate(None).unwrap();
        let trusted = first.ca_pem().to_string();
        let again = Broker::from_key_pem(&first.ca_key_pem(), None).unwrap();
        let config = again.server_config("api.example.test").unwrap();
        handshake(&trusted, config, "api.example.test").expect("the old CA accepts the new leaf");

        let other = Broker::generate(None).unwrap();
        let config = other.server_config("api.example.test").unwrap();
        assert!(handshake(&trusted, config, "api.example.test").is_err());
    }

    #[test]
    fn header_names_and_values_are_checked_and_values_never_printed() {
        let d = DomainPattern::parse("api.example.test").unwrap();
        assert!(matches!(
            Transform::new(d.clone(), &[("bad header", "x")]),
            Err(BrokerError::HeaderName(_))
        ));
        assert!(matches!(
            Transform::new(d.clone(), &[("x-key", "line\nbreak")]),
            Err(BrokerError::HeaderValue(_))
        ));
        let t = Transform::new(d, &[("x-key", "hunter2")]).unwrap();
        assert!(!format!("{t:?}").contains("hunter2"));
    }

    #[test]
    fn a_client_offering_http2_is_held_to_http1() {
        // The request checks read HTTP/1.1's `Host`; HTTP/2 would bring `:authority`.
        let broker = Broker::generate(None).unwrap();
        let config = broker.server_config("api.example.test").unwrap();
        let chosen = handshake_offering(
            broker.ca_pem(),
            config.clone(),
            "api.example.test",
            &[b"h2", b"http/1.1"],
        );
        assert_eq!(chosen.unwrap().as_deref(), Some(&b"http/1.1"[..]));
        assert!(handshake_offering(broker.ca_pem(), config, "api.example.test", &[b"h2"]).is_err());
    }

    const NAME: &str = "api.example.test";
    const PORT: u16 = 8443;

    fn request(method: &str, target: &str, hosts: &[&str]) -> hyper::Request<()> {
        let mut req = hyper::Request::builder().method(method).uri(target);
        for host in hosts {
            req = req.header(header::HOST, *host);
        }
        req.body(()).unwrap()
    }

    fn admitted(method: &str, target: &str, hosts: &[&str]) -> Result<hyper::Request<()>, Refusal> {
        let mut req = request(method, target, hosts);
        admit(&mut req, NAME, PORT).map(|()| req)
    }

    #[test]
    fn a_request_for_the_brokered_domain_is_admitted_with_or_without_its_port() {
        for host in [
            NAME,
            "API.Example.TEST",
            "api.example.test:8443",
            "api.example.test:",
        ] {
            let req = admitted("GET", "/v1?q=1", &[host]).unwrap_or_else(|e| panic!("{host}: {e}"));
            assert_eq!(req.uri(), "/v1?q=1");
            assert_eq!(req.headers()[header::HOST], host, "kept as sent");
        }
        // An HTTP/1.0 client may send no Host: the server gets the brokered one.
        let req = admitted("GET", "/", &[]).unwrap();
        assert_eq!(req.headers()[header::HOST], "api.example.test:8443");
        let mut req = request("GET", "/", &[]);
        admit(&mut req, NAME, 443).unwrap();
        assert_eq!(req.headers()[header::HOST], NAME);
        // An absolute-form target naming the domain reaches the server in origin form.
        let req = admitted("POST", "https://Api.Example.Test:8443/x?y", &[]).unwrap();
        assert_eq!(req.uri(), "/x?y");
        assert_eq!(req.headers()[header::HOST], "api.example.test:8443");
        let req = admitted("GET", "https://api.example.test", &[NAME]).unwrap();
        assert_eq!(req.uri(), "/");
    }

    #[test]
    fn a_request_for_another_host_is_refused() {
        let other = Err(Refusal::OtherHost(NAME.into()));
        for host in [
            "other.example.test",
            "api.example.test:443",
            "api.example.test:8443x",
            "api.example.test:+8443",
            "api.example.test.",
            "api.example.test.other.test",
            "user@api.example.test",
            "xapi.example.test",
            "203.0.113.2",
            "[::1]:8443",
            "",
        ] {
            assert_eq!(
                admitted("GET", "/", &[host]).map(drop),
                other,
                "Host: {host}"
            );
        }
        // A target's authority the Host does not match, either way round.
        for (target, host) in [
            ("https://other.example.test/", NAME),
            ("https://user@api.example.test/", NAME),
            ("https://api.example.test:443/", NAME),
            ("https://api.example.test/", "other.example.test"),
        ] {
            assert_eq!(
                admitted("GET", target, &[host]).map(drop),
                other,
                "{target} {host}"
            );
        }
        assert_eq!(
            admitted("GET", "/", &[NAME, NAME]).map(drop),
            Err(Refusal::SeveralHosts)
        );
        assert_eq!(
            admitted("GET", "/", &[NAME, "other.example.test"]).map(drop),
            Err(Refusal::SeveralHosts)
        );
    }

    #[test]
    fn trace_and_connect_are_refused_and_every_refusal_says_why() {
        assert_eq!(
            admitted("TRACE", "/", &[NAME]).map(drop),
            Err(Refusal::Method(Method::TRACE))
        );
        assert_eq!(
            admitted("CONNECT", "api.example.test:8443", &[NAME]).map(drop),
            Err(Refusal::Method(Method::CONNECT))
        );
        let answer = Refusal::Method(Method::TRACE).response();
        assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert!(
            !answer.headers()[header::ALLOW]
                .to_str()
                .unwrap()
                .contains("TRACE")
        );
        let answer = Refusal::OtherHost(NAME.into()).response();
        assert_eq!(answer.status(), StatusCode::MISDIRECTED_REQUEST);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let body = answer.into_body();
        let body = whole_body(body);
        assert_eq!(
            body,
            "{\"error\":{\"code\":\"broker_other_host\",\"message\":\"This connection is \
             brokered for api.example.test; a request for another host is not forwarded\"}}\n"
        );
        assert_eq!(
            Refusal::SeveralHosts.response().status(),
            StatusCode::BAD_REQUEST
        );
    }

    /// The bytes of a whole in-memory body.
    fn whole_body(body: Full<Bytes>) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt.block_on(body.collect()).unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
}
