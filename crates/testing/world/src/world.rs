//! Services and slices fed through the real trackers, taken the way the sync loop takes them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_model::{
    Converted, IgnoredValue, IpFamily, NamespacedName, NodeView, ServiceCidrView, Sizes,
    convert_service_cidr, node_view,
};
use kpr_state::{DesiredState, PendingSync};
use kpr_tracking::{EndpointsTracker, ServiceTracker};
use serde_json::Value;

use crate::churn::Change;
use crate::objects::address_type;
use crate::{NAMESPACE, ZONE, node_object, service_object, slice_object};

/// Services and slices as the API would show them, fed through the trackers of one IP
/// family on one node. Each [`World::pending`] is what the next sync would hand a backend:
/// only what changed since the previous one is marked changed.
pub struct World {
    family: IpFamily,
    services: ServiceTracker,
    endpoints: EndpointsTracker,
    node: Arc<NodeView>,
    /// ServiceCIDRs by name, as the sync loop's intake keeps them; their union of this
    /// family goes into every [`World::pending`].
    service_cidrs: BTreeMap<String, ServiceCidrView>,
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    /// IPv4, on the proxy's node ([`crate::NODE`]) in zone [`ZONE`].
    pub fn new() -> Self {
        Self::with_family(IpFamily::V4)
    }

    /// `family`, on the proxy's node ([`crate::NODE`]) in zone [`ZONE`].
    pub fn with_family(family: IpFamily) -> Self {
        Self::on_node(family, &node_object(Some(ZONE)))
    }

    /// `family`, on `node` (its name decides which endpoints are local).
    pub fn on_node(family: IpFamily, node: &Node) -> Self {
        let view =
            node_view(node).unwrap_or_else(|rejection| panic!("the test's Node is rejected: {rejection}"));
        Self {
            family,
            services: ServiceTracker::new(family),
            endpoints: EndpointsTracker::new(family, &view.name),
            node: Arc::new(view),
            service_cidrs: BTreeMap::new(),
        }
    }

    /// Adds or replaces Service `default/<name>` (see [`service_object`] for `spec`).
    pub fn service(&mut self, name: &str, spec: Value) -> &mut Self {
        self.apply_service(&service_object(name, spec));
        self
    }

    /// Sets the one slice of `service` (`default/<service>-1`, of this world's family):
    /// `ports` like `[{"name": "http", "port": 8080}]`, endpoints from [`crate::ep`].
    pub fn slice(&mut self, service: &str, ports: Value, endpoints: Vec<Value>) -> &mut Self {
        let address_type = address_type(self.family);
        let slice = slice_object(&slice_name(service), service, address_type, ports, endpoints);
        self.apply_slice(&slice);
        self
    }

    /// Deletes Service `default/<name>` and its slice.
    pub fn delete_service(&mut self, name: &str) -> &mut Self {
        self.services
            .update(NamespacedName::new(NAMESPACE, name), None)
            .expect("a deletion is never rejected");
        self.endpoints
            .update(NamespacedName::new(NAMESPACE, &slice_name(name)), None)
            .expect("a deletion is never rejected");
        self
    }

    /// Records any Service, in any namespace; returns the list entries the conversion
    /// dropped. A rejected Service panics: the test wrote something the proxy refuses.
    pub fn apply_service(&mut self, service: &Service) -> Vec<IgnoredValue> {
        let id = object_id(&service.metadata.namespace, &service.metadata.name);
        self.services
            .update(id, Some(service))
            .unwrap_or_else(|rejection| panic!("the test's Service is rejected: {rejection}"))
    }

    /// Records any EndpointSlice, in any namespace; returns the entries the conversion
    /// dropped. A rejected slice panics.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> Vec<IgnoredValue> {
        let id = object_id(&slice.metadata.namespace, &slice.metadata.name);
        self.endpoints
            .update(id, Some(slice))
            .unwrap_or_else(|rejection| panic!("the test's EndpointSlice is rejected: {rejection}"))
    }

    /// Records one change of a [`crate::churn`] workload as a source would report it. Unlike
    /// [`World::apply_service`], a rejected object is fine here (it counts as absent, as in
    /// the sync loop): the workload rejects some on purpose. [`Change::Sync`] does nothing;
    /// the caller syncs.
    pub fn apply(&mut self, change: &Change) {
        let id = |name: &str| NamespacedName::new(NAMESPACE, name);
        match change {
            Change::Service(name, object) => {
                let _ = self.services.update(id(name), object.as_deref());
            }
            Change::Slice(name, object) => {
                let _ = self.endpoints.update(id(name), object.as_deref());
            }
            Change::Node(node) => {
                let view = node_view(node)
                    .unwrap_or_else(|rejection| panic!("the test's Node is rejected: {rejection}"));
                self.node = Arc::new(view);
            }
            Change::ServiceCidr(name, object) => match object.as_deref().map(convert_service_cidr) {
                Some(Ok(Converted { view, .. })) => {
                    self.service_cidrs.insert(name.clone(), view);
                }
                _ => {
                    self.service_cidrs.remove(name);
                }
            },
            Change::Sync => {}
        }
    }

    /// The trackers' sizes and the ServiceCIDRs held (kpr_model::Sizes).
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .nested("services", self.services.footprint())
            .nested("endpoints", self.endpoints.footprint())
            .with("service_cidrs", self.service_cidrs.len())
    }

    /// Everything the next sync hands to a backend, taken from the trackers the way the
    /// sync loop (crates/sync) takes it.
    pub fn pending(&mut self) -> PendingSync {
        let mut cidrs: Vec<_> = self
            .service_cidrs
            .values()
            .flat_map(|view| view.of_family(self.family))
            .collect();
        cidrs.sort();
        cidrs.dedup();
        let _ = self.endpoints.take_trigger_times();
        PendingSync::new(self.services.take(), self.endpoints.take(), self.node.clone())
            .with_service_cidrs(Arc::new(cidrs))
    }

    /// The desired state after the pending changes, and the services they touched.
    pub fn take(&mut self) -> (DesiredState, BTreeSet<NamespacedName>) {
        let pending = self.pending();
        (pending.state, pending.changed)
    }

    /// The desired state after the pending changes.
    pub fn state(&mut self) -> DesiredState {
        self.take().0
    }
}

fn slice_name(service: &str) -> String {
    format!("{service}-1")
}

/// `namespace/name` as the API server defaults it (no namespace is `default`).
fn object_id(namespace: &Option<String>, name: &Option<String>) -> NamespacedName {
    let namespace = namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .unwrap_or(NAMESPACE);
    NamespacedName::new(namespace, name.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{NODE, NODE_IP, ep};

    fn web() -> Value {
        json!({"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})
    }

    #[test]
    fn objects_reach_the_state_through_the_trackers() {
        let mut world = World::new();
        world.service("web", web()).slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            vec![ep("10.244.1.6"), ep("10.244.1.5 local")],
        );
        let (state, changed) = world.take();
        assert_eq!(changed, BTreeSet::from([NamespacedName::new("default", "web")]));
        let ports = state.ports();
        let endpoints: Vec<(String, bool)> = state
            .endpoints(ports[0])
            .iter()
            .map(|e| (e.addr.to_string(), e.is_local))
            .collect();
        // The tracker's order (by address), not the slice's.
        assert_eq!(
            endpoints,
            [
                ("10.244.1.5:8080".to_string(), true),
                ("10.244.1.6:8080".to_string(), false)
            ]
        );
        assert_eq!(state.node.name, NODE);
        assert_eq!(
            state.node.addresses,
            [NODE_IP.parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(state.node.zone(), Some(ZONE));

        assert!(world.take().1.is_empty(), "nothing changed since");
        world.delete_service("web");
        let (state, changed) = world.take();
        assert!(state.ports().is_empty());
        assert_eq!(changed.len(), 1);
    }

    #[test]
    fn an_ipv6_world_uses_ipv6_slices_and_services() {
        let mut world = World::with_family(IpFamily::V6);
        world
            .service(
                "dns",
                json!({"clusterIP": "fd00:96::53", "ipFamilies": ["IPv6"],
                       "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            )
            .slice(
                "dns",
                json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
                vec![ep("fd00:244::10")],
            );
        let state = world.state();
        let ports = state.ports();
        assert_eq!(ports[0].cluster_ip.to_string(), "fd00:96::53");
        assert_eq!(
            state.endpoints(ports[0])[0].addr.to_string(),
            "[fd00:244::10]:5353"
        );
    }

    #[test]
    fn dropped_entries_are_returned() {
        let mut world = World::new();
        let mut spec = web();
        spec["externalIPs"] = json!(["192.0.2.1", "192.0.2.x"]);
        let ignored = world.apply_service(&service_object("web", spec));
        assert_eq!(ignored.len(), 1, "{ignored:?}");
        assert_eq!(ignored[0].field, "spec.externalIPs[1]");
    }

    #[test]
    #[should_panic(expected = "the test's Service is rejected")]
    fn a_rejected_service_fails_the_test() {
        World::new().service(
            "web",
            json!({"clusterIP": "10.96.0.999", "ports": [{"port": 80}]}),
        );
    }
}
