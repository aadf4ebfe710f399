//! Credential brokering: for domains whose policy entry carries header transforms, the daemon
//! terminates the sandbox's TLS with a certificate from a per-sandbox CA (which the sandbox
//! trusts), sets the headers on every HTTP/1.1 request, and talks TLS to the real server,
//! verifying its certificate. The secret lives only in the daemon: the sandbox sees neither the
//! headers nor anything signed with them.
//!
//! ALPN offers only `http/1.1`, so clients do not switch to HTTP/2; protocol upgrades
//! (WebSocket) are not carried.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{HeaderName, HeaderValue};
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
        let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            let (sender, headers) = (sender.clone(), headers.clone());
            async move {
                for (name, value) in headers.iter() {
                    req.headers_mut().insert(name.clone(), value.clone());
                }
                sender.lock().await.send_request(req).await
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
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(client_root.as_bytes()).unwrap())
            .unwrap();
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
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
        Ok(())
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
}
