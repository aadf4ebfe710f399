//! The network routes: a sandbox's firewall and totals, its flow log, its exposed ports. The
//! policy is replaced whole by `PUT /v1/sandboxes/{id}/network/policy`
//! ([`Client::put_network_policy`]) or by `PATCH /v1/sandboxes/{id}`
//! ([`Client::set_network_policy`]); the two differ only in what they return.

use belljar_api::{
    AddPort, NetworkFlow, NetworkInfo, NetworkPolicy, Port, PortList, Sandbox, UpdateSandbox,
};
use http::Method;

use crate::body::empty;
use crate::client::Client;
use crate::error::ClientError;
use crate::ndjson::NdjsonStream;
use crate::routes::{sandbox_sub, with_query};

impl Client {
    /// `GET /v1/sandboxes/{id}/network`.
    pub async fn network(&self, id: &str) -> Result<NetworkInfo, ClientError> {
        self.get(&sandbox_sub(id, "network")).await
    }

    /// Replaces the sandbox's policy (`PATCH /v1/sandboxes/{id}`); open flows it denies are
    /// cut.
    pub async fn set_network_policy(
        &self,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<Sandbox, ClientError> {
        let req = UpdateSandbox {
            network_policy: Some(policy.clone()),
            ..Default::default()
        };
        self.update_sandbox(id, &req).await
    }

    /// Replaces the sandbox's policy whole (`PUT /v1/sandboxes/{id}/network/policy`); open
    /// flows it denies are cut. Returns the network under the new policy.
    pub async fn put_network_policy(
        &self,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<NetworkInfo, ClientError> {
        self.call(Method::PUT, &sandbox_sub(id, "network/policy"), policy)
            .await
    }

    /// `GET /v1/sandboxes/{id}/network/flows`; with `follow`, the stream stays open.
    pub async fn network_flows(
        &self,
        id: &str,
        follow: bool,
    ) -> Result<NdjsonStream<NetworkFlow>, ClientError> {
        let url = with_query(
            &sandbox_sub(id, "network/flows"),
            &[("follow", follow.then(|| "true".to_string()))],
        );
        let resp = self.request(Method::GET, &url, empty(), None).await?;
        Ok(NdjsonStream::new(resp.into_body()))
    }

    /// `GET /v1/sandboxes/{id}/ports`.
    pub async fn ports(&self, id: &str) -> Result<PortList, ClientError> {
        self.get(&sandbox_sub(id, "ports")).await
    }

    /// `POST /v1/sandboxes/{id}/ports`.
    pub async fn add_port(&self, id: &str, req: &AddPort) -> Result<Port, ClientError> {
        self.call(Method::POST, &sandbox_sub(id, "ports"), req)
            .await
    }

    /// `DELETE /v1/sandboxes/{id}/ports/{port}`.
    pub async fn remove_port(&self, id: &str, port: u16) -> Result<(), ClientError> {
        self.call_no_content(
            Method::DELETE,
            &sandbox_sub(id, &format!("ports/{port}")),
            empty(),
            None,
        )
        .await
    }
}
