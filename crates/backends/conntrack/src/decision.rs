//! Which UDP conntrack entries no serving endpoint stands behind: the decision of upstream's
//! `CleanStaleEntries` (pkg/proxy/conntrack), pure, from the desired state alone.
//!
//! An entry whose original destination is a UDP service frontend (cluster IP, external IP
//! or load-balancer IP with the service port; or any address with a UDP NodePort) must have
//! been DNATed to one of that port's serving endpoints (`ip:targetPort`, seen as the reply's
//! source). Anything else is stale: DNATed to an endpoint that left (or moved to another
//! target port), or never DNATed at all because it was created before the rules existed.
//! UDP clients keep their 5-tuple, so such an entry would keep their datagrams going
//! nowhere until it times out, which traffic to it never lets happen.
//!
//! Deliberately not considered, as upstream: traffic policies, topology and readiness.
//! A flow to an endpoint that is still serving (terminating ones included) stays where it
//! is, as a TCP connection would. Entries to any other destination are never touched.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;

use kpr_model::{NamespacedName, Protocol, ServicePort};
use kpr_state::DesiredState;

use crate::entry::UdpEntry;
use crate::table::Scope;

/// The UDP frontends of one desired state, each with the endpoints allowed behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frontends {
    /// `service IP:port` -> serving `endpoint IP:port`.
    by_address: HashMap<SocketAddr, HashSet<SocketAddr>>,
    /// NodePort -> serving `endpoint IP:port`.
    by_node_port: HashMap<u16, HashSet<SocketAddr>>,
}

impl Frontends {
    /// Every UDP service port of `state` (only the proxier's family is in it). A port
    /// without serving endpoints is a frontend with an empty set: every entry to it is
    /// stale, so a flow to an endpoint that left is cut even when none is left (upstream
    /// once skipped such ports and fixed it: the REJECT rule cannot reach a flow that
    /// conntrack already DNATs).
    pub fn of(state: &DesiredState) -> Self {
        let mut frontends = Self::default();
        let udp_ports = state
            .services
            .values()
            .flat_map(|ports| ports.iter())
            .filter(|port| port.name.protocol == Protocol::Udp);
        for port in udp_ports {
            let serving: HashSet<SocketAddr> = state
                .endpoints(port)
                .iter()
                .filter(|endpoint| endpoint.serving)
                .map(|endpoint| endpoint.addr)
                .collect();
            frontends.add(port, &serving);
        }
        frontends
    }

    /// Two ports can claim one frontend (the same external IP and port on two Services):
    /// an entry to it is kept if either port stands behind it, never deleted by mistake.
    fn add(&mut self, port: &ServicePort, serving: &HashSet<SocketAddr>) {
        for address in addresses(port) {
            self.by_address
                .entry(address)
                .or_default()
                .extend(serving.iter().copied());
        }
        if let Some(node_port) = port.node_port {
            self.by_node_port
                .entry(node_port)
                .or_default()
                .extend(serving.iter().copied());
        }
    }

    /// Whether the reconcile has anything to look at: without a UDP service there is no
    /// need to list the conntrack table at all.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty() && self.by_node_port.is_empty()
    }

    /// Whether `entry` goes to a frontend of these services but not to one of its serving
    /// endpoints. An entry to a service address is judged by that address alone; only
    /// entries to other addresses (the node's) are judged by their NodePort.
    pub fn is_stale(&self, entry: &UdpEntry) -> bool {
        let serving = self
            .by_address
            .get(&entry.original.dst)
            .or_else(|| self.by_node_port.get(&entry.original.dst.port()));
        serving.is_some_and(|serving| !serving.contains(&entry.reply.src))
    }

    /// The entries of `entries` to delete, in the order given.
    pub fn stale(&self, entries: &[UdpEntry]) -> Vec<UdpEntry> {
        entries
            .iter()
            .filter(|entry| self.is_stale(entry))
            .copied()
            .collect()
    }
}

/// The service addresses of `port`: cluster IP, external IPs, load-balancer IPs.
fn addresses(port: &ServicePort) -> impl Iterator<Item = SocketAddr> + '_ {
    std::iter::once(port.cluster_ip)
        .chain(port.external_ips.iter().copied())
        .chain(port.load_balancer_ips.iter().copied())
        .map(|ip| SocketAddr::new(ip, port.port))
}

/// Where entries of the UDP ports of `services` (those a sync changed) can be: each
/// service address with its port, and each NodePort. Services that no longer exist
/// have no frontend left, so nothing of theirs is ever touched (as upstream).
pub fn scopes_of(state: &DesiredState, services: &BTreeSet<NamespacedName>) -> BTreeSet<Scope> {
    let udp_ports = services
        .iter()
        .filter_map(|service| state.services.get(service))
        .flat_map(|ports| ports.iter())
        .filter(|port| port.name.protocol == Protocol::Udp);
    let mut scopes = BTreeSet::new();
    for port in udp_ports {
        scopes.extend(addresses(port).map(Scope::To));
        scopes.extend(port.node_port.map(Scope::ToPort));
    }
    scopes
}
