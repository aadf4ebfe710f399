//! The broker's CA as the sandbox trusts it: its certificate, kept beside the key so every
//! start hands over the same bytes, and how it gets into the sandbox (by the agent at its
//! start for namespace sandboxes, through the agent's file API for microVMs).

use belljar_agent_proto::client::{AgentClient, body_from_bytes};
use belljar_agent_proto::net::{
    CA_ENV, MAX_CA_BUNDLE, SANDBOX_CA_PATH, SYSTEM_CA_BUNDLE, bundle_with_ca,
};
use belljar_api as api;
use belljar_network::Broker;
use futures::StreamExt;

use super::super::{SandboxError, Sandboxes};

impl Sandboxes {
    /// The broker CA's certificate of a sandbox, as it trusts it; made from the key and kept
    /// for a sandbox saved before the certificate was.
    fn ca_cert_pem(&self, id: &str) -> Result<Option<String>, SandboxError> {
        let mut saved = self.load_saved(id);
        if let Some(cert) = &saved.ca_cert_pem {
            return Ok(Some(cert.clone()));
        }
        let Some(key) = &saved.ca_key_pem else {
            return Ok(None);
        };
        let cert = Broker::from_key_pem(key, None)
            .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?
            .ca_pem()
            .to_owned();
        saved.ca_cert_pem = Some(cert.clone());
        self.store_saved(id, &saved)?;
        Ok(Some(cert))
    }

    /// The agent's environment entry with the broker CA, for a backend whose agent takes it
    /// at its start (see [`CA_ENV`]): the namespace backend's.
    pub(in crate::sandbox) fn ca_agent_env(
        &self,
        id: &str,
        backend: api::Backend,
    ) -> Result<Option<(String, String)>, SandboxError> {
        if backend != api::Backend::Namespace {
            return Ok(None);
        }
        Ok(self.ca_cert_pem(id)?.map(|pem| (CA_ENV.to_owned(), pem)))
    }

    /// Makes the sandbox trust its broker CA: the system bundle and [`SANDBOX_CA_PATH`] (the
    /// agent points `SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS` and `REQUESTS_CA_BUNDLE` at them).
    /// A namespace sandbox's agent did this itself before it answered ([`Self::ca_agent_env`]);
    /// a microVM's is written here, through the agent. Whether it wrote one: a sandbox that
    /// has a CA but could not be made to trust it is an error, since its brokered connections
    /// would fail as untrusted.
    pub(in crate::sandbox) async fn install_ca(
        &self,
        sandbox: &api::Sandbox,
        agent: &AgentClient,
    ) -> Result<bool, SandboxError> {
        if sandbox.backend == api::Backend::Namespace {
            return Ok(false);
        }
        let Some(pem) = self.ca_cert_pem(&sandbox.id)? else {
            return Ok(false);
        };
        if let Ok((_, mut stream)) = agent.read_file(SYSTEM_CA_BUNDLE).await {
            let mut bundle = Vec::new();
            while let Some(Ok(chunk)) = stream.next().await {
                bundle.extend_from_slice(&chunk);
                if bundle.len() > MAX_CA_BUNDLE {
                    bundle.clear();
                    break;
                }
            }
            if !bundle.is_empty()
                && let Some(with_ca) = bundle_with_ca(&bundle, &pem)
            {
                agent
                    .write_file(
                        SYSTEM_CA_BUNDLE,
                        Some(0o644),
                        Some("root"),
                        body_from_bytes(with_ca),
                    )
                    .await?;
            }
        }
        agent
            .write_file(
                SANDBOX_CA_PATH,
                Some(0o644),
                Some("root"),
                body_from_bytes(pem),
            )
            .await?;
        Ok(true)
    }
}
