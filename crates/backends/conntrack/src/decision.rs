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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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

    /// Frontends no UDP port has any more (a deleted Service's, a removed port's, an old
    /// cluster IP or NodePort): nothing stands behind them, so every entry to them is
    /// stale. A frontend some port still has is left to that port.
    pub fn retire(&mut self, scopes: &BTreeSet<Scope>) {
        for scope in scopes {
            match *scope {
                Scope::To(address) => {
                    self.by_address.entry(address).or_default();
                }
                Scope::ToPort(port) => {
                    self.by_node_port.entry(port).or_default();
                }
                Scope::All => {}
            }
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
/// service address with its port, and each NodePort. Services that no longer exist have no
/// frontend in `state`: what they had is [`Frontends::retire`]d by the reconciler, which
/// remembers it (`udp_scopes_by_service`).
pub fn scopes_of(state: &DesiredState, services: &BTreeSet<NamespacedName>) -> BTreeSet<Scope> {
    services
        .iter()
        .flat_map(|service| udp_scopes_of(state, service))
        .collect()
}

/// Every Service's UDP frontends in `state`, as [`Scope`]s: each service address with its
/// port, and each NodePort. Services without a UDP port are left out.
pub fn udp_scopes_by_service(state: &DesiredState) -> BTreeMap<NamespacedName, BTreeSet<Scope>> {
    state
        .services
        .keys()
        .map(|service| (service.clone(), udp_scopes_of(state, service)))
        .filter(|(_, scopes)| !scopes.is_empty())
        .collect()
}

/// One Service's UDP frontends in `state`, as [`udp_scopes_by_service`] has them (empty
/// when it has no UDP port, or is gone).
pub fn udp_scopes_of(state: &DesiredState, service: &NamespacedName) -> BTreeSet<Scope> {
    let ports = state
        .services
        .get(service)
        .into_iter()
        .flat_map(|ports| ports.iter());
    ports
        .filter(|port| port.name.protocol == Protocol::Udp)
        .flat_map(|port| {
            addresses(port)
                .map(Scope::To)
                .chain(port.node_port.map(Scope::ToPort))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use kpr_model::IpFamily;
    use kpr_world::{World, eps};
    use serde_json::{Value, json};

    use super::*;
    use crate::entry::FlowTuple;

    /// The slice ports of the tests' services: `dns` on target port 5353.
    fn dns_port(protocol: &str) -> Value {
        json!([{"name": "dns", "port": 5353, "protocol": protocol}])
    }

    /// Every frontend of [`dns`]: cluster IP, external IP, load-balancer IP, and the
    /// NodePort on one of the node's addresses.
    const DNS_FRONTENDS: [&str; 4] = [
        "10.96.0.53:53",
        "192.0.2.9:53",
        "203.0.113.7:53",
        "192.168.77.1:30053",
    ];

    fn dns(protocol: &str) -> Value {
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.53", "externalIPs": ["192.0.2.9"],
               "ports": [{"name": "dns", "port": 53, "protocol": protocol, "targetPort": 5353, "nodePort": 30053}],
               "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}})
    }

    /// A world with the UDP [`dns`] Service and these endpoints (see [`kpr_world::ep`]).
    fn dns_with(endpoints: &[&str]) -> World {
        let mut w = World::new();
        w.service("dns", dns("UDP"))
            .slice("dns", dns_port("UDP"), eps(endpoints));
        w
    }

    fn entry(client: &str, to: &str, reply_from: &str) -> UdpEntry {
        let client: SocketAddr = client.parse().unwrap();
        let reply_from: SocketAddr = reply_from.parse().unwrap();
        UdpEntry {
            original: FlowTuple {
                src: client,
                dst: to.parse().unwrap(),
            },
            reply: FlowTuple {
                src: reply_from,
                dst: client,
            },
            id: None,
            zone: None,
        }
    }

    fn frontends(world: &mut World) -> Frontends {
        Frontends::of(&world.state())
    }

    #[test]
    fn flows_to_serving_endpoints_stay_terminating_ones_included() {
        let mut w = dns_with(&["10.244.1.10", "10.244.1.11 serving terminating"]);
        let f = frontends(&mut w);
        for to in DNS_FRONTENDS {
            for endpoint in ["10.244.1.10:5353", "10.244.1.11:5353"] {
                let e = entry("192.168.77.2:40000", to, endpoint);
                assert!(!f.is_stale(&e), "{e} must stay");
            }
        }
    }

    #[test]
    fn flows_to_endpoints_that_left_or_stopped_serving_are_stale() {
        let mut w = dns_with(&["10.244.1.10", "10.244.1.12 notready"]);
        let f = frontends(&mut w);
        for to in DNS_FRONTENDS {
            for reply_from in [
                "10.244.1.12:5353", // not serving
                "10.244.1.99:5353", // gone
                "10.244.1.10:6000", // the target port moved
                to,                 // never DNATed: created before the rules existed
            ] {
                let e = entry("192.168.77.2:40000", to, reply_from);
                assert!(f.is_stale(&e), "{e} must go");
            }
        }
    }

    #[test]
    fn other_destinations_are_never_touched() {
        let mut w = dns_with(&["10.244.1.10"]);
        w.service(
            "web",
            json!({"clusterIP": "10.96.0.80", "ports": [{"name": "dns", "port": 53, "protocol": "TCP"}]}),
        )
        .slice("web", dns_port("TCP"), eps(&["10.244.1.20"]));
        let f = frontends(&mut w);
        for (to, reply_from) in [
            ("10.96.0.53:54", "10.244.1.99:5353"),    // the VIP, another port
            ("10.96.0.80:53", "10.244.1.99:5353"),    // a TCP service's address
            ("8.8.8.8:53", "8.8.8.8:53"),             // the outside world
            ("10.244.1.10:5353", "10.244.1.10:5353"), // a pod, directly
        ] {
            let e = entry("10.244.1.30:40000", to, reply_from);
            assert!(!f.is_stale(&e), "{e} is none of the reconcile's business");
        }
    }

    #[test]
    fn a_port_without_serving_endpoints_keeps_no_flow() {
        let mut w = dns_with(&["10.244.1.10 notready"]);
        let f = frontends(&mut w);
        assert!(f.is_stale(&entry("192.168.77.2:40000", "10.96.0.53:53", "10.244.1.10:5353")));
        assert!(f.is_stale(&entry(
            "192.168.77.2:40000",
            "192.168.77.1:30053",
            "10.244.1.10:5353"
        )));
    }

    #[test]
    fn tcp_only_clusters_have_nothing_to_reconcile() {
        let mut w = World::new();
        w.service(
            "web",
            json!({"clusterIP": "10.96.0.80", "ports": [{"name": "dns", "port": 80, "protocol": "TCP"}]}),
        )
        .slice("web", dns_port("TCP"), eps(&["10.244.1.20"]));
        assert!(frontends(&mut w).is_empty());
    }

    #[test]
    fn ipv6_flows_are_judged_the_same_way() {
        let mut w = World::with_family(IpFamily::V6);
        w.service("dns", json!({"clusterIP": "fd00:96::53", "ipFamilies": ["IPv6"],
                                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}))
            .slice("dns", dns_port("UDP"), eps(&["fd00:244::10", "fd00:244::11 serving terminating"]));
        let f = frontends(&mut w);
        let client = "[fd00:77::2]:40000";
        assert!(!f.is_stale(&entry(client, "[fd00:96::53]:53", "[fd00:244::10]:5353")));
        assert!(!f.is_stale(&entry(client, "[fd00:96::53]:53", "[fd00:244::11]:5353")));
        assert!(f.is_stale(&entry(client, "[fd00:96::53]:53", "[fd00:244::99]:5353")));
        assert!(!f.is_stale(&entry(client, "[fd00:96::54]:53", "[fd00:244::99]:5353")));
    }

    #[test]
    fn a_frontend_claimed_twice_keeps_flows_to_either_ports_endpoints() {
        let mut w = World::new();
        for (name, vip, pod) in [
            ("a", "10.96.0.1", "10.244.1.10"),
            ("b", "10.96.0.2", "10.244.1.11"),
        ] {
            w.service(
                name,
                json!({"clusterIP": vip, "externalIPs": ["192.0.2.9"],
                                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            )
            .slice(name, dns_port("UDP"), eps(&[pod]));
        }
        let f = frontends(&mut w);
        assert!(!f.is_stale(&entry("192.168.77.2:1", "192.0.2.9:53", "10.244.1.10:5353")));
        assert!(!f.is_stale(&entry("192.168.77.2:1", "192.0.2.9:53", "10.244.1.11:5353")));
        assert!(f.is_stale(&entry("192.168.77.2:1", "10.96.0.1:53", "10.244.1.11:5353")));
    }

    #[test]
    fn stale_keeps_the_order_and_drops_the_rest() {
        let mut w = dns_with(&["10.244.1.10"]);
        let f = frontends(&mut w);
        let entries = [
            entry("192.168.77.2:3", "10.96.0.53:53", "10.244.1.99:5353"),
            entry("192.168.77.2:2", "10.96.0.53:53", "10.244.1.10:5353"),
            entry("192.168.77.2:1", "192.168.77.1:30053", "192.168.77.1:30053"),
        ];
        assert_eq!(f.stale(&entries), [entries[0], entries[2]]);
    }

    #[test]
    fn changed_udp_services_give_their_frontends_as_scopes() {
        let mut w = dns_with(&["10.244.1.10"]);
        w.service(
            "web",
            json!({"clusterIP": "10.96.0.80", "ports": [{"name": "dns", "port": 80, "protocol": "TCP"}]}),
        );
        let pending = w.pending();
        let changed = BTreeSet::from([
            NamespacedName::new("default", "dns"),
            NamespacedName::new("default", "web"),
            NamespacedName::new("default", "deleted-meanwhile"),
        ]);
        let scopes: Vec<Scope> = scopes_of(&pending.state, &changed).into_iter().collect();
        let to = |s: &str| Scope::To(s.parse().unwrap());
        assert_eq!(
            scopes,
            [
                to("10.96.0.53:53"),
                to("192.0.2.9:53"),
                to("203.0.113.7:53"),
                Scope::ToPort(30053)
            ]
        );
    }
}
