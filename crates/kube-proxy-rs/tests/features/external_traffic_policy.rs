//! `externalTrafficPolicy: Local`, on `examples/features/external-traffic-policy-local.yaml`:
//! external traffic stays on the node it arrived at and keeps its source; a node without a
//! local pod drops it; pods and the node itself still reach every pod. (The health-check
//! port is tested with the health-check servers.)

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::{CLIENT_IP, NODE_IP, pod_ip};

use crate::Mode;
use crate::manifests::Manifests;
use crate::stage::Stage;
use crate::traffic::at;

const FILE: &str = "external-traffic-policy-local.yaml";
/// checkout: pod0 on this node, pod1 on node2.
const CHECKOUT_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 40);
const CHECKOUT_NODE_PORT: u16 = 30140;
/// catalog: pod1 on node2 only.
const CATALOG_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 41);
const CATALOG_NODE_PORT: u16 = 30142;

every_mode!(
    external_traffic_stays_on_this_node_and_keeps_the_client_address,
    a_node_without_a_local_pod_drops_external_traffic,
    pods_and_the_node_reach_external_addresses_through_every_pod,
);

/// The client reaches checkout's ingress IP and NodePort: only pod0 (the pod on this node)
/// answers, and it sees the client's own address. 100 connections: were node2's pod used,
/// it would be left out by chance with odds of 2^-100.
fn external_traffic_stays_on_this_node_and_keeps_the_client_address(mode: Mode) {
    let stage = Stage::start(mode, 2, &Manifests::example(FILE));
    for to in [at(CHECKOUT_INGRESS, 80), at(NODE_IP, CHECKOUT_NODE_PORT)] {
        let outcome = stage.client().wait_answered_by(to, 100, &["pod0"]);
        assert_eq!(
            outcome.seen,
            BTreeSet::from([IpAddr::from(CLIENT_IP)]),
            "pod0 should see the client's address when reached on {to}: {outcome}"
        );
    }
}

/// catalog has no pod on this node: the client's traffic to its ingress IP and to its
/// NodePort is dropped (times out), not refused and not sent to node2's pod; a load
/// balancer learns from the health check to avoid this node.
fn a_node_without_a_local_pod_drops_external_traffic(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    // A pod is served: catalog's rules are in place, so what follows is their verdict.
    stage
        .pod(2)
        .wait_answered_by(at(CATALOG_INGRESS, 80), 20, &["pod1"]);
    stage.client().assert_dropped(at(CATALOG_INGRESS, 80));
    stage.client().assert_dropped(at(NODE_IP, CATALOG_NODE_PORT));
}

/// Traffic from a pod or from the node to an external address never went through a load
/// balancer, so it is short-circuited to every pod of the Service, on any node: checkout
/// answers from both pods (a pod keeps its own address), catalog from node2's pod.
fn pods_and_the_node_reach_external_addresses_through_every_pod(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    let checkout = [at(CHECKOUT_INGRESS, 80), at(NODE_IP, CHECKOUT_NODE_PORT)];
    let catalog = [at(CATALOG_INGRESS, 80), at(NODE_IP, CATALOG_NODE_PORT)];
    let (pod, node) = (stage.pod(2), stage.node());
    for to in checkout {
        // 100 connections: a pod is left out by chance with odds of 2^-99.
        let outcome = pod.wait_answered_by(to, 100, &["pod0", "pod1"]);
        assert_eq!(
            outcome.seen,
            BTreeSet::from([IpAddr::from(pod_ip(2))]),
            "pod2 to {to} should keep its address: {outcome}"
        );
        node.wait_answered_by(to, 100, &["pod0", "pod1"]);
    }
    for to in catalog {
        pod.wait_answered_by(to, 20, &["pod1"]);
        node.wait_answered_by(to, 20, &["pod1"]);
    }
}
