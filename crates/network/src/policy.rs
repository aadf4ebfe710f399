//! `NetworkPolicy`, with Vercel Sandbox's semantics: `allow-all` (the default), `deny-all`
//! (DNS too), or rules — a domain allow-list matched on DNS questions and on the TLS SNI (or a
//! plain-HTTP `Host`), and `subnets.allow` / `subnets.deny`, where deny wins over everything
//! and allow bypasses domain matching.
//!
//! On top of Vercel: the host's loopback, link-local addresses (cloud metadata), the host's own
//! interface addresses (so the daemon itself) and the sandbox network are never reached unless
//! a `subnets.allow` entry names them explicitly, whatever the mode; and a TLS/HTTP name is
//! only trusted for an address the daemon's DNS returned for an allowed name, so an SNI cannot
//! be used to reach an arbitrary address (domain fronting).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::domain::DomainPattern;

/// The firewall of one sandbox. Replaced whole, never edited in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// All egress is allowed (still not to the reserved addresses).
    #[default]
    AllowAll,
    /// No egress at all, DNS included.
    DenyAll,
    /// Allow-lists and deny-lists.
    Rules(Rules),
}

/// The user-defined rules of a [`NetworkPolicy`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Domains whose TLS SNI (or HTTP `Host`) may be reached, and whose DNS is answered.
    /// `None` when the policy has no `allow` key.
    pub allow: Option<Vec<DomainPattern>>,
    /// Address ranges that may be reached whatever the protocol.
    pub subnets_allow: Vec<IpNet>,
    /// Address ranges that may never be reached.
    pub subnets_deny: Vec<IpNet>,
    /// Headers the daemon sets on requests to these domains (credential brokering). A
    /// domain here must also be allowed by `allow` to be reached.
    pub transforms: Vec<crate::broker::Transform>,
}

impl Rules {
    /// Whether traffic no rule names is allowed: only when the rules allow nothing explicitly
    /// (`{ subnets: { deny: [...] } }` means "the Internet except these").
    fn default_allows(&self) -> bool {
        self.allow.is_none() && self.subnets_allow.is_empty()
    }
}

/// What decided a verdict, as the flow log shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    AllowAll,
    DenyAll,
    /// Rules without an allow-list let the rest through.
    DefaultAllow,
    /// Nothing in the allow-lists matched.
    NoMatch,
    SubnetAllow(IpNet),
    SubnetDeny(IpNet),
    Domain(String),
    /// A reserved destination (loopback, link-local, the host, the sandbox network).
    Reserved(&'static str),
    /// The name matched but the address was never a DNS answer for an allowed name.
    NotResolved,
    /// The flow needed a name (TLS SNI or HTTP `Host`) and sent none.
    NoName,
    /// The sandbox has as many open flows as it may.
    TooManyFlows,
    /// The daemon has no host socket (or buffer memory) to spare for the flow, or the
    /// sandbox holds its share of them (`crate::budget`).
    FlowBudget,
    /// A connection from the host to an exposed port (not egress: no policy applies).
    Forwarded,
    /// The sandbox asks the gateway's DNS more questions a second than it may.
    DnsRateLimit,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::AllowAll => f.write_str("allow-all"),
            Rule::DenyAll => f.write_str("deny-all"),
            Rule::DefaultAllow => f.write_str("no allow-list"),
            Rule::NoMatch => f.write_str("no rule allows it"),
            Rule::SubnetAllow(n) => write!(f, "subnets.allow {n}"),
            Rule::SubnetDeny(n) => write!(f, "subnets.deny {n}"),
            Rule::Domain(d) => write!(f, "allow {d}"),
            Rule::Reserved(what) => write!(f, "reserved: {what}"),
            Rule::NotResolved => f.write_str("address not resolved for an allowed name"),
            Rule::NoName => f.write_str("no TLS SNI or HTTP Host"),
            Rule::TooManyFlows => f.write_str("too many open flows"),
            Rule::FlowBudget => f.write_str("daemon flow budget"),
            Rule::Forwarded => f.write_str("exposed port"),
            Rule::DnsRateLimit => f.write_str("dns rate limit"),
        }
    }
}

/// A decision with the rule behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow(Rule),
    Deny(Rule),
}

impl Verdict {
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow(_))
    }
    pub fn rule(&self) -> &Rule {
        match self {
            Verdict::Allow(r) | Verdict::Deny(r) => r,
        }
    }
}

/// The decision on a destination address, before any name is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddrDecision {
    Decided(Verdict),
    /// Only a domain rule can allow it: read the TLS SNI or HTTP `Host` first.
    NeedName,
}

/// What the policy needs to know about the machine it runs on.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The host's own interface addresses (the daemon listens on some of them).
    pub host_addrs: Vec<IpAddr>,
    /// The sandbox network(s): never a destination.
    pub sandbox_nets: Vec<IpNet>,
}

impl Context {
    /// The host's interface addresses as they are now, and the sandbox networks.
    pub fn current(sandbox_nets: &[IpNet]) -> Self {
        let host_addrs = nix::ifaddrs::getifaddrs()
            .map(|addrs| {
                addrs
                    .filter_map(|a| a.address)
                    .filter_map(|s| {
                        s.as_sockaddr_in()
                            .map(|v4| IpAddr::V4(v4.ip()))
                            .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            host_addrs,
            sandbox_nets: sandbox_nets.to_vec(),
        }
    }

    /// Which reserved class `ip` belongs to, and the widest range an allow entry may span to
    /// still name it explicitly.
    fn reserved(&self, ip: IpAddr) -> Option<(&'static str, IpNet)> {
        let net = |s: &str| s.parse::<IpNet>().expect("a valid literal");
        let ip = canonical(ip);
        if self.sandbox_nets.iter().any(|n| n.contains(&ip)) {
            // Never reachable: there is nothing behind it but the gateway itself.
            return Some(("the sandbox network", IpNet::from(ip)));
        }
        if ip.is_loopback() {
            return Some(match ip {
                IpAddr::V4(_) => ("host loopback", net("127.0.0.0/8")),
                IpAddr::V6(_) => ("host loopback", net("::1/128")),
            });
        }
        match ip {
            IpAddr::V4(v4) if v4.is_link_local() => {
                return Some(("link-local", net("169.254.0.0/16")));
            }
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => {
                return Some(("link-local", net("fe80::/10")));
            }
            _ => {}
        }
        if ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]) {
            return Some(("not a unicast address", IpNet::from(ip)));
        }
        if self.host_addrs.iter().any(|h| canonical(*h) == ip) {
            return Some(("the host itself", IpNet::from(ip)));
        }
        None
    }
}

/// IPv4-mapped IPv6 addresses are their IPv4 address, so `::ffff:127.0.0.1` is loopback.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

impl NetworkPolicy {
    /// The decision on a flow to `dst`, before any name is known.
    pub fn decide_addr(&self, dst: IpAddr, cx: &Context) -> AddrDecision {
        let dst = canonical(dst);
        let rules = match self {
            NetworkPolicy::DenyAll => return AddrDecision::Decided(Verdict::Deny(Rule::DenyAll)),
            NetworkPolicy::AllowAll => None,
            NetworkPolicy::Rules(rules) => Some(rules),
        };
        if let Some(deny) = rules.and_then(|r| r.subnets_deny.iter().find(|n| n.contains(&dst))) {
            return AddrDecision::Decided(Verdict::Deny(Rule::SubnetDeny(*deny)));
        }
        let allow = rules.and_then(|r| r.subnets_allow.iter().find(|n| n.contains(&dst)));
        if let Some((what, widest)) = cx.reserved(dst) {
            // Only an entry inside the reserved range names it; 0.0.0.0/0 does not.
            let named = rules.and_then(|r| {
                r.subnets_allow
                    .iter()
                    .find(|n| n.contains(&dst) && widest.contains(*n))
            });
            return AddrDecision::Decided(match named {
                Some(n) if what != "the sandbox network" => Verdict::Allow(Rule::SubnetAllow(*n)),
                _ => Verdict::Deny(Rule::Reserved(what)),
            });
        }
        match (rules, allow) {
            (_, Some(n)) => AddrDecision::Decided(Verdict::Allow(Rule::SubnetAllow(*n))),
            (None, None) => AddrDecision::Decided(Verdict::Allow(Rule::AllowAll)),
            (Some(r), None) if r.default_allows() => {
                AddrDecision::Decided(Verdict::Allow(Rule::DefaultAllow))
            }
            (Some(r), None) if r.allow.as_ref().is_some_and(|a| !a.is_empty()) => {
                AddrDecision::NeedName
            }
            (Some(_), None) => AddrDecision::Decided(Verdict::Deny(Rule::NoMatch)),
        }
    }

    /// The first allow-list pattern matching `name`.
    fn matching_domain(&self, name: &str) -> Option<&DomainPattern> {
        match self {
            NetworkPolicy::Rules(Rules {
                allow: Some(list), ..
            }) => list.iter().find(|p| p.matches(name)),
            _ => None,
        }
    }

    /// The transform for `name`, if its traffic is brokered.
    pub fn transform_for(&self, name: &str) -> Option<&crate::broker::Transform> {
        match self {
            NetworkPolicy::Rules(r) => r.transforms.iter().find(|t| t.domain.matches(name)),
            _ => None,
        }
    }

    /// Whether the daemon answers a DNS question for `name`.
    pub fn decide_dns(&self, name: &str) -> Verdict {
        match self {
            NetworkPolicy::AllowAll => Verdict::Allow(Rule::AllowAll),
            NetworkPolicy::DenyAll => Verdict::Deny(Rule::DenyAll),
            NetworkPolicy::Rules(r) if r.default_allows() => Verdict::Allow(Rule::DefaultAllow),
            NetworkPolicy::Rules(_) => match self.matching_domain(name) {
                Some(p) => Verdict::Allow(Rule::Domain(p.to_string())),
                None => Verdict::Deny(Rule::NoMatch),
            },
        }
    }

    /// The decision on a flow to `dst` that [`decide_addr`](Self::decide_addr) left to a name:
    /// `name` is its TLS SNI or HTTP `Host`; `resolved` tells whether the daemon's DNS gave
    /// `dst` as an answer for that name.
    pub fn decide_name(&self, name: Option<&str>, resolved: impl Fn(&str) -> bool) -> Verdict {
        let Some(name) = name else {
            return Verdict::Deny(Rule::NoName);
        };
        match self.matching_domain(name) {
            Some(_) if !resolved(name) => Verdict::Deny(Rule::NotResolved),
            Some(p) => Verdict::Allow(Rule::Domain(p.to_string())),
            None => Verdict::Deny(Rule::NoMatch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context {
        Context {
            host_addrs: vec!["192.0.2.7".parse().unwrap()],
            sandbox_nets: vec!["10.0.2.0/24".parse().unwrap()],
        }
    }

    fn rules(allow: Option<&[&str]>, sa: &[&str], sd: &[&str]) -> NetworkPolicy {
        NetworkPolicy::Rules(Rules {
            allow: allow.map(|a| a.iter().map(|d| DomainPattern::parse(d).unwrap()).collect()),
            subnets_allow: sa.iter().map(|s| s.parse().unwrap()).collect(),
            subnets_deny: sd.iter().map(|s| s.parse().unwrap()).collect(),
            transforms: Vec::new(),
        })
    }

    fn addr(p: &NetworkPolicy, ip: &str) -> AddrDecision {
        p.decide_addr(ip.parse().unwrap(), &cx())
    }

    #[test]
    fn modes() {
        assert_eq!(
            addr(&NetworkPolicy::AllowAll, "198.51.100.1"),
            AddrDecision::Decided(Verdict::Allow(Rule::AllowAll))
        );
        assert_eq!(
            addr(&NetworkPolicy::DenyAll, "198.51.100.1"),
            AddrDecision::Decided(Verdict::Deny(Rule::DenyAll))
        );
        assert!(!NetworkPolicy::DenyAll.decide_dns("example.com").is_allow());
        assert!(NetworkPolicy::AllowAll.decide_dns("example.com").is_allow());
    }

    #[test]
    fn reserved_addresses_need_an_explicit_entry() {
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "192.0.2.7",
            "::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(
                matches!(
                    addr(&NetworkPolicy::AllowAll, ip),
                    AddrDecision::Decided(Verdict::Deny(Rule::Reserved(_)))
                ),
                "{ip}"
            );
            let wide = rules(None, &["0.0.0.0/0", "::/0"], &[]);
            assert!(
                matches!(
                    addr(&wide, ip),
                    AddrDecision::Decided(Verdict::Deny(Rule::Reserved(_)))
                ),
                "{ip} under 0.0.0.0/0"
            );
        }
        let named = rules(
            None,
            &["127.0.0.1/32", "169.254.0.0/16", "192.0.2.7/32"],
            &[],
        );
        for ip in ["127.0.0.1", "169.254.169.254", "192.0.2.7"] {
            assert!(matches!(
                addr(&named, ip),
                AddrDecision::Decided(Verdict::Allow(Rule::SubnetAllow(_)))
            ));
        }
        // The sandbox network itself can never be a destination.
        let own = rules(None, &["10.0.2.0/24"], &[]);
        assert!(matches!(
            addr(&own, "10.0.2.2"),
            AddrDecision::Decided(Verdict::Deny(Rule::Reserved(_)))
        ));
    }

    #[test]
    fn deny_wins_and_allow_bypasses_domains() {
        let p = rules(
            Some(&["example.com"]),
            &["198.51.100.0/24"],
            &["198.51.100.128/25"],
        );
        assert!(matches!(
            addr(&p, "198.51.100.200"),
            AddrDecision::Decided(Verdict::Deny(Rule::SubnetDeny(_)))
        ));
        assert!(matches!(
            addr(&p, "198.51.100.1"),
            AddrDecision::Decided(Verdict::Allow(Rule::SubnetAllow(_)))
        ));
        assert_eq!(addr(&p, "203.0.113.1"), AddrDecision::NeedName);
        let only_deny = rules(None, &[], &["10.0.0.0/8"]);
        assert!(matches!(
            addr(&only_deny, "203.0.113.1"),
            AddrDecision::Decided(Verdict::Allow(Rule::DefaultAllow))
        ));
        let only_allow = rules(None, &["198.51.100.0/24"], &[]);
        assert!(matches!(
            addr(&only_allow, "203.0.113.1"),
            AddrDecision::Decided(Verdict::Deny(Rule::NoMatch))
        ));
    }

    #[test]
    fn names_and_dns() {
        let p = rules(Some(&["*.example.com", "www.*.org"]), &[], &[]);
        assert!(p.decide_dns("api.example.com").is_allow());
        assert!(!p.decide_dns("example.com").is_allow());
        assert!(p.decide_dns("www.foo.org").is_allow());
        assert!(!p.decide_dns("evil.test").is_allow());
        assert!(p.decide_name(Some("api.example.com"), |_| true).is_allow());
        assert_eq!(
            p.decide_name(Some("api.example.com"), |_| false),
            Verdict::Deny(Rule::NotResolved)
        );
        assert_eq!(p.decide_name(None, |_| true), Verdict::Deny(Rule::NoName));
    }
}
