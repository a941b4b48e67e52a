//! What the socket programs should do with each Service address, from the desired state:
//! pure, so the decisions are table-tested without a kernel.
//!
//! Per Service port, two endpoint sets at most:
//! - **internal**, for the cluster IP: the cluster-wide endpoints, or this node's only with
//!   `internalTrafficPolicy: Local` (topology and the terminating fallback already applied
//!   by kpr-state's `categorize`);
//! - **external**, for the NodePort on this node's addresses, external IPs and
//!   load-balancer IPs: the cluster-wide endpoints, because a local socket is a pod or the
//!   node itself, whose traffic to an external address upstream short-circuits to every
//!   endpoint whatever `externalTrafficPolicy` says.
//!
//! An address whose set is empty gets no entry: the connection goes on untranslated and
//! the nftables rules refuse (REJECT) or drop it exactly as nftables mode does. So do
//! load-balancer IPs with `loadBalancerSourceRanges` (the nftables firewall decides), SCTP
//! ports, and loopback NodePorts (nftables mode serves none).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use kpr_model::{IpFamily, ServicePort, ServicePortName};
use kpr_state::DesiredState;

use crate::maps::{FLAG_EXTERNAL, ServiceKey};

/// Which of a port's two endpoint sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    Internal,
    External,
}

/// One endpoint set of one Service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetName {
    pub port: ServicePortName,
    pub kind: SetKind,
}

/// An endpoint set and the Service addresses that use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSet {
    /// Endpoints in a stable order (sorted), one slot each.
    pub endpoints: Vec<SocketAddr>,
    /// ClientIP affinity timeout in seconds, 0 for none.
    pub affinity_seconds: u32,
    /// The Service addresses that go to this set, with their `FLAG_*`.
    pub addresses: Vec<(ServiceKey, u32)>,
}

/// Everything the programs need for one Service (all its ports): its endpoint sets.
pub type ServiceEntries = BTreeMap<SetName, EndpointSet>;

/// The entries of one Service port for `family`; `node_addresses` are this node's
/// addresses that accept NodePorts.
pub fn port_entries(
    state: &DesiredState,
    port: &ServicePort,
    node_addresses: &[IpAddr],
    family: IpFamily,
    out: &mut ServiceEntries,
) {
    let plan = state.plan(port);
    let protocol = port.name.protocol;
    let affinity_seconds = port.session_affinity_seconds.unwrap_or(0);
    let key = |ip: IpAddr, port_number: u16| {
        if family.matches(&ip) {
            ServiceKey::new(ip, port_number, protocol)
        } else {
            None
        }
    };
    let endpoints = |list: &[&kpr_model::Endpoint]| {
        let mut addrs: Vec<SocketAddr> = list.iter().map(|ep| ep.addr).collect();
        addrs.sort_unstable();
        addrs.dedup();
        addrs
    };

    let internal = if port.internal_policy_local {
        endpoints(&plan.endpoints.local)
    } else {
        endpoints(&plan.endpoints.cluster)
    };
    if !internal.is_empty()
        && let Some(cluster_ip) = key(port.cluster_ip, port.port)
    {
        out.insert(
            SetName {
                port: port.name.clone(),
                kind: SetKind::Internal,
            },
            EndpointSet {
                endpoints: internal,
                affinity_seconds,
                addresses: vec![(cluster_ip, 0)],
            },
        );
    }

    let external = endpoints(&plan.endpoints.cluster);
    if external.is_empty() {
        return;
    }
    let mut addresses: Vec<(ServiceKey, u32)> = Vec::new();
    if let Some(node_port) = port.node_port {
        for ip in node_addresses.iter().filter(|ip| !ip.is_loopback()) {
            addresses.extend(key(*ip, node_port).map(|k| (k, FLAG_EXTERNAL)));
        }
    }
    for ip in &port.external_ips {
        addresses.extend(key(*ip, port.port).map(|k| (k, FLAG_EXTERNAL)));
    }
    if port.load_balancer_source_ranges.is_empty() {
        for ip in &port.load_balancer_ips {
            addresses.extend(key(*ip, port.port).map(|k| (k, FLAG_EXTERNAL)));
        }
    }
    addresses.sort_unstable();
    addresses.dedup_by_key(|(k, _)| *k);
    if addresses.is_empty() {
        return;
    }
    out.insert(
        SetName {
            port: port.name.clone(),
            kind: SetKind::External,
        },
        EndpointSet {
            endpoints: external,
            affinity_seconds,
            addresses,
        },
    );
}

/// The entries of Service `ports` (every port of one Service).
pub fn service_entries<'a>(
    state: &DesiredState,
    ports: impl IntoIterator<Item = &'a ServicePort>,
    node_addresses: &[IpAddr],
    family: IpFamily,
) -> ServiceEntries {
    let mut out = ServiceEntries::new();
    for port in ports {
        port_entries(state, port, node_addresses, family, &mut out);
    }
    out
}
