//! Which of this node's addresses accept NodePort traffic (upstream's
//! `--nodeport-addresses`), for every mode and for the Service health-check servers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kpr_model::IpFamily;

use crate::addresses::{AddressError, LocalAddresses};

/// Upstream's `--nodeport-addresses`: which local addresses accept NodePort traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address (upstream's default, or a list containing 0.0.0.0/0 / ::/0).
    #[default]
    All,
    /// Only the node addresses inside these CIDRs (CIDRs of the other family are ignored).
    Cidrs(Vec<IpNet>),
}

/// Where NodePorts answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodePortTargets {
    /// Any local destination address.
    AllLocal,
    /// Only these node addresses.
    Ips(Vec<IpAddr>),
}

impl NodePortAddresses {
    /// The CIDRs of `family`, or `None` when every address is meant.
    fn cidrs(&self, family: IpFamily) -> Option<Vec<&IpNet>> {
        let Self::Cidrs(all) = self else {
            return None;
        };
        let mine: Vec<_> = all.iter().filter(|c| family.matches(&c.addr())).collect();
        // Like upstream: no CIDR of this family, or a catch-all one, means "all".
        if mine.is_empty() || mine.iter().any(|c| c.prefix_len() == 0) {
            return None;
        }
        Some(mine)
    }

    /// Upstream's `ContainsExplicitLoopback` (1.37): a CIDR of `family` whose network address
    /// is a loopback address was given (`localhost`, `127.0.0.0/8`, even `127.0.0.2/32`); a
    /// catch-all range does not count. nftables mode serves localhost NodePorts only then.
    pub fn contains_explicit_loopback(&self, family: IpFamily) -> bool {
        let Self::Cidrs(all) = self else {
            return false;
        };
        all.iter()
            .any(|c| family.matches(&c.addr()) && c.prefix_len() > 0 && c.network().is_loopback())
    }

    /// Whether NodePorts answer on `family`'s loopback address.
    pub fn contains_loopback(&self, family: IpFamily) -> bool {
        let loopback = match family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        self.cidrs(family)
            .is_none_or(|cidrs| cidrs.iter().any(|c| c.contains(&loopback)))
    }

    /// Whether [`Self::targets`] needs this host's addresses (it does when only some of them
    /// accept NodePorts).
    pub fn needs_local_addresses(&self, family: IpFamily) -> bool {
        self.cidrs(family).is_some()
    }

    /// This host's addresses of `family`, read from `host` when [`Self::targets`] needs
    /// them (else none: every local address is meant).
    pub fn local_addresses(
        &self,
        family: IpFamily,
        host: &dyn LocalAddresses,
    ) -> Result<Vec<IpAddr>, AddressError> {
        if self.needs_local_addresses(family) {
            host.addresses(family)
        } else {
            Ok(Vec::new())
        }
    }

    /// The node addresses that accept NodePorts, given this node's addresses.
    pub fn targets(&self, family: IpFamily, node_ips: &[IpAddr]) -> NodePortTargets {
        match self.cidrs(family) {
            None => NodePortTargets::AllLocal,
            Some(cidrs) => NodePortTargets::Ips(
                node_ips
                    .iter()
                    .filter(|ip| cidrs.iter().any(|c| c.contains(*ip)))
                    .copied()
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_select_node_ips_of_their_family() {
        let ips: Vec<IpAddr> = ["10.0.0.5", "192.168.1.5", "127.0.0.1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let cidrs = NodePortAddresses::Cidrs(vec![net("10.0.0.0/8"), net("fd00::/8")]);
        assert!(cidrs.needs_local_addresses(IpFamily::V4));
        assert!(!NodePortAddresses::All.needs_local_addresses(IpFamily::V4));
        assert_eq!(
            cidrs.targets(IpFamily::V4, &ips),
            NodePortTargets::Ips(vec![ips[0]])
        );
        let catch_all = NodePortAddresses::Cidrs(vec![net("0.0.0.0/0")]);
        assert_eq!(catch_all.targets(IpFamily::V4, &ips), NodePortTargets::AllLocal);
        let other_family = NodePortAddresses::Cidrs(vec![net("fd00::/8")]);
        assert_eq!(
            other_family.targets(IpFamily::V4, &ips),
            NodePortTargets::AllLocal
        );
    }

    #[test]
    fn explicit_loopback_is_a_loopback_network_of_the_family_not_a_catch_all() {
        let of = |cidrs: &[&str]| NodePortAddresses::Cidrs(cidrs.iter().map(|c| net(c)).collect());
        let localhost = of(&["127.0.0.0/8", "::1/128"]);
        assert!(localhost.contains_explicit_loopback(IpFamily::V4));
        assert!(localhost.contains_explicit_loopback(IpFamily::V6));
        assert!(
            of(&["127.0.0.2/32"]).contains_explicit_loopback(IpFamily::V4),
            "upstream's quirk"
        );
        assert!(!of(&["0.0.0.0/0", "::/0"]).contains_explicit_loopback(IpFamily::V4));
        assert!(!of(&["192.168.0.10/32", "127.0.0.0/8"]).contains_explicit_loopback(IpFamily::V6));
        assert!(!NodePortAddresses::All.contains_explicit_loopback(IpFamily::V4));
    }

    #[test]
    fn loopback_is_in_unless_the_cidrs_leave_it_out() {
        assert!(NodePortAddresses::All.contains_loopback(IpFamily::V4));
        assert!(!NodePortAddresses::Cidrs(vec![net("10.0.0.0/8")]).contains_loopback(IpFamily::V4));
        assert!(NodePortAddresses::Cidrs(vec![net("127.0.0.0/8")]).contains_loopback(IpFamily::V4));
        assert!(NodePortAddresses::Cidrs(vec![net("::1/128")]).contains_loopback(IpFamily::V6));
    }
}
