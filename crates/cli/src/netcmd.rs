//! `belljar network show|set|flows` and `belljar port add|ls|rm`, and the policy flags of
//! `belljar create` (`--network`, `--allow-domain`, `--allow-cidr`, `--deny-cidr`, `--broker`).

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use belljar_api::{
    AddPort, DomainAllow, DomainRule, NetworkMode, NetworkPolicy, NetworkRules, Subnets, Transform,
};
use belljar_client::Client;

use crate::args::{NetworkCmd, PolicyOpts, PortCmd};
use crate::commands::{print_json, resolve};

/// The policy the flags describe; `None` when no flag was given.
pub fn policy(o: &PolicyOpts) -> Result<Option<NetworkPolicy>> {
    let rules = !(o.allow_domain.is_empty()
        && o.allow_cidr.is_empty()
        && o.deny_cidr.is_empty()
        && o.broker.is_empty());
    let mode = match o.network.as_deref() {
        None => None,
        Some("allow-all") => Some(NetworkMode::AllowAll),
        Some("deny-all") => Some(NetworkMode::DenyAll),
        Some(other) => bail!("--network {other:?}: expected allow-all or deny-all"),
    };
    if !rules {
        return Ok(mode.map(NetworkPolicy::Mode));
    }
    if mode.is_some() {
        bail!(
            "--network cannot be combined with --allow-domain, --allow-cidr, --deny-cidr or --broker"
        );
    }
    let allow = if o.broker.is_empty() {
        (!o.allow_domain.is_empty()).then(|| DomainAllow::List(o.allow_domain.clone()))
    } else {
        let mut map: BTreeMap<String, Vec<DomainRule>> = o
            .allow_domain
            .iter()
            .map(|d| (d.clone(), Vec::new()))
            .collect();
        for b in &o.broker {
            let Some((domain, header)) = b.split_once(':') else {
                bail!("--broker {b:?}: expected DOMAIN:Header=value");
            };
            let Some((name, value)) = header.split_once('=') else {
                bail!("--broker {b:?}: expected DOMAIN:Header=value");
            };
            let rules = map.entry(domain.to_owned()).or_default();
            if rules.is_empty() {
                rules.push(DomainRule::default());
            }
            if rules[0].transform.is_empty() {
                rules[0].transform.push(Transform::default());
            }
            rules[0].transform[0]
                .headers
                .insert(name.to_owned(), value.to_owned());
        }
        Some(DomainAllow::Map(map))
    };
    let subnets = (!(o.allow_cidr.is_empty() && o.deny_cidr.is_empty())).then(|| Subnets {
        allow: o.allow_cidr.clone(),
        deny: o.deny_cidr.clone(),
    });
    Ok(Some(NetworkPolicy::Rules(NetworkRules { allow, subnets })))
}

pub async fn network(client: &Client, action: NetworkCmd, json: bool) -> Result<i32> {
    match action {
        NetworkCmd::Show { id } => {
            let id = resolve(client, &id).await?;
            let info = client.network(&id).await?;
            if json {
                print_json(&info)?;
            } else {
                outln!("policy: {}", serde_json::to_string(&info.policy)?)?;
                for p in &info.ports {
                    outln!("port {} -> {}", p.port, p.url)?;
                }
                outln!(
                    "ingress: {} bytes, egress: {} bytes",
                    info.usage.ingress_bytes,
                    info.usage.egress_bytes
                )?;
            }
        }
        NetworkCmd::Set { id, policy: opts } => {
            let id = resolve(client, &id).await?;
            let Some(p) = policy(&opts)? else {
                bail!("give --network, --allow-domain, --allow-cidr, --deny-cidr or --broker");
            };
            let s = client.set_network_policy(&id, &p).await?;
            if json {
                print_json(&s.network_policy)?;
            }
        }
        NetworkCmd::Flows { id, follow } => {
            let id = resolve(client, &id).await?;
            let mut flows = client.network_flows(&id, follow).await?;
            while let Some(f) = flows.next().await? {
                if json {
                    outln!("{}", serde_json::to_string(&f)?)?;
                } else {
                    let verdict = serde_json::to_value(f.verdict)?;
                    let protocol = serde_json::to_value(f.protocol)?;
                    outln!(
                        "{:<8} {:<4} {:<28} {:<30} out={} in={}  ({})",
                        verdict.as_str().unwrap_or_default(),
                        protocol.as_str().unwrap_or_default(),
                        f.dst,
                        f.name.as_deref().unwrap_or("-"),
                        f.bytes_out,
                        f.bytes_in,
                        f.rule
                    )?;
                }
            }
        }
    }
    Ok(0)
}

pub async fn port(client: &Client, action: PortCmd, json: bool) -> Result<i32> {
    match action {
        PortCmd::Add {
            id,
            port,
            host_port,
        } => {
            let id = resolve(client, &id).await?;
            let p = client.add_port(&id, &AddPort { port, host_port }).await?;
            if json {
                print_json(&p)?;
            } else {
                outln!("{} -> {}", p.port, p.url)?;
            }
        }
        PortCmd::Ls { id } => {
            let id = resolve(client, &id).await?;
            let ports = client.ports(&id).await?;
            if json {
                print_json(&ports)?;
            } else {
                for p in &ports.ports {
                    out!("{} -> {}\n", p.port, p.url)?;
                }
            }
        }
        PortCmd::Rm { id, port } => {
            let id = resolve(client, &id).await?;
            client.remove_port(&id, port).await?;
        }
    }
    Ok(0)
}
