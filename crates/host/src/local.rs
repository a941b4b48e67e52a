//! Which traffic comes from this node's pods (upstream's `--detect-local-mode`).
//!
//! Every mode asks the same question (masquerade traffic to cluster IPs from outside the pod
//! network; short-circuit pods' traffic to external IPs), each in its own kernel language:
//! this is the answer as a value, and each mode spells the match itself.

use ipnet::IpNet;
use kpr_model::text::InterfaceName;

/// How to tell traffic from this cluster's pods apart from everything else. Node-CIDR mode
/// is `ClusterCidr` with the node's pod CIDRs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalDetector {
    /// No detection: cluster-IP traffic is only masqueraded with `masquerade_all`.
    #[default]
    None,
    /// Pod traffic comes from these CIDRs; the first one of the proxier's family is used,
    /// as upstream uses one CIDR per family.
    ClusterCidr(Vec<IpNet>),
    /// Pod traffic enters through this bridge.
    BridgeInterface(InterfaceName),
    /// Pod traffic enters through interfaces whose names start with this prefix.
    InterfaceNamePrefix(InterfaceName),
}

impl LocalDetector {
    /// The CIDR a CIDR-based detector uses for `family`: the first of that family. `None`
    /// for the interface-based detectors and when detection is off for `family`.
    pub fn cidr(&self, family: kpr_model::IpFamily) -> Option<IpNet> {
        match self {
            Self::ClusterCidr(cidrs) => cidrs.iter().find(|c| family.matches(&c.addr())).copied(),
            Self::None | Self::BridgeInterface(_) | Self::InterfaceNamePrefix(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use kpr_model::IpFamily;

    use super::*;

    #[test]
    fn a_cidr_detector_uses_the_first_cidr_of_the_family() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let d = LocalDetector::ClusterCidr(vec![net("fd00::/48"), net("10.244.0.0/16"), net("10.9.0.0/16")]);
        assert_eq!(d.cidr(IpFamily::V4), Some(net("10.244.0.0/16")));
        assert_eq!(d.cidr(IpFamily::V6), Some(net("fd00::/48")));
        let only_v6 = LocalDetector::ClusterCidr(vec![net("fd00::/48")]);
        assert_eq!(only_v6.cidr(IpFamily::V4), None);
        assert_eq!(LocalDetector::None.cidr(IpFamily::V4), None);
    }
}
