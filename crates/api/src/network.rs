//! A sandbox's network on the wire: its `NetworkPolicy` (Vercel Sandbox's shape: `"allow-all"`,
//! `"deny-all"`, or `{ allow, subnets }` with credential brokering), the flows it made, its
//! exposed ports and its byte totals.
//!
//! The daemon checks what these bounds cannot (domain patterns, CIDRs, header names) when it
//! turns a policy into the firewall, and answers 400 naming the field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::{IntoParams, ToSchema};

use crate::limits::{self, Invalid, Validate};

/// The most domains in `allow`, and the most CIDRs in each of `subnets.allow`/`deny`.
pub const MAX_POLICY_ENTRIES: usize = 256;
/// The most headers one brokered domain sets.
pub const MAX_BROKER_HEADERS: usize = 16;
/// The most exposed ports per sandbox.
pub const MAX_PORTS: usize = 64;
/// What a brokered header's value reads as when the policy is shown: values are write-only.
/// Sending it back unchanged keeps the value the daemon holds.
pub const REDACTED: &str = "[redacted]";

/// `allow-all` or `deny-all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// All egress (never the host's loopback, link-local or own addresses).
    AllowAll,
    /// No egress at all, DNS included.
    DenyAll,
}

/// A sandbox's firewall: a mode, or rules. Replaced whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(untagged)]
pub enum NetworkPolicy {
    Mode(NetworkMode),
    Rules(NetworkRules),
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        Self::Mode(NetworkMode::AllowAll)
    }
}

/// Allow-lists and deny-lists. A domain list allows those names (TLS SNI, HTTP `Host`, DNS):
/// `example.com`, `*.example.com` (subdomains, not the parent), `www.*.com` (one label).
/// `subnets.deny` wins over everything; `subnets.allow` also bypasses domain matching.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct NetworkRules {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub allow: Option<DomainAllow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub subnets: Option<Subnets>,
}

/// Domains as a list, or as a map from domain to brokering rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(untagged)]
pub enum DomainAllow {
    List(Vec<String>),
    Map(BTreeMap<String, Vec<DomainRule>>),
}

impl DomainAllow {
    /// The domains, in order.
    pub fn domains(&self) -> Vec<&str> {
        match self {
            DomainAllow::List(l) => l.iter().map(String::as_str).collect(),
            DomainAllow::Map(m) => m.keys().map(String::as_str).collect(),
        }
    }
}

/// What the daemon does to traffic to one allowed domain.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct DomainRule {
    #[serde(default)]
    pub transform: Vec<Transform>,
}

/// Credential brokering: headers set (or overridden) on every HTTPS request to the domain, by
/// the daemon, so the secret never enters the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct Transform {
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// Address ranges (CIDR, IPv4 or IPv6; a bare address is one host).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct Subnets {
    #[serde(default)]
    #[schema(max_items = 256)]
    pub allow: Vec<String>,
    #[serde(default)]
    #[schema(max_items = 256)]
    pub deny: Vec<String>,
}

impl NetworkPolicy {
    /// The policy with every brokered header value replaced by [`REDACTED`].
    pub fn redacted(&self) -> Self {
        let mut p = self.clone();
        if let NetworkPolicy::Rules(NetworkRules {
            allow: Some(DomainAllow::Map(map)),
            ..
        }) = &mut p
        {
            for rule in map.values_mut().flatten() {
                for t in &mut rule.transform {
                    for v in t.headers.values_mut() {
                        *v = REDACTED.to_owned();
                    }
                }
            }
        }
        p
    }

    /// `self` with each [`REDACTED`] value taken from `old` (same domain, rule, transform
    /// and header), so a policy read, edited and sent back keeps its secrets.
    pub fn unredacted(&self, old: &NetworkPolicy) -> Self {
        let mut p = self.clone();
        let (
            NetworkPolicy::Rules(NetworkRules {
                allow: Some(DomainAllow::Map(new)),
                ..
            }),
            NetworkPolicy::Rules(NetworkRules {
                allow: Some(DomainAllow::Map(old)),
                ..
            }),
        ) = (&mut p, old)
        else {
            return p;
        };
        for (domain, rules) in new.iter_mut() {
            for (i, rule) in rules.iter_mut().enumerate() {
                for (j, t) in rule.transform.iter_mut().enumerate() {
                    for (name, value) in t.headers.iter_mut() {
                        if value != REDACTED {
                            continue;
                        }
                        if let Some(kept) = old
                            .get(domain)
                            .and_then(|r| r.get(i))
                            .and_then(|r| r.transform.get(j))
                            .and_then(|t| t.headers.get(name))
                        {
                            value.clone_from(kept);
                        }
                    }
                }
            }
        }
        p
    }
}

impl Validate for NetworkPolicy {
    fn validate(&self) -> Result<(), Invalid> {
        let NetworkPolicy::Rules(rules) = self else {
            return Ok(());
        };
        if let Some(allow) = &rules.allow {
            let domains = allow.domains();
            if domains.len() > MAX_POLICY_ENTRIES {
                return Err(Invalid::new(
                    "network_policy.allow",
                    format!("more than {MAX_POLICY_ENTRIES} domains"),
                ));
            }
            for d in domains {
                limits::text("network_policy.allow", d, 253)?;
            }
            if let DomainAllow::Map(map) = allow {
                for (domain, rules) in map {
                    let field = format!("network_policy.allow.{domain}");
                    if rules.len() > 4 {
                        return Err(Invalid::new(&field, "more than 4 rules"));
                    }
                    for t in rules.iter().flat_map(|r| &r.transform) {
                        if t.headers.len() > MAX_BROKER_HEADERS {
                            return Err(Invalid::new(
                                &field,
                                format!("more than {MAX_BROKER_HEADERS} headers"),
                            ));
                        }
                        for (k, v) in &t.headers {
                            limits::text(&field, k, 256)?;
                            limits::text(&field, v, 8192)?;
                        }
                    }
                }
            }
        }
        if let Some(s) = &rules.subnets {
            for (field, list) in [
                ("network_policy.subnets.allow", &s.allow),
                ("network_policy.subnets.deny", &s.deny),
            ] {
                if list.len() > MAX_POLICY_ENTRIES {
                    return Err(Invalid::new(
                        field,
                        format!("more than {MAX_POLICY_ENTRIES} entries"),
                    ));
                }
                for c in list {
                    limits::text(field, c, 64)?;
                }
            }
        }
        Ok(())
    }
}

/// An exposed port: the sandbox's TCP `port`, reachable on the host at
/// `127.0.0.1:host_port`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct Port {
    pub port: u16,
    pub host_port: u16,
    /// `http://127.0.0.1:<host_port>/`
    pub url: String,
}

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct AddPort {
    /// The sandbox's TCP port, 1..=65535.
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u32,
    /// The host port on 127.0.0.1, 1024..=65535; a free one when absent.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1024, maximum = 65535)]
    pub host_port: Option<u32>,
}

impl Validate for AddPort {
    fn validate(&self) -> Result<(), Invalid> {
        limits::range("port", Some(self.port), 1, 65535)?;
        limits::range("host_port", self.host_port, 1024, 65535)
    }
}

/// The ports a sandbox exposes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct PortList {
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "lowercase")]
pub enum FlowProtocol {
    Tcp,
    Udp,
    Dns,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(rename_all = "lowercase")]
pub enum FlowVerdict {
    Allowed,
    Denied,
}

/// One connection or DNS question of a sandbox. A flow appears when it is decided and again,
/// with `ended_at` and its byte counts, when it ends (the same `id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct NetworkFlow {
    pub id: u64,
    pub started_at: i64,
    #[ts(optional)]
    pub ended_at: Option<i64>,
    pub protocol: FlowProtocol,
    /// The sandbox's end, `addr:port`.
    pub src: String,
    /// The destination, `addr:port`.
    pub dst: String,
    /// TLS SNI, HTTP `Host` or the DNS question.
    #[ts(optional)]
    pub name: Option<String>,
    pub verdict: FlowVerdict,
    /// The rule that decided (`subnets.deny 10.0.0.0/8`).
    pub rule: String,
    /// Bytes from the sandbox.
    pub bytes_out: u64,
    /// Bytes to the sandbox.
    pub bytes_in: u64,
}

/// `GET /v1/sandboxes/{id}/network/flows` query.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, IntoParams, TS)]
#[into_params(parameter_in = Query)]
pub struct FlowsQuery {
    /// Keep the stream open and send flows as they happen.
    #[serde(default)]
    pub follow: Option<bool>,
}

impl Validate for FlowsQuery {}

/// Bytes a sandbox exchanged with the network, all flows together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema, TS)]
pub struct NetworkUsage {
    /// Bytes to the sandbox.
    pub ingress_bytes: u64,
    /// Bytes from the sandbox.
    pub egress_bytes: u64,
}

/// `GET /v1/sandboxes/{id}/network`: the policy (brokered values redacted), the ports and the
/// byte totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct NetworkInfo {
    pub policy: NetworkPolicy,
    pub ports: Vec<Port>,
    pub usage: NetworkUsage,
    /// Whether the sandbox's network is attached now (it is while the sandbox runs).
    pub attached: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vercel_shapes_parse_and_secrets_are_redacted_then_kept() {
        let p: NetworkPolicy = serde_json::from_str(r#""deny-all""#).unwrap();
        assert_eq!(p, NetworkPolicy::Mode(NetworkMode::DenyAll));
        let p: NetworkPolicy = serde_json::from_str(
            r#"{"allow":{"api.example.com":[{"transform":[{"headers":{"Authorization":"Bearer s3"}}]}]},
                "subnets":{"deny":["10.0.0.0/8"]}}"#,
        )
        .unwrap();
        let shown = p.redacted();
        assert!(!serde_json::to_string(&shown).unwrap().contains("s3"));
        assert_eq!(shown.unredacted(&p), p);
        let list: NetworkPolicy = serde_json::from_str(r#"{"allow":["*.example.com"]}"#).unwrap();
        assert!(matches!(
            list,
            NetworkPolicy::Rules(NetworkRules {
                allow: Some(DomainAllow::List(_)),
                ..
            })
        ));
        assert!(serde_json::from_str::<NetworkPolicy>(r#"{"alow":[]}"#).is_err());
    }
}
