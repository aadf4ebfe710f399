//! Network policy and Sandbox Services through the Sandbox0 layer.
//!
//! A policy maps onto the daemon's firewall: `allow-all` (with `deniedCidrs`: subnets it
//! denies) and `block-all` (with `allowedDomains` and `allowedCidrs`: what it allows; nothing
//! else, DNS included, without them). What the firewall cannot express — domain deny-lists,
//! ports, ordered traffic rules, protocol and credential rules, proxies — is refused as
//! `not_implemented`. A service is an exposed port: the daemon forwards it from 127.0.0.1 on
//! the host, and that address is the service's `public_url`. The services themselves (id,
//! name, port, public) are kept in the sandbox's tags.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use belljar_api as api;
use serde::{Deserialize, Serialize};

use super::error::{Result, Sandbox0Error};
use super::wire::{
    Egress, Ingress, NetworkMode, NetworkPolicy, Service, ServiceView, ServicesData,
    ServicesUpdate, Success,
};
use super::{S0Json, S0Path, detached};
use crate::http::AppState;

/// Tags `sandbox0.service.<id>` hold each service.
pub const TAG_SERVICE: &str = "sandbox0.service.";
/// The longest service id a tag key has room for.
const MAX_SERVICE_ID: usize = 64 - TAG_SERVICE.len();

/// A service as its tag keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct ServiceTag {
    port: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default)]
    public: bool,
}

/// The daemon's policy for a Sandbox0 one.
pub fn policy_to_daemon(p: &NetworkPolicy) -> Result<api::NetworkPolicy> {
    let refuse = |what: &str| Err(Sandbox0Error::NotImplemented(format!("network.{what}")));
    if p.credential_bindings
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        return refuse("credentialBindings");
    }
    let e = p.egress.clone().unwrap_or_default();
    let refused = [
        (
            "egress.deniedDomains",
            e.denied_domains.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "egress.allowedPorts",
            e.allowed_ports.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "egress.deniedPorts",
            e.denied_ports.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "egress.trafficRules",
            e.traffic_rules.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "egress.protocolRules",
            e.protocol_rules.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "egress.credentialRules",
            e.credential_rules.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "egress.proxy",
            e.proxy.as_ref().is_some_and(|v| !v.is_null()),
        ),
    ];
    if let Some((what, _)) = refused.iter().find(|(_, present)| *present) {
        return refuse(what);
    }
    let allowed_domains = e.allowed_domains.unwrap_or_default();
    let allowed_cidrs = e.allowed_cidrs.unwrap_or_default();
    let denied_cidrs = e.denied_cidrs.unwrap_or_default();
    let policy = match p.mode {
        NetworkMode::AllowAll if denied_cidrs.is_empty() => {
            api::NetworkPolicy::Mode(api::NetworkMode::AllowAll)
        }
        NetworkMode::AllowAll => api::NetworkPolicy::Rules(api::NetworkRules {
            allow: None,
            subnets: Some(api::Subnets {
                allow: Vec::new(),
                deny: denied_cidrs,
            }),
        }),
        NetworkMode::BlockAll if allowed_domains.is_empty() && allowed_cidrs.is_empty() => {
            api::NetworkPolicy::Mode(api::NetworkMode::DenyAll)
        }
        NetworkMode::BlockAll => api::NetworkPolicy::Rules(api::NetworkRules {
            allow: Some(api::DomainAllow::List(allowed_domains)),
            subnets: (!allowed_cidrs.is_empty()).then(|| api::Subnets {
                allow: allowed_cidrs,
                deny: Vec::new(),
            }),
        }),
    };
    api::Validate::validate(&policy)
        .map_err(|e| Sandbox0Error::BadRequest(format!("network: {e}")))?;
    Ok(policy)
}

/// A daemon policy as Sandbox0's.
pub fn policy_from_daemon(p: &api::NetworkPolicy) -> NetworkPolicy {
    let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    match p {
        api::NetworkPolicy::Mode(api::NetworkMode::AllowAll) => NetworkPolicy::default(),
        api::NetworkPolicy::Mode(api::NetworkMode::DenyAll) => NetworkPolicy {
            mode: NetworkMode::BlockAll,
            ..NetworkPolicy::default()
        },
        api::NetworkPolicy::Rules(r) => {
            let subnets = r.subnets.clone().unwrap_or_default();
            match &r.allow {
                None => NetworkPolicy {
                    mode: NetworkMode::AllowAll,
                    egress: Some(Egress {
                        denied_cidrs: list(&subnets.deny),
                        ..Egress::default()
                    }),
                    credential_bindings: None,
                },
                Some(allow) => NetworkPolicy {
                    mode: NetworkMode::BlockAll,
                    egress: Some(Egress {
                        allowed_domains: Some(
                            allow.domains().into_iter().map(str::to_owned).collect(),
                        ),
                        allowed_cidrs: list(&subnets.allow),
                        denied_cidrs: list(&subnets.deny),
                        ..Egress::default()
                    }),
                    credential_bindings: None,
                },
            }
        }
    }
}

/// The tags that keep `services`, each checked.
pub fn service_tags(services: &[Service]) -> Result<BTreeMap<String, String>> {
    let mut tags = BTreeMap::new();
    for (i, s) in services.iter().enumerate() {
        let field = format!("services[{i}]");
        let dns_label = !s.id.is_empty()
            && s.id.len() <= MAX_SERVICE_ID
            && s.id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.id.starts_with('-')
            && !s.id.ends_with('-');
        if !dns_label {
            return Err(Sandbox0Error::BadRequest(format!(
                "{field}.id: must be a DNS label of at most {MAX_SERVICE_ID} characters"
            )));
        }
        if let Some(rt) = &s.runtime
            && rt.kind != "manual"
        {
            return Err(Sandbox0Error::NotImplemented(format!(
                "{field}.runtime.type {:?} (services of type manual expose a port)",
                rt.kind
            )));
        }
        if s.ingress.routes.as_ref().is_some_and(|r| !r.is_empty()) {
            return Err(Sandbox0Error::NotImplemented(format!(
                "{field}.ingress.routes"
            )));
        }
        let port = match s.port {
            Some(p) if (1..=65535).contains(&p) => p,
            _ => {
                return Err(Sandbox0Error::BadRequest(format!(
                    "{field}.port: must be 1..=65535"
                )));
            }
        };
        let tag = ServiceTag {
            port,
            name: s.display_name.clone(),
            public: s.ingress.public,
        };
        let value = serde_json::to_string(&tag).unwrap_or_default();
        if value.len() > api::limits::MAX_TAG_VALUE {
            return Err(Sandbox0Error::BadRequest(format!(
                "{field}.display_name: too long"
            )));
        }
        if tags
            .insert(format!("{TAG_SERVICE}{}", s.id), value)
            .is_some()
        {
            return Err(Sandbox0Error::BadRequest(format!(
                "{field}.id: {:?} is there twice",
                s.id
            )));
        }
    }
    Ok(tags)
}

/// The services a sandbox's tags keep.
pub fn services_of(s: &api::Sandbox) -> Vec<Service> {
    s.tags
        .iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix(TAG_SERVICE)?;
            let tag: ServiceTag = serde_json::from_str(v).ok()?;
            Some(Service {
                id: id.to_owned(),
                display_name: tag.name,
                port: Some(tag.port),
                ingress: Ingress {
                    public: tag.public,
                    routes: None,
                },
                runtime: None,
            })
        })
        .collect()
}

/// Exposes the ports of `services` and withdraws those of the sandbox's old services that
/// are not among them.
pub async fn apply_ports(st: &AppState, s: &api::Sandbox, services: &[Service]) -> Result<()> {
    let want: Vec<u32> = services.iter().filter_map(|s| s.port).collect();
    let old: Vec<u32> = services_of(s).iter().filter_map(|s| s.port).collect();
    let exposed: Vec<u32> = st
        .sandboxes
        .ports(&s.id)?
        .ports
        .iter()
        .map(|p| u32::from(p.port))
        .collect();
    for port in old
        .iter()
        .filter(|p| !want.contains(p) && exposed.contains(p))
    {
        st.sandboxes.remove_port(&s.id, *port).await?;
    }
    for port in want.iter().filter(|p| !exposed.contains(p)) {
        let add = api::AddPort {
            port: *port,
            host_port: None,
        };
        st.sandboxes.add_port(&s.id, add).await?;
    }
    Ok(())
}

fn services_data(st: &AppState, id: &str) -> Result<ServicesData> {
    let s = st.sandboxes.get(id)?;
    let ports = st.sandboxes.ports(id)?.ports;
    let services = services_of(&s)
        .into_iter()
        .map(|svc| {
            let port = svc.port.unwrap_or_default();
            let url = ports
                .iter()
                .find(|p| u32::from(p.port) == port)
                .map(|p| p.url.clone());
            ServiceView {
                id: svc.id,
                display_name: svc.display_name,
                port,
                publishable: url.is_some(),
                public_url: url.filter(|_| svc.ingress.public),
                ingress: svc.ingress,
            }
        })
        .collect();
    Ok(ServicesData {
        sandbox_id: s.id,
        services,
    })
}

pub async fn get_policy(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
) -> Result<Response> {
    let info = st.sandboxes.network_info(&id)?;
    Ok(Json(Success::new(policy_from_daemon(&info.policy))).into_response())
}

pub async fn put_policy(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(policy): S0Json<NetworkPolicy>,
) -> Result<Response> {
    let daemon = policy_to_daemon(&policy)?;
    let sandboxes = st.sandboxes.clone();
    let info =
        detached(async move { Ok(sandboxes.put_network_policy(&id, &daemon).await?) }).await?;
    Ok(Json(Success::new(policy_from_daemon(&info.policy))).into_response())
}

pub async fn get_services(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
) -> Result<Response> {
    Ok(Json(Success::new(services_data(&st, &id)?)).into_response())
}

pub async fn put_services(
    State(st): State<AppState>,
    S0Path(id): S0Path<String>,
    S0Json(req): S0Json<ServicesUpdate>,
) -> Result<Response> {
    let tags = service_tags(&req.services)?;
    let s = st.sandboxes.get(&id)?;
    let st2 = st.clone();
    detached(async move {
        apply_ports(&st2, &s, &req.services).await?;
        let mut all = s.tags.clone();
        all.retain(|k, _| !k.starts_with(TAG_SERVICE));
        all.extend(tags);
        let update = api::UpdateSandbox {
            tags: Some(all),
            ..api::UpdateSandbox::default()
        };
        st2.sandboxes.update(&s.id, update).await?;
        Ok(())
    })
    .await?;
    Ok(Json(Success::new(services_data(&st, &id)?)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: &str) -> NetworkPolicy {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn policies_map_both_ways() {
        for json in [
            r#"{"mode":"allow-all"}"#,
            r#"{"mode":"block-all"}"#,
            r#"{"mode":"allow-all","egress":{"deniedCidrs":["10.0.0.0/8"]}}"#,
            r#"{"mode":"block-all","egress":{"allowedDomains":["example.com"],"allowedCidrs":["192.0.2.0/24"]}}"#,
        ] {
            let p = policy(json);
            let back = policy_from_daemon(&policy_to_daemon(&p).unwrap());
            assert_eq!(back, p, "{json}");
        }
    }

    #[test]
    fn what_the_firewall_cannot_express_is_refused() {
        for json in [
            r#"{"mode":"allow-all","egress":{"deniedDomains":["example.com"]}}"#,
            r#"{"mode":"block-all","egress":{"trafficRules":[{"action":"allow"}]}}"#,
            r#"{"mode":"allow-all","credentialBindings":[{}]}"#,
        ] {
            let e = policy_to_daemon(&policy(json)).unwrap_err();
            assert_eq!(e.parts().1, "not_implemented", "{json}");
        }
    }

    #[test]
    fn services_are_kept_in_tags() {
        let services: Vec<Service> = serde_json::from_str(
            r#"[{"id":"web","port":8080,"ingress":{"public":true},"display_name":"Web"}]"#,
        )
        .unwrap();
        let tags = service_tags(&services).unwrap();
        let mut s: api::Sandbox = serde_json::from_value(serde_json::json!({
            "id": "sbx_a", "status": "running", "image": "base", "backend": "namespace",
            "backend_reason": "", "vcpus": 1, "memory_mib": 512, "disk_mib": 1024,
            "env": {}, "tags": {}, "created_at": 0, "timeout_ms": 1,
            "limits": {"memory": {"enforced": true, "detail": ""},
                       "cpu": {"enforced": true, "detail": ""},
                       "pids": {"enforced": true, "detail": ""}}
        }))
        .unwrap();
        s.tags = tags;
        assert_eq!(services_of(&s), services);
        for bad in [
            r#"[{"id":"Web","port":80,"ingress":{"public":true}}]"#,
            r#"[{"id":"web","ingress":{"public":true}}]"#,
            r#"[{"id":"a","port":1},{"id":"a","port":2}]"#,
        ] {
            let list: Vec<Service> = serde_json::from_str(bad).unwrap();
            assert!(service_tags(&list).is_err(), "{bad}");
        }
    }
}
