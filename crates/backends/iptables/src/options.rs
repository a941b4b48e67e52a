//! The knobs of iptables mode, with upstream's defaults.
//!
//! Everything rule generation needs beyond the desired state lives here, so rendering stays a
//! pure function of (state, options): the same inputs always give the same bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_model::IpFamily;
use kpr_naming::InterfaceName;

use crate::nfacct::NfacctCounters;
use crate::ruleset::{Arg, RuleBuilder};

/// Upstream's `--iptables-masquerade-bit` default: mark 0x4000.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;
/// Upstream's `largeClusterEndpointsThreshold`: above this many endpoints, rule comments on
/// endpoint-level rules are dropped to keep the ruleset small.
pub const DEFAULT_LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("iptables option masqueradeBit: {0} is outside 0-31")]
    MasqueradeBit(u8),
}

/// `<prefix>+`, iptables' interface wildcard; [`InterfaceName::prefix`] left room for the '+'.
struct InterfaceWildcard<'a>(&'a InterfaceName);

impl crate::ruleset::sealed::Sealed for InterfaceWildcard<'_> {}

impl Arg for InterfaceWildcard<'_> {
    fn push_to(&self, out: &mut String) {
        out.push_str(self.0.as_str());
        out.push('+');
    }
}

/// The "comes from a local pod" match of a [`LocalDetector`], spelled in iptables.
pub trait LocalMatch {
    /// Appends the "comes from a local pod" match (negated: "does not"), or `None` when
    /// detection is off for `family`.
    fn append_match(&self, rule: RuleBuilder, family: IpFamily, negate: bool) -> Option<RuleBuilder>;

    /// Match arguments for "comes from a local pod", or `None` when detection is off.
    fn if_local(&self, family: IpFamily) -> Option<Vec<String>> {
        let rule = self.append_match(RuleBuilder::default(), family, false)?;
        Some(rule.build().args().map(str::to_string).collect())
    }

    /// Match arguments for "does not come from a local pod", or `None` when detection is off.
    fn if_not_local(&self, family: IpFamily) -> Option<Vec<String>> {
        let rule = self.append_match(RuleBuilder::default(), family, true)?;
        Some(rule.build().args().map(str::to_string).collect())
    }
}

impl LocalMatch for LocalDetector {
    fn append_match(&self, rule: RuleBuilder, family: IpFamily, negate: bool) -> Option<RuleBuilder> {
        let rule = if negate { rule.arg("!") } else { rule };
        Some(match self {
            Self::None => return None,
            Self::ClusterCidr(_) => rule.arg("-s").arg(self.cidr(family)?),
            Self::BridgeInterface(bridge) => rule.arg("-i").arg(bridge),
            Self::InterfaceNamePrefix(prefix) => rule.arg("-i").arg(InterfaceWildcard(prefix)),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptablesOptions {
    /// The address family this proxier serves (decides `iptables` vs `ip6tables` details).
    pub family: IpFamily,
    /// Bit of the packet mark that flags traffic needing SNAT (mark = 1 << bit).
    pub masquerade_bit: u8,
    /// SNAT all traffic sent to cluster IPs (upstream's `--masquerade-all`).
    pub masquerade_all: bool,
    /// Append `--random-fully` to MASQUERADE. [`crate::IptablesBackend::new`] turns it off
    /// when the iptables binary is older than 1.6.2, as upstream checks.
    pub masquerade_random_fully: bool,
    pub local_detector: LocalDetector,
    /// Accept NodePort traffic on 127.0.0.0/8 (IPv4 only; needs route_localnet=1).
    pub localhost_nodeports: bool,
    pub nodeport_addresses: NodePortAddresses,
    /// `--bind-address`, when it is a specific address: upstream's first choice for the
    /// node's primary IP (see [`IptablesOptions::primary_node_ip`]).
    pub bind_address: Option<IpAddr>,
    /// The kernel's `nf_conntrack_tcp_be_liberal` is on (or `conntrack.tcpBeLiberal` turns it
    /// on): upstream then leaves out the rule dropping ctstate INVALID packets.
    pub conntrack_tcp_be_liberal: bool,
    pub large_cluster_endpoints_threshold: usize,
    /// The nfacct counters that exist, which the INVALID drop and the localhost NodePort
    /// rules then count in (`-m nfacct`), as upstream's; see [`crate::ensure_counters`].
    pub nfacct: NfacctCounters,
}

impl Default for IptablesOptions {
    fn default() -> Self {
        Self {
            family: IpFamily::V4,
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            masquerade_all: false,
            masquerade_random_fully: true,
            local_detector: LocalDetector::None,
            localhost_nodeports: true,
            nodeport_addresses: NodePortAddresses::All,
            bind_address: None,
            conntrack_tcp_be_liberal: false,
            large_cluster_endpoints_threshold: DEFAULT_LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
            nfacct: NfacctCounters::default(),
        }
    }
}

impl IptablesOptions {
    pub fn validate(&self) -> Result<(), OptionsError> {
        if self.masquerade_bit > 31 {
            return Err(OptionsError::MasqueradeBit(self.masquerade_bit));
        }
        Ok(())
    }

    /// The mark as upstream spells it in restore input (`0x00004000` for bit 14); the
    /// kernel stores the number, so `iptables-save` shows `0x4000`.
    pub fn masquerade_mark(&self) -> String {
        format!("{:#010x}", self.masquerade_mark_value())
    }

    /// The mark's value: `1 << masquerade_bit`.
    pub fn masquerade_mark_value(&self) -> u32 {
        1u32 << self.masquerade_bit.min(31)
    }

    /// Whether NodePorts answer on 127.0.0.0/8: asked for, IPv4, and not excluded by
    /// `nodeport_addresses` (upstream turns the option off in that case).
    pub fn localhost_nodeports_enabled(&self) -> bool {
        self.localhost_nodeports
            && self.family == IpFamily::V4
            && self.nodeport_addresses.contains_loopback(self.family)
    }

    /// The loopback address of the proxier's family.
    pub fn loopback(&self) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        }
    }

    /// Upstream's "node IP" (`proxier.nodeIP`), which decides whether a load balancer's
    /// source ranges allow the node itself: `--bind-address` when it is a specific address of
    /// this family, else the Node object's first address of this family (InternalIP before
    /// ExternalIP), else loopback, as upstream falls back.
    pub fn primary_node_ip(&self, node_addresses: &[IpAddr]) -> IpAddr {
        let family = self.family;
        self.bind_address
            .filter(|ip| !ip.is_unspecified() && family.matches(ip))
            .or_else(|| node_addresses.iter().copied().find(|ip| family.matches(ip)))
            .unwrap_or_else(|| self.loopback())
    }

    /// The loopback range never reachable as a NodePort destination.
    pub fn loopback_cidr(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        }
    }
}

#[cfg(test)]
mod tests {
    use ipnet::IpNet;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn mark_is_spelled_like_upstream() {
        let mut o = IptablesOptions::default();
        assert_eq!(o.masquerade_mark(), "0x00004000");
        o.masquerade_bit = 0;
        assert_eq!(o.masquerade_mark(), "0x00000001");
        o.masquerade_bit = 31;
        assert_eq!(o.masquerade_mark(), "0x80000000");
        o.masquerade_bit = 32;
        assert_eq!(o.validate(), Err(OptionsError::MasqueradeBit(32)));
    }

    #[test]
    fn cluster_cidr_detector_uses_first_cidr_of_family() {
        let d = LocalDetector::ClusterCidr(vec![net("fd00::/48"), net("10.244.0.0/16"), net("10.9.0.0/16")]);
        assert_eq!(d.if_local(IpFamily::V4).unwrap(), ["-s", "10.244.0.0/16"]);
        assert_eq!(d.if_not_local(IpFamily::V6).unwrap(), ["!", "-s", "fd00::/48"]);
        let only_v6 = LocalDetector::ClusterCidr(vec![net("fd00::/48")]);
        assert_eq!(only_v6.if_local(IpFamily::V4), None);
        let prefix = LocalDetector::InterfaceNamePrefix(InterfaceName::prefix("veth").unwrap());
        assert_eq!(prefix.if_not_local(IpFamily::V4).unwrap(), ["!", "-i", "veth+"]);
        let bridge = LocalDetector::BridgeInterface(InterfaceName::new("cbr0").unwrap());
        assert_eq!(bridge.if_local(IpFamily::V6).unwrap(), ["-i", "cbr0"]);
    }

    #[test]
    fn primary_node_ip_prefers_bind_address_then_node_object_then_loopback() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let node = [ip("fd00::5"), ip("10.0.0.5"), ip("203.0.113.5")];
        let mut o = IptablesOptions::default();
        assert_eq!(o.primary_node_ip(&node), ip("10.0.0.5"), "first of the family");
        o.bind_address = Some(ip("0.0.0.0"));
        assert_eq!(
            o.primary_node_ip(&node),
            ip("10.0.0.5"),
            "unspecified is not a choice"
        );
        o.bind_address = Some(ip("fd00::9"));
        assert_eq!(o.primary_node_ip(&node), ip("10.0.0.5"), "other family");
        o.bind_address = Some(ip("10.0.0.9"));
        assert_eq!(o.primary_node_ip(&node), ip("10.0.0.9"));
        o.bind_address = None;
        assert_eq!(o.primary_node_ip(&[]), ip("127.0.0.1"));
        o.family = IpFamily::V6;
        assert_eq!(o.primary_node_ip(&node), ip("fd00::5"));
        assert_eq!(o.primary_node_ip(&[]), ip("::1"));
    }

    #[test]
    fn localhost_nodeports_follow_the_nodeport_addresses() {
        let mut o = IptablesOptions {
            nodeport_addresses: NodePortAddresses::Cidrs(vec![net("10.0.0.0/8"), net("fd00::/8")]),
            ..Default::default()
        };
        assert!(!o.localhost_nodeports_enabled(), "10.0.0.0/8 excludes loopback");
        o.nodeport_addresses = NodePortAddresses::Cidrs(vec![net("127.0.0.0/8")]);
        assert!(o.localhost_nodeports_enabled());
        o.family = IpFamily::V6;
        assert!(!o.localhost_nodeports_enabled(), "never on IPv6");
    }
}
