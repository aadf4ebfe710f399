//! How the agent sets up the sandbox's network, as the daemon tells it: one value in the
//! agent's environment (`BELLJAR_NET`), the same for a namespace sandbox (whose `eth0` is a
//! tap the namespace backend created) and a microVM (whose `eth0` is the VMM's virtio-net).
//! The daemon writes it with `Display`, the agent reads it with `FromStr`, so neither end
//! spells the format by hand.
//!
//! The text is `key=value` pairs joined by `,` (it travels on a kernel command line, which
//! must not contain spaces): `v4=10.0.2.15/24,gw4=10.0.2.2,v6=fd62:656c:6c6a::2/64,
//! gw6=fd62:656c:6c6a::1,dns=10.0.2.2,mtu=1500,mac=02:62:6a:00:00:02`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The environment variable carrying a [`NetSetup`].
pub const NET_ENV: &str = "BELLJAR_NET";

/// Where the sandbox's CA for credential brokering is installed (the daemon writes it; the
/// agent points `SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS` and `REQUESTS_CA_BUNDLE` of every
/// command at it, or at the system bundle it was added to, when it exists).
pub const SANDBOX_CA_PATH: &str = "/usr/local/share/ca-certificates/belljar-sandbox-ca.crt";

/// The system trust bundle (Debian's `ca-certificates`) the CA is appended to.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The environment variable carrying the broker CA's certificate (PEM), which the agent
/// installs before it serves ([`bundle_with_ca`] into [`SYSTEM_CA_BUNDLE`], and
/// [`SANDBOX_CA_PATH`]). A namespace sandbox's agent gets it in its `execve` environment; a
/// microVM's kernel command line is too short for it, so there the daemon writes both files
/// through the agent once it answers.
pub const CA_ENV: &str = "BELLJAR_CA_PEM";

/// The largest system bundle the CA is added to; a larger one is left as it is.
pub const MAX_CA_BUNDLE: usize = 8 << 20;

/// `bundle` with the certificate `pem` appended, or `None` when it holds it already (a
/// persistent sandbox started again, or a fork, keeps the bundle it had).
pub fn bundle_with_ca(bundle: &[u8], pem: &str) -> Option<Vec<u8>> {
    let pem = pem.trim_end();
    if pem.is_empty() {
        return None;
    }
    let held = match std::str::from_utf8(bundle) {
        Ok(text) => text.contains(pem),
        Err(_) => bundle.windows(pem.len()).any(|w| w == pem.as_bytes()),
    };
    if held {
        return None;
    }
    let mut out = Vec::with_capacity(bundle.len() + pem.len() + 2);
    out.extend_from_slice(bundle);
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(pem.as_bytes());
    out.push(b'\n');
    Some(out)
}

/// The interface the agent configures.
pub const INTERFACE: &str = "eth0";

/// The network of one sandbox, from the agent's side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSetup {
    pub v4: Ipv4Addr,
    pub prefix_v4: u8,
    pub gateway_v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub prefix_v6: u8,
    pub gateway_v6: Ipv6Addr,
    /// The name server written to `/etc/resolv.conf`.
    pub dns: IpAddr,
    pub mtu: u32,
    pub mac: [u8; 6],
}

/// A `BELLJAR_NET` value that does not parse; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSetupError(pub String);

impl fmt::Display for NetSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Invalid {NET_ENV}: {}", self.0)
    }
}

impl std::error::Error for NetSetupError {}

impl fmt::Display for NetSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.mac;
        write!(
            f,
            "v4={}/{},gw4={},v6={}/{},gw6={},dns={},mtu={},mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            self.v4,
            self.prefix_v4,
            self.gateway_v4,
            self.v6,
            self.prefix_v6,
            self.gateway_v6,
            self.dns,
            self.mtu,
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            m[5]
        )
    }
}

fn with_prefix<T: FromStr>(key: &str, v: &str, max: u8) -> Result<(T, u8), NetSetupError> {
    let bad = || NetSetupError(format!("{key}={v}"));
    let (addr, len) = v.split_once('/').ok_or_else(bad)?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    if len > max {
        return Err(bad());
    }
    Ok((addr.parse().map_err(|_| bad())?, len))
}

impl FromStr for NetSetup {
    type Err = NetSetupError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut v4 = None;
        let mut v6 = None;
        let (mut gw4, mut gw6, mut dns, mut mtu, mut mac) = (None, None, None, None, None);
        for pair in s.split(',') {
            let (key, v) = pair
                .split_once('=')
                .ok_or_else(|| NetSetupError(format!("{pair:?} is not key=value")))?;
            let bad = || NetSetupError(format!("{key}={v}"));
            match key {
                "v4" => v4 = Some(with_prefix::<Ipv4Addr>(key, v, 32)?),
                "v6" => v6 = Some(with_prefix::<Ipv6Addr>(key, v, 128)?),
                "gw4" => gw4 = Some(v.parse().map_err(|_| bad())?),
                "gw6" => gw6 = Some(v.parse().map_err(|_| bad())?),
                "dns" => dns = Some(v.parse().map_err(|_| bad())?),
                "mtu" => mtu = Some(v.parse().map_err(|_| bad())?),
                "mac" => {
                    let bytes: Vec<u8> = v
                        .split(':')
                        .map(|b| u8::from_str_radix(b, 16))
                        .collect::<Result<_, _>>()
                        .map_err(|_| bad())?;
                    mac = Some(<[u8; 6]>::try_from(bytes).map_err(|_| bad())?);
                }
                _ => return Err(NetSetupError(format!("unknown key {key:?}"))),
            }
        }
        let missing = |k: &str| NetSetupError(format!("{k} is missing"));
        let (v4, prefix_v4) = v4.ok_or_else(|| missing("v4"))?;
        let (v6, prefix_v6) = v6.ok_or_else(|| missing("v6"))?;
        Ok(Self {
            v4,
            prefix_v4,
            gateway_v4: gw4.ok_or_else(|| missing("gw4"))?,
            v6,
            prefix_v6,
            gateway_v6: gw6.ok_or_else(|| missing("gw6"))?,
            dns: dns.ok_or_else(|| missing("dns"))?,
            mtu: mtu.ok_or_else(|| missing("mtu"))?,
            mac: mac.ok_or_else(|| missing("mac"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_the_bad_key() {
        let text = "v4=10.0.2.15/24,gw4=10.0.2.2,v6=fd62:656c:6c6a::2/64,gw6=fd62:656c:6c6a::1,dns=10.0.2.2,mtu=1500,mac=02:62:6a:00:00:02";
        let setup: NetSetup = text.parse().unwrap();
        assert_eq!(setup.v4, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(setup.prefix_v6, 64);
        assert_eq!(setup.mac, [2, 0x62, 0x6a, 0, 0, 2]);
        assert_eq!(setup.to_string(), text);
        assert!(!text.contains(' '));
        let e = text.replace("/24", "/33").parse::<NetSetup>().unwrap_err();
        assert!(e.to_string().contains("v4="), "{e}");
        let e = text
            .replace(",mtu=1500", "")
            .parse::<NetSetup>()
            .unwrap_err();
        assert!(e.to_string().contains("mtu"), "{e}");
    }

    #[test]
    fn the_ca_is_appended_once() {
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let system = b"-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----";
        let once = bundle_with_ca(system, pem).unwrap();
        assert!(once.starts_with(system));
        assert_eq!(&once[system.len()..], format!("\n{pem}").as_bytes());
        // Again (a restart of a persistent sandbox): nothing to add.
        assert_eq!(bundle_with_ca(&once, pem), None);
        // Without its last newline the certificate is still recognised.
        assert_eq!(bundle_with_ca(&once, pem.trim_end()), None);
        // An empty bundle gets the certificate alone; bytes that are not UTF-8 are searched too.
        assert_eq!(bundle_with_ca(b"", pem).unwrap(), pem.as_bytes());
        let mut odd = b"\xff\xfe\n".to_vec();
        odd.extend_from_slice(pem.as_bytes());
        assert_eq!(bundle_with_ca(&odd, pem), None);
        assert!(bundle_with_ca(b"\xff\n", pem).is_some());
        assert_eq!(bundle_with_ca(system, ""), None);
    }
}
