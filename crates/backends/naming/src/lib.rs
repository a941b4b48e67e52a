//! Names of the kernel objects the proxy creates, in one place.
//!
//! Chain names are an interface: upstream kube-proxy, `iptables-save` users, and kube-proxy-rs
//! taking over a node from upstream all expect `KUBE-SVC-` + the first 16 characters of
//! base32(sha256(servicePortName + protocol)), and `KUBE-SEP-` with the endpoint's `ip:port`
//! appended to the hash input. Changing a byte here orphans every chain on every node.
//!
//! [`text`] (kpr-model's, re-exported) is the other half of "what reaches the kernel": the
//! one check every free-form string (names in comments, interface names) passes before it
//! may appear in rule text.

pub use kpr_model::text;

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use data_encoding::BASE32;
use kpr_model::ServicePortName;
use sha2::{Digest, Sha256};

pub use text::{Comment, CommentBuilder, InterfaceName, SafeText, UnsafeText};

/// Longest chain name iptables accepts (XT_EXTENSION_MAXNAMELEN 29, including the NUL).
pub const CHAIN_NAME_MAX_BYTES: usize = 28;

/// A chain name that is safe to write into rule text: made here from a hash, a fixed name,
/// or checked by [`ChainName::parse`] (names read back from the kernel). Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainName(Arc<str>);

impl ChainName {
    /// One of the fixed names in [`chain`] (or another name written in the source).
    pub fn fixed(name: &'static str) -> Self {
        debug_assert!(Self::parse(name).is_ok(), "{name:?} is not a valid chain name");
        Self(Arc::from(name))
    }

    /// A name from elsewhere (e.g. `iptables-save`): ASCII letters, digits, '-', '_' and
    /// '.', not starting with '-', at most [`CHAIN_NAME_MAX_BYTES`].
    pub fn parse(name: &str) -> Result<Self, UnsafeText> {
        SafeText::new(name)?;
        if name.len() > CHAIN_NAME_MAX_BYTES {
            return Err(UnsafeText::TooLong {
                len: name.len(),
                max: CHAIN_NAME_MAX_BYTES,
            });
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if let Some((at, found)) = name.char_indices().find(|(_, c)| !allowed(*c)) {
            return Err(UnsafeText::NotAllowedIn {
                found,
                at,
                what: "a chain name",
            });
        }
        Ok(Self(Arc::from(name)))
    }

    /// `prefix` + a base32 hash: safe by construction.
    fn hashed(prefix: &str, hash: &str) -> Self {
        Self(Arc::from(format!("{prefix}{hash}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ChainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Borrow<str> for ChainName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ChainName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ChainName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ChainName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// Prefixes of per-service and per-endpoint chains (iptables mode).
pub mod prefix {
    pub const SERVICE: &str = "KUBE-SVC-";
    pub const SERVICE_LOCAL: &str = "KUBE-SVL-";
    pub const EXTERNAL: &str = "KUBE-EXT-";
    pub const FIREWALL: &str = "KUBE-FW-";
    pub const ENDPOINT: &str = "KUBE-SEP-";
    /// Upstream's pre-1.24 name for the local-traffic chain; only ever deleted.
    pub const LEGACY_LOCAL: &str = "KUBE-XLB-";
    /// Every prefix of a chain that belongs to one service or endpoint.
    pub const ALL: [&str; 6] = [SERVICE, SERVICE_LOCAL, EXTERNAL, FIREWALL, ENDPOINT, LEGACY_LOCAL];
}

/// Fixed chains of iptables mode, named as upstream names them.
pub mod chain {
    pub const SERVICES: &str = "KUBE-SERVICES";
    pub const EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
    pub const NODEPORTS: &str = "KUBE-NODEPORTS";
    pub const POSTROUTING: &str = "KUBE-POSTROUTING";
    pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
    pub const FORWARD: &str = "KUBE-FORWARD";
    pub const PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
    pub const FIREWALL: &str = "KUBE-FIREWALL";
    pub const CANARY: &str = "KUBE-PROXY-CANARY";
}

/// Chains only upstream's ipvs mode creates, named as upstream names them (it shares
/// `KUBE-SERVICES`, `KUBE-POSTROUTING`, `KUBE-MARK-MASQ`, `KUBE-FORWARD` and
/// `KUBE-PROXY-FIREWALL` with iptables mode).
pub mod ipvs_chain {
    /// nat: load-balancer IPs (Local policies return before masquerading).
    pub const LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
    /// nat: NodePorts to masquerade; filter: health-check node ports to accept.
    pub const NODE_PORT: &str = "KUBE-NODE-PORT";
    /// filter: load-balancer source ranges.
    pub const SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
    /// filter INPUT: new connections to a kube-ipvs0 address no Service port matches.
    pub const IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
    /// filter OUTPUT: the node's own traffic to load-balancer IPs whose ranges leave it out.
    pub const IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";
}

/// Chains of upstream's userspace mode (its "portals"), named as upstream names them: nat
/// chains redirecting Service traffic to the proxy's own listeners, and the filter chain
/// that lets NodePort traffic reach them.
pub mod userspace_chain {
    /// nat PREROUTING: traffic from pods (and the outside) to cluster IPs, external IPs and
    /// load-balancer ingress IPs.
    pub const PORTALS_CONTAINER: &str = "KUBE-PORTALS-CONTAINER";
    /// nat OUTPUT: the same addresses, for traffic from the node itself.
    pub const PORTALS_HOST: &str = "KUBE-PORTALS-HOST";
    /// nat PREROUTING (local destinations): NodePorts from pods and the outside.
    pub const NODEPORT_CONTAINER: &str = "KUBE-NODEPORT-CONTAINER";
    /// nat OUTPUT (local destinations): NodePorts from the node itself.
    pub const NODEPORT_HOST: &str = "KUBE-NODEPORT-HOST";
    /// filter INPUT: accepts new connections to the listeners NodePorts lead to.
    pub const NODEPORT_NON_LOCAL: &str = "KUBE-NODEPORT-NON-LOCAL";
    /// The nat chains, in the order they are written.
    pub const NAT: [&str; 4] = [PORTALS_CONTAINER, PORTALS_HOST, NODEPORT_CONTAINER, NODEPORT_HOST];
    /// The filter chains.
    pub const FILTER: [&str; 1] = [NODEPORT_NON_LOCAL];
}

/// The first 16 characters of base32(sha256(input)): 80 bits, i.e. the first 10 bytes.
pub fn hash16(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
    BASE32.encode(&digest[..10])
}

fn port_proto(name: &ServicePortName) -> String {
    format!("{name}{}", name.protocol.lower())
}

/// The chains of one service port, computed once and reused across syncs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceChains {
    /// KUBE-SVC-: spreads over cluster-wide endpoints.
    pub cluster: ChainName,
    /// KUBE-SVL-: spreads over this node's endpoints (traffic policy Local).
    pub local: ChainName,
    /// KUBE-EXT-: entry for NodePort, external IP and load-balancer traffic.
    pub external: ChainName,
    /// KUBE-FW-: loadBalancerSourceRanges filter.
    pub firewall: ChainName,
}

impl ServiceChains {
    pub fn new(name: &ServicePortName) -> Self {
        let hash = hash16(&port_proto(name));
        Self {
            cluster: ChainName::hashed(prefix::SERVICE, &hash),
            local: ChainName::hashed(prefix::SERVICE_LOCAL, &hash),
            external: ChainName::hashed(prefix::EXTERNAL, &hash),
            firewall: ChainName::hashed(prefix::FIREWALL, &hash),
        }
    }
}

/// KUBE-SEP- chain of one endpoint of one service port; `endpoint` is `ip:port`.
pub fn endpoint_chain(name: &ServicePortName, endpoint: &str) -> ChainName {
    ChainName::hashed(
        prefix::ENDPOINT,
        &hash16(&format!("{}{endpoint}", port_proto(name))),
    )
}

/// Whether a chain is a per-service or per-endpoint chain that only a kube-proxy creates.
pub fn is_service_chain(name: &str) -> bool {
    prefix::ALL.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_model::Protocol;

    fn httpbin() -> ServicePortName {
        ServicePortName::new("default", "httpbin", "http", Protocol::Tcp)
    }

    /// The worked example of seed 002: upstream's chains for default/httpbin:http.
    #[test]
    fn names_match_upstream_seed_example() {
        let chains = ServiceChains::new(&httpbin());
        assert_eq!(chains.cluster, "KUBE-SVC-FREKB6WNWYJLKTHC");
        assert_eq!(
            endpoint_chain(&httpbin(), "172.20.0.40:80"),
            "KUBE-SEP-PEA6WHECIZEOX47B"
        );
        assert_eq!(
            endpoint_chain(&httpbin(), "172.20.0.41:80"),
            "KUBE-SEP-JXNDCT5ED2555YYJ"
        );
        assert_eq!(
            endpoint_chain(&httpbin(), "172.20.1.183:80"),
            "KUBE-SEP-UHAR347MOFCEOPWZ"
        );
    }

    #[test]
    fn all_service_chains_share_the_hash() {
        let chains = ServiceChains::new(&httpbin());
        for name in [&chains.local, &chains.external, &chains.firewall] {
            assert!(name.as_str().ends_with("FREKB6WNWYJLKTHC"), "{name}");
        }
        assert!(is_service_chain(chains.firewall.as_str()));
        assert!(!is_service_chain(chain::SERVICES));
    }

    #[test]
    fn protocol_is_part_of_the_hash() {
        let udp = ServicePortName::new("default", "httpbin", "http", Protocol::Udp);
        assert_ne!(
            ServiceChains::new(&udp).cluster,
            ServiceChains::new(&httpbin()).cluster
        );
    }

    #[test]
    fn chain_names_from_elsewhere_are_checked() {
        assert_eq!(ChainName::parse("KUBE-SEP-ABC").unwrap(), "KUBE-SEP-ABC");
        assert!(ChainName::parse("KUBE-SEP-A B").is_err());
        assert!(ChainName::parse("KUBE-SEP-\nX").is_err());
        assert!(ChainName::parse(&"K".repeat(29)).is_err());
        assert!(ChainName::parse("-X").is_err());
        assert_eq!(ChainName::fixed(chain::SERVICES).as_str(), "KUBE-SERVICES");
    }
}
