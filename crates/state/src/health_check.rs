//! Which Services need a health-check server on this node, and what it must answer.
//!
//! A cloud load balancer in front of a LoadBalancer Service with `externalTrafficPolicy:
//! Local` sends traffic only to nodes whose `healthCheckNodePort` answers 200, because
//! only nodes with a local endpoint can serve it (they drop it otherwise). Upstream derives
//! both halves from the proxier's maps after every successful sync (`HealthCheckNodePorts`
//! and `LocalReadyEndpoints`); this is the same derivation as one pure function, so any mode
//! serves the same answers.
//!
//! The count is upstream's: distinct endpoint IPs on this node that are *ready*, over all of
//! the Service's ports (a pod serving 80 and 443 is one endpoint). Serving-but-terminating
//! endpoints still receive traffic as a last resort, but do not count: a node whose only
//! endpoints are shutting down must fail its health check so the load balancer drains it.

use std::collections::{BTreeMap, BTreeSet};

use kpr_model::NamespacedName;

use crate::DesiredState;

/// One Service's health check on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// `spec.healthCheckNodePort`: where load balancers probe.
    pub node_port: u16,
    /// Ready endpoints on this node (distinct IPs): 0 makes the probe fail.
    pub local_endpoints: usize,
}

/// Every health check this node should serve, by Service.
pub type HealthChecks = BTreeMap<NamespacedName, HealthCheck>;

/// The health checks `state` asks for: one per Service that has a health-check node port
/// (the model sets it only for LoadBalancer Services with `externalTrafficPolicy: Local`).
pub fn health_checks(state: &DesiredState) -> HealthChecks {
    state
        .services
        .keys()
        .filter_map(|service| Some((service.clone(), health_check(state, service)?)))
        .collect()
}

/// Brings `checks` (made from an earlier state) to `state`, looking only at the Services in
/// `changed` (every Service that may differ).
pub fn update_health_checks(
    checks: &mut HealthChecks,
    state: &DesiredState,
    changed: &BTreeSet<NamespacedName>,
) {
    for service in changed {
        match health_check(state, service) {
            Some(check) => checks.insert(service.clone(), check),
            None => checks.remove(service),
        };
    }
}

/// `service`'s health check in `state`, if it has a health-check node port.
fn health_check(state: &DesiredState, service: &NamespacedName) -> Option<HealthCheck> {
    // Every port of a Service carries the Service's one port.
    let node_port = state
        .services
        .get(service)?
        .iter()
        .find_map(|p| p.health_check_node_port)?;
    Some(HealthCheck {
        node_port,
        local_endpoints: local_ready_ips(state, service),
    })
}

/// Distinct IPs of ready endpoints on this node, over every port of `service`.
fn local_ready_ips(state: &DesiredState, service: &NamespacedName) -> usize {
    let Some(ports) = state.endpoints.get(service) else {
        return 0;
    };
    ports
        .values()
        .flat_map(|endpoints| endpoints.iter())
        .filter(|ep| ep.is_local && ep.ready)
        .map(|ep| ep.addr.ip())
        .collect::<BTreeSet<_>>()
        .len()
}

#[cfg(test)]
mod tests {
    use kpr_model::IpFamily;
    use kpr_world::{World, ep};
    use serde_json::{Value, json};

    use super::*;

    /// A LoadBalancer Service with `policy` and health-check port 32000 on 10.96.0.1:80/443.
    fn load_balancer(policy: &str) -> Value {
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.1", "externalTrafficPolicy": policy,
               "healthCheckNodePort": 32000,
               "ports": [{"name": "http", "port": 80, "nodePort": 30080},
                         {"name": "https", "port": 443, "nodePort": 30443}],
               "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}})
    }

    fn both_ports() -> Value {
        json!([{"name": "http", "port": 8080}, {"name": "https", "port": 8443}])
    }

    fn web() -> NamespacedName {
        NamespacedName::new("default", "web")
    }

    /// The world's state as this crate's type: kpr-world links its own copy of kpr-state
    /// (a dev-dependency cycle), but the maps inside are kpr-tracking's and kpr-model's.
    fn state(world: &mut World) -> DesiredState {
        let theirs = world.state();
        DesiredState {
            services: theirs.services,
            endpoints: theirs.endpoints,
            node: theirs.node,
            ..DesiredState::default()
        }
    }

    #[test]
    fn local_policy_counts_ready_local_endpoint_ips_once_across_ports() {
        let mut world = World::new();
        world.service("web", load_balancer("Local")).slice(
            "web",
            both_ports(),
            vec![ep("10.244.1.5 local"), ep("10.244.1.6 local"), ep("10.244.2.7")],
        );
        let checks = health_checks(&state(&mut world));
        assert_eq!(
            checks,
            HealthChecks::from([(
                web(),
                HealthCheck {
                    node_port: 32000,
                    local_endpoints: 2
                }
            )]),
            "two local pods, each on both ports; the remote one does not count"
        );
    }

    #[test]
    fn cluster_policy_needs_no_health_check() {
        let mut world = World::new();
        let mut spec = load_balancer("Cluster");
        spec.as_object_mut().unwrap().remove("healthCheckNodePort");
        world
            .service("web", spec)
            .slice("web", both_ports(), vec![ep("10.244.1.5 local")]);
        assert!(health_checks(&state(&mut world)).is_empty());
    }

    /// `externalTrafficPolicy: Local` on a NodePort Service: no load balancer probes it,
    /// and the API server allocates no health-check port.
    #[test]
    fn local_policy_without_a_health_check_port_needs_none() {
        let mut world = World::new();
        world.service(
            "np",
            json!({"type": "NodePort", "clusterIP": "10.96.0.2", "externalTrafficPolicy": "Local",
                   "ports": [{"port": 80, "nodePort": 30081}]}),
        );
        assert!(health_checks(&state(&mut world)).is_empty());
    }

    #[test]
    fn only_ready_local_endpoints_count() {
        let mut world = World::new();
        world.service("web", load_balancer("Local")).slice(
            "web",
            both_ports(),
            vec![
                ep("10.244.1.5 serving terminating local"),
                ep("10.244.1.6 terminating local"),
                ep("10.244.1.7 notready local"),
                ep("10.244.2.8"),
            ],
        );
        let checks = health_checks(&state(&mut world));
        assert_eq!(
            checks[&web()].local_endpoints,
            0,
            "terminating, not serving and remote endpoints must fail the probe so the load balancer drains this node"
        );
    }

    #[test]
    fn a_service_without_endpoints_still_gets_its_port_with_zero() {
        let mut world = World::new();
        world.service("web", load_balancer("Local"));
        assert_eq!(
            health_checks(&state(&mut world))[&web()],
            HealthCheck {
                node_port: 32000,
                local_endpoints: 0
            }
        );
    }

    #[test]
    fn deleting_the_service_removes_its_health_check() {
        let mut world = World::new();
        world
            .service("web", load_balancer("Local"))
            .slice("web", both_ports(), vec![ep("10.244.1.5 local")]);
        assert_eq!(health_checks(&state(&mut world)).len(), 1);
        world.delete_service("web");
        assert!(health_checks(&state(&mut world)).is_empty());
    }

    /// Each family's proxier counts its own family's endpoints, as upstream's do.
    #[test]
    fn an_ipv6_proxier_counts_ipv6_endpoints() {
        let mut world = World::with_family(IpFamily::V6);
        world
            .service(
                "web",
                json!({"type": "LoadBalancer", "clusterIP": "fd00:96::1", "ipFamilies": ["IPv6"],
                       "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
                       "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
            )
            .slice(
                "web",
                json!([{"name": "http", "port": 8080}]),
                vec![ep("fd00:244::5 local")],
            );
        assert_eq!(health_checks(&state(&mut world))[&web()].local_endpoints, 1);
    }

    /// Updating in place looks at the changed Services only and gives what a whole
    /// derivation gives: a Service whose last local pod left drops to 0, one that lost its
    /// health-check port leaves, one not named is not looked at.
    #[test]
    fn an_update_of_the_changed_services_matches_the_whole_derivation() {
        let mut world = World::new();
        world
            .service("web", load_balancer("Local"))
            .slice("web", both_ports(), vec![ep("10.244.1.5 local")]);
        world
            .service("api", load_balancer("Local"))
            .slice("api", both_ports(), vec![ep("10.244.1.9 local")]);
        let mut checks = health_checks(&state(&mut world));
        let api = NamespacedName::new("default", "api");
        world.slice("web", both_ports(), vec![ep("10.244.2.7")]);
        world.service("api", load_balancer("Cluster"));
        let now = state(&mut world);
        let before = checks.clone();
        update_health_checks(&mut checks, &now, &BTreeSet::from([web()]));
        assert_eq!(checks[&web()].local_endpoints, 0);
        assert_eq!(checks[&api], before[&api], "api was not named, so not looked at");
        update_health_checks(&mut checks, &now, &BTreeSet::from([api.clone()]));
        assert!(!checks.contains_key(&api));
        assert_eq!(checks, health_checks(&now));
    }
}
