//! Which endpoints serve which traffic: upstream's `CategorizeEndpoints`, as a pure function.
//!
//! Rules, in order: ready endpoints are used; if there are none, serving-and-terminating ones
//! (so connections drain instead of failing during a rollout); never non-serving ones.
//! Cluster traffic may be narrowed by topology hints (same node, then same zone) when every
//! ready endpoint carries hints and at least one hint names this node or zone. Local traffic
//! uses only endpoints on this node, with the same ready-then-terminating fallback.

use kpr_model::{Endpoint, NodeView, ServicePort};

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Categorized<'a> {
    /// Endpoints for traffic policy Cluster.
    pub cluster: Vec<&'a Endpoint>,
    /// Endpoints for traffic policy Local (this node only).
    pub local: Vec<&'a Endpoint>,
    /// The union of the two: every endpoint some rule will send traffic to.
    pub reachable: Vec<&'a Endpoint>,
    /// Whether any usable endpoint exists anywhere in the cluster.
    pub has_any: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    Everywhere,
    SameNode,
    SameZone,
}

pub fn categorize<'a>(port: &ServicePort, endpoints: &'a [Endpoint], node: &NodeView) -> Categorized<'a> {
    let mut out = Categorized::default();
    if port.uses_cluster_endpoints() {
        // A node without the zone label is in zone "", as upstream reads the label map.
        let zone = node.zone().unwrap_or("");
        let topology = topology(endpoints, &node.name, zone);
        out.cluster = endpoints
            .iter()
            .filter(|ep| ep.ready && available_for(ep, topology, &node.name, zone))
            .collect();
        // Falling back to terminating endpoints ignores topology: it is a last resort to
        // keep connections working, not a routing preference.
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|ep| ep.serving && ep.terminating)
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !port.uses_local_endpoints() {
        out.reachable = out.cluster.clone();
        return out;
    }
    let usable = |ep: &&Endpoint| ep.ready || (ep.serving && ep.terminating);
    out.has_any |= endpoints.iter().any(|ep| usable(&ep));
    let local_ready = endpoints.iter().any(|ep| ep.is_local && ep.ready);
    out.local = if local_ready {
        endpoints.iter().filter(|ep| ep.is_local && ep.ready).collect()
    } else {
        endpoints
            .iter()
            .filter(|ep| ep.is_local && ep.serving && ep.terminating)
            .collect()
    };
    if !port.uses_cluster_endpoints() {
        out.reachable = out.local.clone();
        return out;
    }
    out.reachable = out.cluster.clone();
    for ep in &out.local {
        if !out.reachable.iter().any(|r| std::ptr::eq(*r, *ep)) {
            out.reachable.push(ep);
        }
    }
    out
}

/// Decides whether topology hints narrow cluster traffic on this node.
fn topology(endpoints: &[Endpoint], node: &str, zone: &str) -> Topology {
    let ready: Vec<_> = endpoints.iter().filter(|ep| ep.ready).collect();
    if ready.is_empty() {
        return Topology::Everywhere;
    }
    let all_node_hints = ready.iter().all(|ep| !ep.hints.nodes().is_empty());
    if all_node_hints
        && ready
            .iter()
            .any(|ep| ep.hints.nodes().iter().any(|n| &**n == node))
    {
        return Topology::SameNode;
    }
    let all_zone_hints = ready.iter().all(|ep| !ep.hints.zones().is_empty());
    if all_zone_hints
        && ready
            .iter()
            .any(|ep| ep.hints.zones().iter().any(|z| &**z == zone))
    {
        return Topology::SameZone;
    }
    Topology::Everywhere
}

fn available_for(ep: &Endpoint, topology: Topology, node: &str, zone: &str) -> bool {
    match topology {
        Topology::Everywhere => true,
        Topology::SameNode => ep.hints.nodes().iter().any(|n| &**n == node),
        Topology::SameZone => ep.hints.zones().iter().any(|z| &**z == zone),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    // Endpoints from kpr-world's shorthand, converted as a slice would be; the node is the
    // proxy's own (kpr_world::NODE).
    pub(crate) use kpr_world::{endpoint as ep, node_view as node};

    /// Port `p` (80, NodePort 30080) of Service `default/s` on 10.0.0.1, with `extra`
    /// merged into its spec, as kpr-model converts it.
    pub(crate) fn port(extra: serde_json::Value) -> ServicePort {
        let mut spec = serde_json::json!({"clusterIP": "10.0.0.1", "ports": [{"name": "p", "port": 80, "nodePort": 30080}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        kpr_world::service_port("s", spec)
    }

    fn ips(eps: &[&Endpoint]) -> Vec<String> {
        eps.iter().map(|e| e.addr.ip().to_string()).collect()
    }

    #[test]
    fn ready_endpoints_only_when_any_are_ready() {
        let eps = [
            ep("10.0.0.1 ready"),
            ep("10.0.0.2 serving terminating"),
            ep("10.0.0.3 notready"),
        ];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(None));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        assert!(c.has_any);
        assert!(c.local.is_empty());
    }

    #[test]
    fn falls_back_to_serving_terminating_never_to_non_serving() {
        let eps = [ep("10.0.0.2 serving terminating"), ep("10.0.0.3 terminating")];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(None));
        assert_eq!(ips(&c.cluster), ["10.0.0.2"]);
        let none = [ep("10.0.0.3 terminating")];
        let c = categorize(&port(serde_json::json!({})), &none, &node(None));
        assert!(c.cluster.is_empty() && !c.has_any);
    }

    #[test]
    fn zone_hints_narrow_cluster_endpoints() {
        let eps = [
            ep("10.0.0.1 ready hint-zone=z1"),
            ep("10.0.0.2 ready hint-zone=z2"),
        ];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z1")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        // No hint for our zone: use all.
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z3")));
        assert_eq!(c.cluster.len(), 2);
        // One endpoint without hints: hints are ignored.
        let partial = [ep("10.0.0.1 ready hint-zone=z1"), ep("10.0.0.2 ready")];
        let c = categorize(&port(serde_json::json!({})), &partial, &node(Some("z1")));
        assert_eq!(c.cluster.len(), 2);
    }

    /// Upstream reads the zone from the label map, so a node without the label is in zone
    /// "" and an endpoint hinted for zone "" is its zone's.
    #[test]
    fn a_node_without_zone_label_is_in_the_empty_zone() {
        let eps = [ep("10.0.0.1 ready hint-zone="), ep("10.0.0.2 ready hint-zone=z2")];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(None));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
    }

    /// Node hints that all exist but none names this node: fall back to zone hints.
    #[test]
    fn node_hints_for_other_nodes_fall_back_to_zone_hints() {
        let eps = [
            ep("10.0.0.1 ready hint-node=node-b hint-zone=z1"),
            ep("10.0.0.2 ready hint-node=node-c hint-zone=z2"),
        ];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z1")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        // And no zone hint for our zone either: every ready endpoint.
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z3")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
    }

    /// Only ready endpoints decide whether hints are complete: a terminating endpoint without
    /// hints does not turn topology off.
    #[test]
    fn endpoints_that_are_not_ready_do_not_disable_hints() {
        let eps = [
            ep("10.0.0.1 ready hint-zone=z1"),
            ep("10.0.0.2 ready hint-zone=z2"),
            ep("10.0.0.3 serving terminating"),
        ];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z1")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
    }

    /// Without any ready endpoint, the terminating fallback takes every serving-terminating
    /// endpoint, whatever its hints.
    #[test]
    fn terminating_fallback_ignores_hints() {
        let eps = [
            ep("10.0.0.1 serving terminating hint-zone=z2"),
            ep("10.0.0.2 serving terminating hint-zone=z1"),
        ];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z1")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
    }

    /// Cluster and Local fall back independently: remote ready endpoints for cluster traffic,
    /// the local terminating one for local traffic, and both are reachable.
    #[test]
    fn cluster_and_local_fall_back_independently() {
        let p = port(serde_json::json!({"type": "NodePort", "externalTrafficPolicy": "Local"}));
        let eps = [ep("10.0.0.1 ready"), ep("10.0.0.2 serving terminating local")];
        let c = categorize(&p, &eps, &node(None));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        assert_eq!(ips(&c.local), ["10.0.0.2"]);
        assert_eq!(ips(&c.reachable), ["10.0.0.1", "10.0.0.2"]);
        assert!(c.has_any);
    }

    /// Topology narrows cluster traffic; a local endpoint outside the chosen zone is still
    /// reachable through the local policy.
    #[test]
    fn local_endpoints_outside_the_hinted_zone_stay_reachable() {
        let p = port(serde_json::json!({"type": "NodePort", "externalTrafficPolicy": "Local"}));
        let eps = [
            ep("10.0.0.1 ready hint-zone=z1"),
            ep("10.0.0.2 ready local hint-zone=z2"),
        ];
        let c = categorize(&p, &eps, &node(Some("z1")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
        assert_eq!(ips(&c.local), ["10.0.0.2"]);
        assert_eq!(ips(&c.reachable), ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn node_hints_win_over_zone_hints() {
        let eps = [
            ep("10.0.0.1 ready hint-node=node-a hint-zone=z1"),
            ep("10.0.0.2 ready hint-node=node-b hint-zone=z1"),
        ];
        let c = categorize(&port(serde_json::json!({})), &eps, &node(Some("z1")));
        assert_eq!(ips(&c.cluster), ["10.0.0.1"]);
    }

    #[test]
    fn external_policy_local_uses_local_endpoints_and_keeps_cluster_for_internal() {
        let p = port(serde_json::json!({"type": "NodePort", "externalTrafficPolicy": "Local"}));
        let eps = [ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")];
        let c = categorize(&p, &eps, &node(None));
        assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(ips(&c.local), ["10.0.0.1"]);
        assert_eq!(ips(&c.reachable), ["10.0.0.1", "10.0.0.2"]);
    }

    /// Both policies Local: internal traffic uses local endpoints only, but pod and host
    /// traffic to the NodePort is short-circuited to every endpoint (upstream's
    /// `UsesClusterEndpoints`), so the cluster set is still computed.
    #[test]
    fn both_policies_local_still_categorize_cluster_endpoints() {
        let p = port(
            serde_json::json!({"type": "NodePort", "internalTrafficPolicy": "Local", "externalTrafficPolicy": "Local"}),
        );
        let eps = [ep("10.0.0.1 ready local"), ep("10.0.0.2 ready")];
        let c = categorize(&p, &eps, &node(None));
        assert_eq!(ips(&c.cluster), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(ips(&c.local), ["10.0.0.1"]);
        assert_eq!(ips(&c.reachable), ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn internal_policy_local_only_uses_local() {
        let p = port(serde_json::json!({"internalTrafficPolicy": "Local"}));
        let eps = [ep("10.0.0.1 ready"), ep("10.0.0.2 serving terminating local")];
        let c = categorize(&p, &eps, &node(None));
        assert!(c.cluster.is_empty());
        assert_eq!(ips(&c.local), ["10.0.0.2"]);
        assert_eq!(ips(&c.reachable), ["10.0.0.2"]);
        assert!(c.has_any);
    }
}
