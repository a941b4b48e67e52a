//! Names of the kernel objects the proxy creates, in one place.
//!
//! Chain names are an interface: upstream kube-proxy, `iptables-save` users, and kube-proxy-rs
//! taking over a node from upstream all expect `KUBE-SVC-` + the first 16 characters of
//! base32(sha256(servicePortName + protocol)), and `KUBE-SEP-` with the endpoint's `ip:port`
//! appended to the hash input. Changing a byte here orphans every chain on every node.

use data_encoding::BASE32;
use kpr_model::ServicePortName;
use sha2::{Digest, Sha256};

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
    pub cluster: String,
    /// KUBE-SVL-: spreads over this node's endpoints (traffic policy Local).
    pub local: String,
    /// KUBE-EXT-: entry for NodePort, external IP and load-balancer traffic.
    pub external: String,
    /// KUBE-FW-: loadBalancerSourceRanges filter.
    pub firewall: String,
}

impl ServiceChains {
    pub fn new(name: &ServicePortName) -> Self {
        let hash = hash16(&port_proto(name));
        Self {
            cluster: format!("{}{hash}", prefix::SERVICE),
            local: format!("{}{hash}", prefix::SERVICE_LOCAL),
            external: format!("{}{hash}", prefix::EXTERNAL),
            firewall: format!("{}{hash}", prefix::FIREWALL),
        }
    }
}

/// KUBE-SEP- chain of one endpoint of one service port; `endpoint` is `ip:port`.
pub fn endpoint_chain(name: &ServicePortName, endpoint: &str) -> String {
    format!(
        "{}{}",
        prefix::ENDPOINT,
        hash16(&format!("{}{endpoint}", port_proto(name)))
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
            assert!(name.ends_with("FREKB6WNWYJLKTHC"), "{name}");
        }
        assert!(is_service_chain(&chains.firewall));
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
}
