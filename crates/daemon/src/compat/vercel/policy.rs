//! Network policies between Vercel's two wire forms and the daemon's `NetworkPolicy`.
//!
//! 1.x sends `{ mode: "allow-all" | "deny-all" | "custom", allowedDomains, allowedCIDRs,
//! deniedCIDRs, injectionRules: [{ domain, headers }] }`; 3.x sends `{ mode }` or the SDK's own
//! `{ allow, subnets }`, which is the daemon's form. Answers use the 1.x form (both SDKs
//! validate it), with brokered header names but never their values. Rules the daemon has no
//! counterpart for (3.x `match`, `forwardURL`, `response`) are `not_implemented`.

use std::collections::BTreeMap;

use belljar_api::{
    DomainAllow, DomainRule, NetworkMode, NetworkPolicy, NetworkRules, Subnets, Transform,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{Result, VercelError};

/// 1.x's `custom` policy.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Custom {
    #[serde(default)]
    allowed_domains: Vec<String>,
    #[serde(default, rename = "allowedCIDRs")]
    allowed_cidrs: Vec<String>,
    #[serde(default, rename = "deniedCIDRs")]
    denied_cidrs: Vec<String>,
    #[serde(default)]
    injection_rules: Vec<Injection>,
    #[serde(default)]
    forward_rules: Vec<Value>,
}

#[derive(Deserialize)]
struct Injection {
    domain: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

fn bad(e: impl std::fmt::Display) -> VercelError {
    VercelError::BadRequest(format!("networkPolicy: {e}"))
}

/// The daemon's policy for a Vercel request's.
pub fn from_vercel(v: &Value) -> Result<NetworkPolicy> {
    match v.get("mode").and_then(Value::as_str) {
        Some("allow-all") => return Ok(NetworkPolicy::Mode(NetworkMode::AllowAll)),
        Some("deny-all") => return Ok(NetworkPolicy::Mode(NetworkMode::DenyAll)),
        Some("custom") => return custom(v),
        Some(other) => return Err(bad(format!("unknown mode {other:?}"))),
        None => {}
    }
    if !v.is_object() {
        return Err(bad("must be an object"));
    }
    // 3.x's rules: the daemon's own form, without what it cannot do.
    let has_other_rules = v
        .get("allow")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(Value::as_array)
        .flatten()
        .any(|rule| {
            ["match", "forwardURL", "response"]
                .iter()
                .any(|k| rule.get(*k).is_some())
        });
    if has_other_rules {
        return Err(VercelError::NotImplemented(
            "network rules with match, forwardURL or response".into(),
        ));
    }
    let rules: NetworkRules = serde_json::from_value(v.clone()).map_err(bad)?;
    Ok(NetworkPolicy::Rules(rules))
}

fn custom(v: &Value) -> Result<NetworkPolicy> {
    let c: Custom = serde_json::from_value(v.clone()).map_err(bad)?;
    if !c.forward_rules.is_empty() {
        return Err(VercelError::NotImplemented("forwardRules".into()));
    }
    let allow = if c.injection_rules.is_empty() {
        (!c.allowed_domains.is_empty()).then_some(DomainAllow::List(c.allowed_domains))
    } else {
        let mut map: BTreeMap<String, Vec<DomainRule>> = c
            .allowed_domains
            .into_iter()
            .map(|d| (d, Vec::new()))
            .collect();
        for rule in c.injection_rules {
            map.entry(rule.domain).or_default().push(DomainRule {
                transform: vec![Transform {
                    headers: rule.headers,
                }],
            });
        }
        Some(DomainAllow::Map(map))
    };
    let subnets = (!c.allowed_cidrs.is_empty() || !c.denied_cidrs.is_empty()).then_some(Subnets {
        allow: c.allowed_cidrs,
        deny: c.denied_cidrs,
    });
    Ok(NetworkPolicy::Rules(NetworkRules { allow, subnets }))
}

/// The policy as Vercel's answers carry it (the 1.x form both SDKs read).
pub fn to_vercel(p: &NetworkPolicy) -> Value {
    match p {
        NetworkPolicy::Mode(NetworkMode::AllowAll) => json!({ "mode": "allow-all" }),
        NetworkPolicy::Mode(NetworkMode::DenyAll) => json!({ "mode": "deny-all" }),
        NetworkPolicy::Rules(r) => {
            let mut out = json!({ "mode": "custom" });
            let mut injections = Vec::new();
            match &r.allow {
                Some(DomainAllow::List(domains)) => out["allowedDomains"] = json!(domains),
                Some(DomainAllow::Map(map)) => {
                    out["allowedDomains"] = json!(map.keys().collect::<Vec<_>>());
                    for (domain, rules) in map {
                        let names: Vec<&String> = rules
                            .iter()
                            .flat_map(|r| &r.transform)
                            .flat_map(|t| t.headers.keys())
                            .collect();
                        if !names.is_empty() {
                            injections.push(json!({ "domain": domain, "headerNames": names }));
                        }
                    }
                }
                None => {}
            }
            if !injections.is_empty() {
                out["injectionRules"] = json!(injections);
            }
            if let Some(s) = &r.subnets {
                if !s.allow.is_empty() {
                    out["allowedCIDRs"] = json!(s.allow);
                }
                if !s.deny.is_empty() {
                    out["deniedCIDRs"] = json!(s.deny);
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_lines_map_onto_the_daemon_policy() {
        assert_eq!(
            from_vercel(&json!({ "mode": "deny-all" })).unwrap(),
            NetworkPolicy::Mode(NetworkMode::DenyAll)
        );
        let v1 = from_vercel(&json!({
            "mode": "custom",
            "allowedDomains": ["example.com"],
            "injectionRules": [{ "domain": "api.example.com", "headers": { "x-key": "s" } }],
            "deniedCIDRs": ["10.0.0.0/8"],
        }))
        .unwrap();
        let v3 = from_vercel(&json!({
            "allow": { "example.com": [], "api.example.com": [{ "transform": [{ "headers": { "x-key": "s" } }] }] },
            "subnets": { "deny": ["10.0.0.0/8"] },
        }))
        .unwrap();
        assert_eq!(v1, v3);
        let back = to_vercel(&v1);
        assert_eq!(back["mode"], "custom");
        assert_eq!(back["injectionRules"][0]["headerNames"][0], "x-key");
        assert!(
            !back.to_string().contains("\"s\""),
            "a brokered value leaked: {back}"
        );
    }

    #[test]
    fn what_the_daemon_cannot_do_is_refused() {
        let e = from_vercel(&json!({ "allow": { "a.com": [{ "forwardURL": "http://x" }] } }));
        assert!(matches!(e, Err(VercelError::NotImplemented(_))));
        assert!(matches!(
            from_vercel(&json!({ "mode": "custom", "forwardRules": [{}] })),
            Err(VercelError::NotImplemented(_))
        ));
        assert!(matches!(
            from_vercel(&json!({ "mode": "open" })),
            Err(VercelError::BadRequest(_))
        ));
        assert!(matches!(
            from_vercel(&json!("x")),
            Err(VercelError::BadRequest(_))
        ));
        assert!(matches!(
            from_vercel(&json!({ "allow": 3 })),
            Err(VercelError::BadRequest(_))
        ));
    }
}
