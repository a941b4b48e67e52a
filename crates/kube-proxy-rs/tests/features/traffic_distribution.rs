//! Upstream's `SIGDescribe("Traffic Distribution")` scenarios
//! (test/e2e/network/traffic_distribution.go), each named after its `It(...)`.
//!
//! Upstream runs clients in three zones of a real multi-zone cluster. A proxy only ever
//! decides for its own node, from the Node's `topology.kubernetes.io/zone` label and the
//! hints the EndpointSlice controller writes: `forZones` (the endpoint's zone) for
//! `PreferClose` and `PreferSameZone`, `forNodes` (its own node) and `forZones` for
//! `PreferSameNode`. So this node plays each client's node in turn: its zone label moves
//! between zones, and endpoints name the nodes upstream's pods run on.

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use crate::Mode;
use crate::manifests::Manifests;
use crate::objects::{ready, service, slice, slice_port, tcp_port};
use crate::stage::{POD_PORT, Stage};
use crate::support::NODE_NAME;
use crate::traffic::at;

const FILE: &str = "traffic-distribution.yaml";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

host_modes!(
    should_route_traffic_to_an_endpoint_in_the_same_zone_when_using_preferclose,
    should_route_traffic_correctly_between_pods_on_multiple_nodes_when_using_preferclose,
    should_route_traffic_correctly_between_pods_on_multiple_nodes_when_using_prefersamezone,
    should_route_traffic_to_an_endpoint_on_the_same_node_or_fall_back_to_same_zone_when_using_prefersamenode,
    should_route_traffic_to_an_endpoint_on_the_same_node_when_using_prefersamenode_and_fall_back_when_the_endpoint_becomes_unavailable,
);

/// The Service's cluster IP.
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 23, 10);

/// This node, in `zone`, as the manifests state it.
fn node(zone: &str) -> Value {
    let mut node = crate::objects::this_node();
    node["metadata"]["labels"][ZONE_LABEL] = json!(zone);
    node
}

/// Pod `pod`'s endpoint on `node` in `zone`, with the hints the controller writes for
/// `distribution`.
fn hinted(pod: usize, node: &str, zone: &str, distribution: &str) -> Value {
    let mut endpoint = ready(pod, node);
    endpoint["zone"] = json!(zone);
    endpoint["hints"] = match distribution {
        "PreferSameNode" => json!({"forNodes": [{"name": node}], "forZones": [{"name": zone}]}),
        _ => json!({"forZones": [{"name": zone}]}),
    };
    endpoint
}

/// The Node, and Service `traffic-dist-test-service` with `distribution` and `endpoints`.
fn manifests(zone: &str, distribution: &str, endpoints: Vec<Value>) -> Manifests {
    Manifests::new(
        FILE,
        vec![
            node(zone),
            service(
                "traffic-dist-test-service",
                VIP,
                json!({"trafficDistribution": distribution, "ports": [tcp_port("http", 80)]}),
            ),
            slice(
                "traffic-dist-test-service",
                json!([slice_port("http", "TCP", POD_PORT)]),
                endpoints,
            ),
        ],
    )
}

/// Moves this node to `zone`, then waits until `client`'s connections are answered by
/// exactly `pods`: 30 per pod, so a pod the rules exclude is never picked by chance unseen
/// (odds below 2^-29 per step) and each wanted pod is seen.
fn in_zone(stage: &Stage, manifests: &mut Manifests, zone: &str, pods: &[&str]) {
    manifests.node()["metadata"]["labels"][ZONE_LABEL] = json!(zone);
    stage.apply(manifests);
    stage.pod(4).wait_answered_by(at(VIP, 80), 30 * pods.len(), pods);
}

/// Endpoints in zone-a (pod0, on this node) and zone-b (pod1, on node2). A client in
/// zone-a reaches pod0 only, one in zone-b pod1 only, one in zone-c (no endpoint there)
/// both.
fn should_route_traffic_to_an_endpoint_in_the_same_zone_when_using_preferclose(mode: Mode) {
    let endpoints = vec![
        hinted(0, NODE_NAME, "zone-a", "PreferClose"),
        hinted(1, "node2", "zone-b", "PreferClose"),
    ];
    let mut manifests = manifests("zone-a", "PreferClose", endpoints);
    let stage = Stage::start(mode, 5, &manifests);
    in_zone(&stage, &mut manifests, "zone-a", &["pod0"]);
    in_zone(&stage, &mut manifests, "zone-b", &["pod1"]);
    in_zone(&stage, &mut manifests, "zone-c", &["pod0", "pod1"]);
}

/// Upstream's multi-node layout: zone-a has two nodes, each with a client and an endpoint
/// (pod0 on this node, pod1 on node-a2); zone-b has a client on one node and its endpoint
/// on another (pod2 on node-b2); zone-c has only a client. A client in zone-a reaches both
/// zone-a endpoints, including the other node's; one in zone-b reaches pod2 on the other
/// node; one in zone-c reaches all three.
fn multiple_nodes(mode: Mode, distribution: &str) {
    let endpoints = vec![
        hinted(0, NODE_NAME, "zone-a", distribution),
        hinted(1, "node-a2", "zone-a", distribution),
        hinted(2, "node-b2", "zone-b", distribution),
    ];
    let mut manifests = manifests("zone-a", distribution, endpoints);
    let stage = Stage::start(mode, 5, &manifests);
    in_zone(&stage, &mut manifests, "zone-a", &["pod0", "pod1"]);
    in_zone(&stage, &mut manifests, "zone-b", &["pod2"]);
    in_zone(&stage, &mut manifests, "zone-c", &["pod0", "pod1", "pod2"]);
}

fn should_route_traffic_correctly_between_pods_on_multiple_nodes_when_using_preferclose(mode: Mode) {
    multiple_nodes(mode, "PreferClose");
}

/// Upstream's "... multiple nodes when using PreferSameZone": the controller writes the
/// same hints as for PreferClose, and the proxy reads only the hints.
fn should_route_traffic_correctly_between_pods_on_multiple_nodes_when_using_prefersamezone(mode: Mode) {
    multiple_nodes(mode, "PreferSameZone");
}

/// PreferSameNode: the controller hints each endpoint for its own node and its zone. A
/// client on this node (pod0 here) reaches only pod0; a client on a zone-a node without an
/// endpoint (this node once pod0's endpoint is another node's, node-a3) falls back to the
/// zone-a endpoints; a client in zone-b without one reaches the zone-b endpoint.
fn should_route_traffic_to_an_endpoint_on_the_same_node_or_fall_back_to_same_zone_when_using_prefersamenode(
    mode: Mode,
) {
    let endpoints = |first_node: &str| {
        vec![
            hinted(0, first_node, "zone-a", "PreferSameNode"),
            hinted(1, "node-a2", "zone-a", "PreferSameNode"),
            hinted(2, "node-b1", "zone-b", "PreferSameNode"),
        ]
    };
    let mut manifests = manifests("zone-a", "PreferSameNode", endpoints(NODE_NAME));
    let stage = Stage::start(mode, 5, &manifests);
    in_zone(&stage, &mut manifests, "zone-a", &["pod0"]);
    manifests.set_endpoints("traffic-dist-test-service", endpoints("node-a3"));
    in_zone(&stage, &mut manifests, "zone-a", &["pod0", "pod1"]);
    in_zone(&stage, &mut manifests, "zone-b", &["pod2"]);
}

/// PreferSameNode: a client on this node reaches this node's endpoint (pod0) only; once
/// that pod is deleted, the client falls back to the other zone-a endpoint (pod1), never
/// to zone-b's (pod2).
fn should_route_traffic_to_an_endpoint_on_the_same_node_when_using_prefersamenode_and_fall_back_when_the_endpoint_becomes_unavailable(
    mode: Mode,
) {
    let mut manifests = manifests(
        "zone-a",
        "PreferSameNode",
        vec![
            hinted(0, NODE_NAME, "zone-a", "PreferSameNode"),
            hinted(1, "node-a2", "zone-a", "PreferSameNode"),
            hinted(2, "node-b1", "zone-b", "PreferSameNode"),
        ],
    );
    let stage = Stage::start(mode, 5, &manifests);
    in_zone(&stage, &mut manifests, "zone-a", &["pod0"]);
    manifests.remove_endpoint("traffic-dist-test-service", kpr_netns::pod_ip(0));
    in_zone(&stage, &mut manifests, "zone-a", &["pod1"]);
}
