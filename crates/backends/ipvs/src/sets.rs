//! The ipvs mode's seventeen sets: what each holds, its type, and its name per family
//! (upstream's names; IPv6 sets are `KUBE-6-…`, cut to ipset's 31 bytes).

use crate::ipset::{Family, SetKind, SetSpec};

/// One of the ipvs mode's sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetId {
    /// Local endpoints as `ip,proto:port,ip`: hairpin traffic (a pod reaching itself through a
    /// Service) is masqueraded.
    LoopBack,
    ClusterIp,
    ExternalIp,
    ExternalIpLocal,
    LoadBalancer,
    LoadBalancerLocal,
    LoadBalancerFirewall,
    LoadBalancerSourceIp,
    LoadBalancerSourceCidr,
    NodePortTcp,
    NodePortLocalTcp,
    NodePortUdp,
    NodePortLocalUdp,
    NodePortSctp,
    NodePortLocalSctp,
    HealthCheckNodePort,
    /// Every address bound to kube-ipvs0: new connections to one that no Service port
    /// matches are rejected, so host ports are not reachable through Service addresses.
    IpvsIps,
}

impl SetId {
    pub const ALL: [SetId; 17] = [
        Self::LoopBack,
        Self::ClusterIp,
        Self::ExternalIp,
        Self::ExternalIpLocal,
        Self::LoadBalancer,
        Self::LoadBalancerLocal,
        Self::LoadBalancerFirewall,
        Self::LoadBalancerSourceIp,
        Self::LoadBalancerSourceCidr,
        Self::NodePortTcp,
        Self::NodePortLocalTcp,
        Self::NodePortUdp,
        Self::NodePortLocalUdp,
        Self::NodePortSctp,
        Self::NodePortLocalSctp,
        Self::HealthCheckNodePort,
        Self::IpvsIps,
    ];

    /// Upstream's names: (IPv4, IPv6).
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::LoopBack => ("KUBE-LOOP-BACK", "KUBE-6-LOOP-BACK"),
            Self::ClusterIp => ("KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP"),
            Self::ExternalIp => ("KUBE-EXTERNAL-IP", "KUBE-6-EXTERNAL-IP"),
            Self::ExternalIpLocal => ("KUBE-EXTERNAL-IP-LOCAL", "KUBE-6-EXTERNAL-IP-LOCAL"),
            Self::LoadBalancer => ("KUBE-LOAD-BALANCER", "KUBE-6-LOAD-BALANCER"),
            Self::LoadBalancerLocal => ("KUBE-LOAD-BALANCER-LOCAL", "KUBE-6-LOAD-BALANCER-LOCAL"),
            Self::LoadBalancerFirewall => ("KUBE-LOAD-BALANCER-FW", "KUBE-6-LOAD-BALANCER-FW"),
            Self::LoadBalancerSourceIp => ("KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-6-LOAD-BALANCER-SOURCE-IP"),
            Self::LoadBalancerSourceCidr => (
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                "KUBE-6-LOAD-BALANCER-SOURCE-CID",
            ),
            Self::NodePortTcp => ("KUBE-NODE-PORT-TCP", "KUBE-6-NODE-PORT-TCP"),
            Self::NodePortLocalTcp => ("KUBE-NODE-PORT-LOCAL-TCP", "KUBE-6-NODE-PORT-LOCAL-TCP"),
            Self::NodePortUdp => ("KUBE-NODE-PORT-UDP", "KUBE-6-NODE-PORT-UDP"),
            Self::NodePortLocalUdp => ("KUBE-NODE-PORT-LOCAL-UDP", "KUBE-6-NODE-PORT-LOCAL-UDP"),
            Self::NodePortSctp => ("KUBE-NODE-PORT-SCTP-HASH", "KUBE-6-NODE-PORT-SCTP-HASH"),
            Self::NodePortLocalSctp => (
                "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
                "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS",
            ),
            Self::HealthCheckNodePort => ("KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-6-HEALTH-CHECK-NODE-PORT"),
            Self::IpvsIps => ("KUBE-IPVS-IPS", "KUBE-6-IPVS-IPS"),
        }
    }

    pub fn name(self, family: Family) -> &'static str {
        match family {
            Family::V4 => self.names().0,
            Family::V6 => self.names().1,
        }
    }

    pub fn kind(self) -> SetKind {
        match self {
            Self::LoopBack | Self::LoadBalancerSourceIp => SetKind::IpPortIp,
            Self::LoadBalancerSourceCidr => SetKind::IpPortNet,
            Self::NodePortTcp
            | Self::NodePortLocalTcp
            | Self::NodePortUdp
            | Self::NodePortLocalUdp
            | Self::HealthCheckNodePort => SetKind::Port,
            Self::IpvsIps => SetKind::Ip,
            _ => SetKind::IpPort,
        }
    }

    pub fn spec(self, family: Family) -> SetSpec {
        SetSpec {
            name: self.name(family),
            kind: self.kind(),
            family,
        }
    }

    /// Upstream's description, used as the `-m comment` of the rules matching the set.
    pub fn comment(self) -> &'static str {
        match self {
            Self::LoopBack => "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
            Self::ClusterIp => "Kubernetes service cluster ip + port for masquerade purpose",
            Self::ExternalIp => "Kubernetes service external ip + port for masquerade and filter purpose",
            Self::ExternalIpLocal => "Kubernetes service external ip + port with externalTrafficPolicy=local",
            Self::LoadBalancer => "Kubernetes service lb portal",
            Self::LoadBalancerLocal => {
                "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
            }
            Self::LoadBalancerFirewall => {
                "Kubernetes service load balancer ip + port for load balancer with sourceRange"
            }
            Self::LoadBalancerSourceIp => {
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
            }
            Self::LoadBalancerSourceCidr => {
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
            }
            Self::NodePortTcp => "Kubernetes nodeport TCP port for masquerade purpose",
            Self::NodePortLocalTcp => "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
            Self::NodePortUdp => "Kubernetes nodeport UDP port for masquerade purpose",
            Self::NodePortLocalUdp => "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
            Self::NodePortSctp => {
                "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"
            }
            Self::NodePortLocalSctp => {
                "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"
            }
            Self::HealthCheckNodePort => "Kubernetes health check node port",
            Self::IpvsIps => "Addresses on the ipvs interface",
        }
    }
}

/// Every set name of the mode, both families: what its leftovers are.
pub fn all_names() -> Vec<&'static str> {
    [Family::V4, Family::V6]
        .into_iter()
        .flat_map(|family| SetId::ALL.into_iter().map(move |id| id.name(family)))
        .collect()
}

/// Whether `name` is one of the mode's sets (either family).
pub fn is_mode_set(name: &str) -> bool {
    SetId::ALL
        .into_iter()
        .any(|id| id.name(Family::V4) == name || id.name(Family::V6) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_fits_ipset_and_is_the_modes_own() {
        let names = all_names();
        assert_eq!(names.len(), 2 * SetId::ALL.len());
        for name in &names {
            assert!(name.len() <= 31, "{name}");
            assert!(is_mode_set(name), "{name}");
        }
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        // 32 characters with the prefix: upstream cuts the last one.
        assert!(names.contains(&"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"));
        assert!(!is_mode_set("KUBE-MY-OWN-SET"));
        assert!(!is_mode_set("kube-cluster-ip"));
    }
}
