//! The wire `NetworkPolicy` (crates/api) turned into the firewall of `belljar-network`, with a
//! 400 naming the field for what the firewall cannot take: malformed domain patterns
//! (`*.*.com`, `*example.com`, empty labels), bad CIDRs, bad header names or values.

use belljar_api as api;
use belljar_network::{DomainPattern, NetworkPolicy, Rules, Transform};
use ipnet::IpNet;

use crate::sandbox::SandboxError;

fn bad(field: &str, problem: impl std::fmt::Display) -> SandboxError {
    SandboxError::BadRequest(format!("{field}: {problem}"))
}

fn cidr(field: &str, text: &str) -> Result<IpNet, SandboxError> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    text.parse::<std::net::IpAddr>()
        .map(IpNet::from)
        .map_err(|_| {
            bad(
                field,
                format!("{text:?} is not a CIDR (10.0.0.0/8, 2001:db8::/32)"),
            )
        })
}

fn domain(field: &str, text: &str) -> Result<DomainPattern, SandboxError> {
    DomainPattern::parse(text).map_err(|e| bad(field, e))
}

/// The firewall for `policy`, or a 400 naming the offending field.
pub fn firewall(policy: &api::NetworkPolicy) -> Result<NetworkPolicy, SandboxError> {
    let rules = match policy {
        api::NetworkPolicy::Mode(api::NetworkMode::AllowAll) => return Ok(NetworkPolicy::AllowAll),
        api::NetworkPolicy::Mode(api::NetworkMode::DenyAll) => return Ok(NetworkPolicy::DenyAll),
        api::NetworkPolicy::Rules(rules) => rules,
    };
    let mut out = Rules::default();
    if let Some(allow) = &rules.allow {
        let field = "network_policy.allow";
        let mut domains = Vec::new();
        for d in allow.domains() {
            domains.push(domain(field, d)?);
        }
        if let api::DomainAllow::Map(map) = allow {
            for (name, entries) in map {
                let pattern = domain(field, name)?;
                let headers: Vec<(&str, &str)> = entries
                    .iter()
                    .flat_map(|r| &r.transform)
                    .flat_map(|t| &t.headers)
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                if headers.is_empty() {
                    continue;
                }
                let t = Transform::new(pattern, &headers)
                    .map_err(|e| bad(&format!("{field}.{name}.transform"), e))?;
                out.transforms.push(t);
            }
        }
        out.allow = Some(domains);
    }
    if let Some(subnets) = &rules.subnets {
        for c in &subnets.allow {
            out.subnets_allow
                .push(cidr("network_policy.subnets.allow", c)?);
        }
        for c in &subnets.deny {
            out.subnets_deny
                .push(cidr("network_policy.subnets.deny", c)?);
        }
    }
    Ok(NetworkPolicy::Rules(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(json: &str) -> Result<NetworkPolicy, SandboxError> {
        firewall(&serde_json::from_str(json).unwrap())
    }

    fn message(r: Result<NetworkPolicy, SandboxError>) -> String {
        match r {
            Err(SandboxError::BadRequest(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_input_names_the_field() {
        for d in ["*.*.com", "*example.com", "a..com", ""] {
            let m = message(rules(&format!(r#"{{"allow":["{d}"]}}"#)));
            assert!(m.starts_with("network_policy.allow:"), "{d}: {m}");
        }
        let m = message(rules(r#"{"subnets":{"deny":["10.0.0.0/33"]}}"#));
        assert!(m.starts_with("network_policy.subnets.deny:"), "{m}");
        let m = message(rules(r#"{"subnets":{"allow":["nope"]}}"#));
        assert!(m.starts_with("network_policy.subnets.allow:"), "{m}");
        let m = message(rules(
            r#"{"allow":{"api.example.com":[{"transform":[{"headers":{"Bad Name":"x"}}]}]}}"#,
        ));
        assert!(m.contains("transform"), "{m}");
    }

    #[test]
    fn good_input_becomes_rules() {
        let NetworkPolicy::Rules(r) = rules(
            r#"{"allow":{"api.example.com":[{"transform":[{"headers":{"Authorization":"Bearer x"}}]}],"*.example.org":[]},
                "subnets":{"allow":["203.0.113.7"],"deny":["10.1.2.3/8"]}}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(r.allow.as_ref().unwrap().len(), 2);
        assert_eq!(r.transforms.len(), 1);
        assert_eq!(r.subnets_allow[0].to_string(), "203.0.113.7/32");
        assert_eq!(r.subnets_deny[0].to_string(), "10.0.0.0/8");
        assert_eq!(rules(r#""deny-all""#).unwrap(), NetworkPolicy::DenyAll);
    }
}
