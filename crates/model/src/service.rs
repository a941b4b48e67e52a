//! A Service, seen as the list of its ports for one IP family.
//!
//! Mirrors upstream's `newBaseServiceInfo`: the cluster IP of the proxier's family, the
//! external IPs / load-balancer IPs / source ranges of that family, affinity, and the two
//! traffic policies reduced to booleans. Addresses are read as upstream reads them
//! (`ParseIPSloppy`: `172.30.0.041` is 172.30.0.41).
//!
//! What decides which rules exist (identity, cluster IP, ports, policies, affinity) must be
//! right, or the whole Service is rejected, as upstream skips such a Service. A malformed
//! entry of one of the address lists (`spec.externalIPs`, `status.loadBalancer.ingress`,
//! `spec.loadBalancerSourceRanges`) only drops that entry, as upstream does, and is
//! reported as an [`IgnoredValue`](crate::IgnoredValue) next to the view. So is an
//! external IP the API server refuses (loopback, link-local, unspecified: see
//! [`crate::syntax::endpoint_ip`]).
//!
//! An empty string in a field the API server defaults (`type`, `sessionAffinity`,
//! `externalTrafficPolicy`, a port's `protocol`) means that default, as the API server reads
//! it, not an invalid value.
//!
//! Names are checked with the API server's rules even for API objects: they end up in rule
//! comments and in the strings hashed into chain names, where `a/b` + `c` and `a` + `b/c`
//! would collide.
//!
//! The types here are what rule generation reads; [`convert`] turns an API object into
//! them and decides what rejects the whole Service, and [`fields`] reads the Service-wide
//! fields every port shares, where a bad list entry is only dropped.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::ident::ServicePortName;

mod convert;
mod fields;

pub(crate) use convert::object_id;
pub use convert::service_view;
pub use fields::DEFAULT_AFFINITY_TIMEOUT_SECONDS;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// One port of a Service, for one IP family: everything rule generation needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub service_type: ServiceType,
    pub cluster_ip: IpAddr,
    pub port: u16,
    /// Only for NodePort and LoadBalancer services that have one allocated.
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of any Service type (as upstream), except
    /// ingresses whose `ipMode` is not `VIP`.
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// ClientIP affinity timeout in seconds; `None` means no affinity.
    pub session_affinity_seconds: Option<u32>,
    /// `externalTrafficPolicy: Local` on an externally reachable service.
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// Only for LoadBalancer services with `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
}

impl ServicePort {
    /// Reachable from outside the cluster through a NodePort, an external IP or a load balancer.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Whether some traffic to this port is spread over endpoints on every node: internal
    /// traffic with policy Cluster, and any externally reachable port, because even with
    /// `externalTrafficPolicy: Local` traffic from pods and from the node itself to an
    /// external address is short-circuited to the cluster-wide endpoints (upstream's
    /// `UsesClusterEndpoints`).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether some traffic to this port goes only to endpoints on this node.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }
}

/// Why a valid Service gets no rules from this proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    Headless,
    ExternalName,
    /// No cluster IP at all (empty or absent): upstream's `ShouldSkipService` skips it too.
    NoClusterIp,
    /// The Service has no cluster IP of this proxier's family (e.g. IPv6-only on an IPv4 proxier).
    OtherFamily,
}

/// The outcome of converting a Service for one IP family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceView {
    Proxied(Vec<ServicePort>),
    Skipped(SkipReason),
}

#[cfg(test)]
mod tests;
