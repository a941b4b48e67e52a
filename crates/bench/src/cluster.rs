//! A synthetic cluster fed through the real trackers.
//!
//! The benchmark must render exactly what the product would hand its backend: the same
//! API-object conversion, slice merging and endpoint order. So the cluster is made of
//! k8s-openapi `Service` / `EndpointSlice` objects pushed through `ServiceTracker` and
//! `EndpointsTracker`, and the desired state comes out of their `take()`, as in kpr-sync.

use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kpr_model::{IpFamily, NamespacedName, NodeView, Rejection, SERVICE_NAME_LABEL, node_view};
use kpr_state::PendingSync;
use kpr_tracking::{EndpointsTracker, ServiceTracker};

/// The node the proxy runs on.
pub const NODE_NAME: &str = "bench-node-0";
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 10);
/// Pod addresses (endpoints) are taken from here; also the `--cluster-cidr`.
pub const CLUSTER_CIDR: &str = "10.64.0.0/10";
const POD_BASE: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 0);
const POD_ADDRESSES: usize = 1 << 22;
/// The second quarter of the pod range (10.80.0.0/12) holds the endpoints of Services
/// created after the start (the soak's turnover), so they never meet the addresses endpoint
/// changes move to; it stays below 10.96.0.0, where cluster IPs start.
const EXTRA_POD_OFFSET: usize = POD_ADDRESSES / 4;
const EXTRA_POD_END: usize = POD_ADDRESSES / 2;
/// Cluster IPs come from the usual service range.
const SERVICE_BASE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 0);
const SERVICE_ADDRESSES: usize = 1 << 20;
/// Endpoints are spread round-robin over this many nodes; node 0 is this one, so one
/// endpoint in eight is local.
pub const NODES: usize = 8;
pub const NAMESPACE: &str = "bench";
const PORT_NAME: &str = "http";
const SERVICE_PORT: i32 = 80;
const TARGET_PORT: i32 = 8080;

/// How big the synthetic cluster is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
}

impl Shape {
    /// Whether the address ranges hold this many services and endpoints (plus the one
    /// endpoint the partial-sync change adds).
    pub fn fits(&self) -> bool {
        self.fits_with_changes(1)
    }

    /// Whether they also hold the new addresses of `changes` endpoint changes (one each).
    pub fn fits_with_changes(&self, changes: usize) -> bool {
        self.services < SERVICE_ADDRESSES
            && self
                .services
                .checked_mul(self.endpoints)
                .and_then(|total| total.checked_add(changes))
                .is_some_and(|total| total < POD_ADDRESSES)
    }
}

impl Shape {
    /// Whether `changes` endpoint changes and `extra` Services created later (see
    /// [`extra_service`]) fit without any address being used twice.
    pub fn fits_soak(&self, changes: usize, extra: usize) -> bool {
        let moved = self
            .services
            .checked_mul(self.endpoints)
            .and_then(|total| total.checked_add(changes));
        moved.is_some_and(|total| total < EXTRA_POD_OFFSET)
            && extra
                .checked_mul(self.endpoints)
                .is_some_and(|total| total < EXTRA_POD_END - EXTRA_POD_OFFSET)
            && self
                .services
                .checked_add(extra)
                .is_some_and(|total| total < SERVICE_ADDRESSES)
    }
}

/// What one `take()` of both trackers hands to a backend (the product's own type).
pub type Snapshot = PendingSync;

/// The trackers holding the synthetic cluster.
pub struct SyntheticCluster {
    shape: Shape,
    services: ServiceTracker,
    endpoints: EndpointsTracker,
    node: Arc<NodeView>,
}

impl SyntheticCluster {
    /// Feeds `shape.services` Services and one EndpointSlice each into fresh trackers.
    pub fn new(shape: Shape) -> Result<Self, Rejection> {
        let mut cluster = Self {
            shape,
            services: ServiceTracker::new(IpFamily::V4),
            endpoints: EndpointsTracker::new(IpFamily::V4, NODE_NAME),
            node: Arc::new(node_view(&this_node())?),
        };
        for index in 0..shape.services {
            let id = service_id(index);
            cluster.services.update(id.clone(), Some(&service(index)))?;
            let addresses: Vec<Ipv4Addr> = (0..shape.endpoints)
                .map(|e| pod_ip(index * shape.endpoints + e))
                .collect();
            cluster.set_endpoints(index, &addresses)?;
        }
        Ok(cluster)
    }

    /// Takes the pending changes, as one sync of the product would.
    pub fn take(&mut self) -> Snapshot {
        PendingSync::new(self.services.take(), self.endpoints.take(), self.node.clone())
    }

    /// A rolling update of one pod of the first service: its first endpoint gets an address
    /// no other endpoint uses. This is the typical small change a partial sync handles.
    pub fn replace_one_endpoint(&mut self) -> Result<(), Rejection> {
        let per_service = self.shape.endpoints;
        let mut addresses: Vec<Ipv4Addr> = (0..per_service).map(pod_ip).collect();
        if let Some(first) = addresses.first_mut() {
            *first = pod_ip(self.shape.services * per_service);
        }
        self.set_endpoints(0, &addresses)
    }

    /// Endpoint change number `generation` (from 1): the first endpoint of service
    /// `generation % services` moves to an address no other endpoint uses, so every change
    /// is a real one.
    pub fn replace_endpoint(&mut self, generation: usize) -> Result<(), Rejection> {
        let index = generation % self.shape.services.max(1);
        self.set_endpoints(index, &replaced_addresses(self.shape, index, generation))
    }

    /// A new Service (number `n` from 0) with its endpoints, past the shape's services.
    pub fn add_service(&mut self, n: usize) -> Result<(), Rejection> {
        let index = self.shape.services + n;
        self.services.update(service_id(index), Some(&service(index)))?;
        // Past the addresses replace_endpoint uses (at most one per service).
        let first = (self.shape.services + n + 1) * self.shape.endpoints + 2 * self.shape.services;
        let addresses: Vec<Ipv4Addr> = (0..self.shape.endpoints).map(|e| pod_ip(first + e)).collect();
        self.set_endpoints(index, &addresses)
    }

    fn set_endpoints(&mut self, index: usize, addresses: &[Ipv4Addr]) -> Result<(), Rejection> {
        let slice = endpoint_slice(index, addresses, self.shape.endpoints);
        let id = NamespacedName::new(NAMESPACE, &slice_name(index));
        // Synthetic slices have no malformed entries to drop.
        self.endpoints.update(id, Some(&slice)).map(drop)
    }
}

/// The addresses of service `index` after endpoint change number `generation` (from 1): its
/// first endpoint moves to an address past every initial one, unique per generation.
fn replaced_addresses(shape: Shape, index: usize, generation: usize) -> Vec<Ipv4Addr> {
    let per_service = shape.endpoints;
    let mut addresses: Vec<Ipv4Addr> = (0..per_service)
        .map(|e| pod_ip(index * per_service + e))
        .collect();
    if let Some(first) = addresses.first_mut() {
        *first = pod_ip(shape.services * per_service + generation);
    }
    addresses
}

/// One object of the synthetic cluster, as the API holds it.
pub enum ClusterObject {
    Node(Box<Node>),
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
}

/// The same cluster as [`SyntheticCluster::new`] builds, object by object: this node's Node,
/// then each Service followed by its EndpointSlice. Lazy, so 50k Services never sit in
/// memory twice.
pub fn objects(shape: Shape) -> impl Iterator<Item = ClusterObject> {
    let node = std::iter::once(ClusterObject::Node(Box::new(this_node())));
    node.chain((0..shape.services).flat_map(move |index| {
        let addresses: Vec<Ipv4Addr> = (0..shape.endpoints)
            .map(|e| pod_ip(index * shape.endpoints + e))
            .collect();
        [
            ClusterObject::Service(Box::new(service(index))),
            ClusterObject::Slice(Box::new(endpoint_slice(index, &addresses, shape.endpoints))),
        ]
    }))
}

/// The cluster of [`objects`] as one manifest file (a JSON `kind: List`, as `kubectl get -o
/// json` writes it): what the real binary reads in the end-to-end measurement.
pub fn manifest_json(shape: Shape) -> Result<String, serde_json::Error> {
    let mut items = Vec::with_capacity(2 * shape.services + 1);
    for object in objects(shape) {
        items.push(match object {
            ClusterObject::Node(node) => with_kind(serde_json::to_value(node)?, "v1", "Node"),
            ClusterObject::Service(service) => with_kind(serde_json::to_value(service)?, "v1", "Service"),
            ClusterObject::Slice(slice) => with_kind(
                serde_json::to_value(slice)?,
                "discovery.k8s.io/v1",
                "EndpointSlice",
            ),
        });
    }
    serde_json::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// Service `index`'s slice after endpoint change number `generation` (from 1; see
/// [`replaced_addresses`]), stamped with `trigger_time` in the annotation the endpoint-slice
/// controller writes: what the churn benchmark sends through the API server.
pub fn churned_slice(shape: Shape, index: usize, generation: usize, trigger_time: &str) -> EndpointSlice {
    let addresses = replaced_addresses(shape, index, generation);
    let mut slice = endpoint_slice(index, &addresses, shape.endpoints);
    slice.metadata.annotations = Some(
        [(
            kpr_model::LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_string(),
            trigger_time.to_string(),
        )]
        .into(),
    );
    slice
}

/// Extra Service number `n` (from 0) created after the start, past the shape's Services, and
/// its slice: its own cluster IP, and endpoints from `EXTRA_POD_OFFSET` on, so
/// creating it is always a real change.
pub fn extra_service(shape: Shape, n: usize) -> (Service, EndpointSlice) {
    let index = shape.services + n;
    let addresses: Vec<Ipv4Addr> = (0..shape.endpoints)
        .map(|e| pod_ip(EXTRA_POD_OFFSET + n * shape.endpoints + e))
        .collect();
    (service(index), endpoint_slice(index, &addresses, shape.endpoints))
}

/// The names of extra Service `n` and of its slice (both in [`NAMESPACE`]).
pub fn extra_service_names(shape: Shape, n: usize) -> (String, String) {
    let index = shape.services + n;
    (service_name(index), slice_name(index))
}

fn service_name(index: usize) -> String {
    format!("svc-{index}")
}

fn slice_name(index: usize) -> String {
    format!("svc-{index}-1")
}

fn with_kind(mut object: serde_json::Value, api_version: &str, kind: &str) -> serde_json::Value {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".to_string(), api_version.into());
        map.insert("kind".to_string(), kind.into());
    }
    object
}

fn service_id(index: usize) -> NamespacedName {
    NamespacedName::new(NAMESPACE, &service_name(index))
}

/// `base + offset + 1` (skipping the network address); callers keep `offset` in range.
fn nth_address(base: Ipv4Addr, offset: usize) -> Ipv4Addr {
    let offset = u32::try_from(offset + 1).unwrap_or(u32::MAX);
    Ipv4Addr::from(u32::from(base).saturating_add(offset))
}

fn pod_ip(endpoint: usize) -> Ipv4Addr {
    nth_address(POD_BASE, endpoint)
}

fn this_node() -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(NODE_NAME.to_string()),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_string(),
                address: NODE_IP.to_string(),
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

/// A ClusterIP Service with one TCP port.
fn service(index: usize) -> Service {
    let cluster_ip = nth_address(SERVICE_BASE, index).to_string();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(index)),
            namespace: Some(NAMESPACE.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            cluster_ip: Some(cluster_ip.clone()),
            cluster_ips: Some(vec![cluster_ip]),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_string()),
                port: SERVICE_PORT,
                protocol: Some("TCP".to_string()),
                target_port: Some(IntOrString::Int(TARGET_PORT)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The one slice of service `index`; endpoint `e` lives on node `(index * per_service + e)
/// % NODES`, so locality does not depend on which address it has.
fn endpoint_slice(index: usize, addresses: &[Ipv4Addr], per_service: usize) -> EndpointSlice {
    let endpoints: Vec<Endpoint> = addresses
        .iter()
        .enumerate()
        .map(|(e, ip)| Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some(node_name((index * per_service + e) % NODES)),
            ..Endpoint::default()
        })
        .collect();
    let endpoints = Some(endpoints);
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(index)),
            namespace: Some(NAMESPACE.to_string()),
            labels: Some([(SERVICE_NAME_LABEL.to_string(), service_name(index))].into()),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".to_string(),
        endpoints,
        ports: Some(vec![EndpointPort {
            name: Some(PORT_NAME.to_string()),
            port: Some(TARGET_PORT),
            protocol: Some("TCP".to_string()),
            ..EndpointPort::default()
        }]),
    }
}

fn node_name(node: usize) -> String {
    format!("bench-node-{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> SyntheticCluster {
        SyntheticCluster::new(Shape {
            services: 5,
            endpoints: 4,
        })
        .expect("synthetic objects are valid")
    }

    #[test]
    fn every_service_gets_its_endpoints_through_the_trackers() {
        let snapshot = small().take();
        let state = &snapshot.state;
        assert_eq!(state.ports().len(), 5);
        assert_eq!(state.endpoint_count(), 20);
        assert_eq!(snapshot.changed.len(), 5);
        let local = state
            .ports()
            .iter()
            .flat_map(|p| state.endpoints(p))
            .filter(|e| e.is_local)
            .count();
        assert_eq!(
            local,
            20_usize.div_ceil(NODES),
            "one endpoint in {NODES} is local"
        );
    }

    #[test]
    fn replacing_one_endpoint_changes_only_the_first_service() {
        let mut cluster = small();
        let before = cluster.take();
        cluster.replace_one_endpoint().expect("valid slice");
        let after = cluster.take();
        assert_eq!(after.changed.into_iter().collect::<Vec<_>>(), vec![service_id(0)]);
        assert_eq!(after.state.endpoint_count(), before.state.endpoint_count());
        let port = after.state.ports()[0].clone();
        let ips = |s: &kpr_state::DesiredState| -> Vec<String> {
            s.endpoints(&port).iter().map(|e| e.addr.to_string()).collect()
        };
        assert_ne!(ips(&before.state), ips(&after.state));
    }

    #[test]
    fn the_object_stream_is_the_manifest_and_the_trackers_cluster() {
        let shape = Shape {
            services: 3,
            endpoints: 2,
        };
        let kinds: Vec<&str> = objects(shape)
            .map(|o| match o {
                ClusterObject::Node(_) => "Node",
                ClusterObject::Service(_) => "Service",
                ClusterObject::Slice(_) => "EndpointSlice",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "Node",
                "Service",
                "EndpointSlice",
                "Service",
                "EndpointSlice",
                "Service",
                "EndpointSlice"
            ]
        );
        let manifest: serde_json::Value = serde_json::from_str(&manifest_json(shape).unwrap()).unwrap();
        assert_eq!(manifest["items"].as_array().map(Vec::len), Some(7));
        assert_eq!(manifest["items"][2]["kind"], "EndpointSlice");
        assert_eq!(manifest["items"][2]["endpoints"][1]["addresses"][0], "10.64.0.2");
    }

    #[test]
    fn a_churned_slice_moves_one_endpoint_and_carries_its_trigger_time() {
        let shape = Shape {
            services: 3,
            endpoints: 2,
        };
        let slice = churned_slice(shape, 1, 7, "2026-11-23T10:00:00.5Z");
        let addresses: Vec<&str> = slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses[0].as_str())
            .collect();
        // Service 1's endpoints are 10.64.0.3 and .4; the first moves past all six initial ones.
        assert_eq!(addresses, ["10.64.0.14", "10.64.0.4"]);
        let stamp = kpr_model::last_change_trigger_time(&slice).expect("annotated");
        let since = stamp.duration_since(std::time::UNIX_EPOCH).unwrap();
        assert_eq!((since.as_secs(), since.subsec_millis()), (1_795_428_000, 500));
        assert_eq!(slice.metadata.name.as_deref(), Some("svc-1-1"));
    }

    #[test]
    fn extra_services_take_fresh_names_and_addresses() {
        let shape = Shape {
            services: 3,
            endpoints: 2,
        };
        let (service, slice) = extra_service(shape, 1);
        assert_eq!(service.metadata.name.as_deref(), Some("svc-4"));
        assert_eq!(
            extra_service_names(shape, 1),
            ("svc-4".to_string(), "svc-4-1".to_string())
        );
        let initial: Vec<String> = objects(shape)
            .filter_map(|o| match o {
                ClusterObject::Slice(s) => Some(
                    s.endpoints
                        .iter()
                        .flatten()
                        .map(|e| e.addresses[0].clone())
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            })
            .flatten()
            .collect();
        let extra: Vec<&str> = slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses[0].as_str())
            .collect();
        assert_eq!(extra, ["10.80.0.3", "10.80.0.4"]);
        assert!(extra.iter().all(|a| !initial.iter().any(|i| i == a)));
        // Far below every address an endpoint change moves to at this shape.
        assert!(shape.fits_soak(1000, 1000));
        assert!(!shape.fits_soak(EXTRA_POD_OFFSET, 0));
        assert!(!shape.fits_soak(0, EXTRA_POD_OFFSET));
    }

    #[test]
    fn shapes_beyond_the_address_ranges_do_not_fit() {
        let shape = Shape {
            services: 1000,
            endpoints: 4000,
        };
        assert!(shape.fits_with_changes(100));
        assert!(!shape.fits_with_changes(POD_ADDRESSES - 4_000_000));
        assert!(
            Shape {
                services: 10_000,
                endpoints: 10
            }
            .fits()
        );
        assert!(
            !Shape {
                services: 2_000_000,
                endpoints: 1
            }
            .fits()
        );
        assert!(
            !Shape {
                services: 100_000,
                endpoints: 100
            }
            .fits()
        );
    }
}
