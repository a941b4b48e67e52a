//! The node's name-independent facts: its IPs and primary IP family, as upstream's
//! `detectNodeIPs` decides them, and its pod CIDRs.
//!
//! Precedence: a specific `--bind-address` is the primary IP (its family the primary
//! family); else the Node object's addresses (its first one, then the first of the other
//! family, as `GetNodeHostIPs` picks them); else loopback, with upstream's log line. The
//! primary family decides what a single-stack proxy serves; on Linux the IPs themselves only
//! decide whether load-balancer source ranges admit the node, and what `nodePortAddresses:
//! primary` means. The facts are fixed at start-up, as upstream fixes them: the families to
//! run, the detectors and the NodePort addresses are built from them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kpr_model::{IpFamily, NodeView};

/// Upstream's `GetNodeHostIPs`: the Node's first address (InternalIP before ExternalIP, as
/// [`NodeView::addresses`] lists them), and the first one of the other family, if any.
pub fn node_host_ips(node: &NodeView) -> Vec<IpAddr> {
    let Some(&first) = node.addresses.first() else {
        return Vec::new();
    };
    let other = node
        .addresses
        .iter()
        .copied()
        .find(|ip| IpFamily::of(ip) != IpFamily::of(&first));
    std::iter::once(first).chain(other).collect()
}

/// What the proxy knows about its node once start-up has waited for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub ips: NodeIps,
    /// The Node's `spec.podCIDRs` (empty unless the Node had them when start-up ended).
    pub pod_cidrs: Vec<IpNet>,
}

/// The node IP of each family and which family is primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeIps {
    pub primary_family: IpFamily,
    v4: IpAddr,
    v6: IpAddr,
}

impl NodeIps {
    /// Upstream's `detectNodeIPs`: `raw` are the Node's host IPs ([`node_host_ips`]),
    /// `bind_address` the `--bind-address` setting (validated as an IP address; `0.0.0.0`
    /// and `::` mean none).
    pub fn detect(raw: &[IpAddr], bind_address: &str) -> Self {
        let mut ips = Self {
            primary_family: IpFamily::V4,
            v4: IpAddr::V4(Ipv4Addr::LOCALHOST),
            v6: IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        if let Some(&first) = raw.first() {
            ips.primary_family = IpFamily::of(&first);
            ips.set(first);
            // GetNodeHostIPs returns at most one address per family.
            if let Some(&second) = raw.get(1) {
                ips.set(second);
            }
        }
        let bind = bind_address
            .trim()
            .parse::<IpAddr>()
            .ok()
            .map(|ip| ip.to_canonical());
        if let Some(bind) = bind.filter(|ip| !ip.is_unspecified()) {
            ips.primary_family = IpFamily::of(&bind);
            ips.set(bind);
        }
        if ips.primary().is_loopback() {
            tracing::info!(
                "Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag"
            );
        }
        ips
    }

    fn set(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(_) => self.v4 = ip,
            IpAddr::V6(_) => self.v6 = ip,
        }
    }

    /// The node IP of `family` (loopback when unknown).
    pub fn of(&self, family: IpFamily) -> IpAddr {
        match family {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
        }
    }

    pub fn primary(&self) -> IpAddr {
        self.of(self.primary_family)
    }

    /// What upstream turns `nodePortAddresses: ["primary"]` into: each family's node IP as a
    /// single-address CIDR, leaving out families whose IP is unknown (loopback). Empty when
    /// no IP is known, which means every address, as an empty list does upstream.
    pub fn primary_cidrs(&self) -> Vec<IpNet> {
        [self.v4, self.v6]
            .into_iter()
            .filter(|ip| !ip.is_loopback())
            .map(IpNet::from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn node(addresses: &[&str]) -> NodeView {
        NodeView {
            addresses: addresses.iter().map(|a| ip(a)).collect(),
            ..NodeView::default()
        }
    }

    #[test]
    fn host_ips_are_the_first_address_and_the_first_of_the_other_family() {
        let dual = node(&["10.0.0.5", "10.0.0.6", "203.0.113.5", "fd00::5", "fd00::6"]);
        assert_eq!(node_host_ips(&dual), [ip("10.0.0.5"), ip("fd00::5")]);
        let v6_first = node(&["fd00::5", "10.0.0.5"]);
        assert_eq!(node_host_ips(&v6_first), [ip("fd00::5"), ip("10.0.0.5")]);
        assert_eq!(node_host_ips(&node(&["10.0.0.5", "10.0.0.6"])), [ip("10.0.0.5")]);
        assert!(node_host_ips(&node(&[])).is_empty());
    }

    #[test]
    fn the_node_objects_first_address_decides_the_primary_family() {
        let v4 = NodeIps::detect(&[ip("10.0.0.5"), ip("fd00::5")], "0.0.0.0");
        assert_eq!(v4.primary_family, IpFamily::V4);
        assert_eq!(
            (v4.of(IpFamily::V4), v4.of(IpFamily::V6)),
            (ip("10.0.0.5"), ip("fd00::5"))
        );

        let v6 = NodeIps::detect(&[ip("fd00::5"), ip("10.0.0.5")], "::");
        assert_eq!(v6.primary_family, IpFamily::V6);
        assert_eq!(v6.primary(), ip("fd00::5"));
        assert_eq!(v6.of(IpFamily::V4), ip("10.0.0.5"));
    }

    #[test]
    fn a_specific_bind_address_overrides_the_primary_ip_and_family() {
        let ips = NodeIps::detect(&[ip("10.0.0.5"), ip("fd00::5")], "fd00::9");
        assert_eq!(ips.primary_family, IpFamily::V6);
        assert_eq!(ips.of(IpFamily::V6), ip("fd00::9"));
        assert_eq!(
            ips.of(IpFamily::V4),
            ip("10.0.0.5"),
            "the other family keeps the Node's"
        );

        let alone = NodeIps::detect(&[], "192.168.0.10");
        assert_eq!(alone.primary(), ip("192.168.0.10"));
        assert_eq!(alone.of(IpFamily::V6), ip("::1"));
    }

    #[test]
    fn nothing_known_is_ipv4_loopback() {
        let ips = NodeIps::detect(&[], "0.0.0.0");
        assert_eq!(ips.primary_family, IpFamily::V4);
        assert_eq!(ips.primary(), ip("127.0.0.1"));
        assert_eq!(ips.of(IpFamily::V6), ip("::1"));
        assert!(ips.primary_cidrs().is_empty(), "no CIDR: every address");
    }

    #[test]
    fn primary_node_port_addresses_are_the_known_node_ips() {
        let dual = NodeIps::detect(&[ip("10.0.0.5"), ip("fd00::5")], "0.0.0.0");
        let cidrs: Vec<String> = dual.primary_cidrs().iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.0.0.5/32", "fd00::5/128"]);
        let v4_only = NodeIps::detect(&[ip("10.0.0.5")], "0.0.0.0");
        let cidrs: Vec<String> = v4_only.primary_cidrs().iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.0.0.5/32"]);
    }
}
