//! `internalTrafficPolicy: Local`, on `examples/features/internal-traffic-policy-local.yaml`:
//! cluster-IP traffic from pods and from the node stays on this node, or is turned away.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::{CLIENT_IP, NODE_IP, pod_ip};
use serde_json::json;

use crate::manifests::{Manifests, conditions};
use crate::stage::Stage;
use crate::support::NODE_NAME;
use crate::traffic::at;
use crate::{Mode, objects};

const FILE: &str = "internal-traffic-policy-local.yaml";
/// node-cache: pod0 on this node, pod1 on node2.
const NODE_CACHE: Ipv4Addr = Ipv4Addr::new(10, 96, 5, 10);
/// remote-cache: pod1 on node2 only.
const REMOTE_CACHE: Ipv4Addr = Ipv4Addr::new(10, 96, 5, 20);

// Not userspace: that mode ignores internalTrafficPolicy, as upstream's did (its proxy
// predates the field), and its pods see the proxy's own address, not the calling pod's.
// The last is upstream's host-network backend scenario (service.go); ipvs mode: see
// docs/upstream-e2e.md.
netfilter_modes!(
    cluster_ip_traffic_goes_only_to_this_nodes_pod,
    without_a_local_pod_traffic_is_turned_away_until_one_is_scheduled_here,
    should_respect_internaltrafficpolicy_local_pod_and_node_to_pod_hostnetwork_true,
);
in_mode!(ipvs, crate::Mode::Ipvs;
    cluster_ip_traffic_goes_only_to_this_nodes_pod,
    without_a_local_pod_traffic_is_turned_away_until_one_is_scheduled_here
);

/// The Service's backend runs on the host network: its endpoint is a node's own address
/// (port 10180). While it is this node's, a pod and the node itself reach it through the
/// cluster IP; once the only backend is node2's (the outside client's address stands in
/// for node2's), both are turned away.
fn should_respect_internaltrafficpolicy_local_pod_and_node_to_pod_hostnetwork_true(mode: Mode) {
    const ENDPOINT_PORT: u16 = 10180;
    let host_network = |ip: Ipv4Addr, node: &str| json!({"addresses": [ip.to_string()], "conditions": conditions(true, true, false), "nodeName": node});
    let mut manifests = Manifests::new(
        "itp-host-network.yaml",
        vec![
            objects::service(
                "svc-itp",
                Ipv4Addr::new(10, 96, 25, 10),
                json!({"internalTrafficPolicy": "Local",
                       "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": ENDPOINT_PORT}]}),
            ),
            objects::slice(
                "svc-itp",
                json!([objects::slice_port("http", "TCP", ENDPOINT_PORT)]),
                vec![host_network(NODE_IP, NODE_NAME)],
            ),
        ],
    );
    let stage = Stage::start(mode, 1, &manifests);
    let _node1 = stage
        .lab()
        .node()
        .tcp_backend_telling_peer(at(NODE_IP, ENDPOINT_PORT), "node1")
        .unwrap();
    let _node2 = stage
        .lab()
        .client()
        .tcp_backend_telling_peer(at(CLIENT_IP, ENDPOINT_PORT), "node2")
        .unwrap();
    let to = at(Ipv4Addr::new(10, 96, 25, 10), 80);
    stage.pod(0).wait_answered_by(to, 10, &["node1"]);
    stage.node().wait_answered_by(to, 10, &["node1"]);

    manifests.set_endpoints("svc-itp", vec![host_network(CLIENT_IP, objects::OTHER_NODE)]);
    stage.apply_and_wait_synced(&manifests);
    mode.assert_turned_away(&stage.pod(0), to);
    mode.assert_turned_away(&stage.node(), to);
}

/// A pod and the node reach node-cache's cluster IP: only pod0 (this node's) answers, and
/// it sees the calling pod's own address. 100 connections: were node2's pod used, it would
/// be left out by chance with odds of 2^-100.
fn cluster_ip_traffic_goes_only_to_this_nodes_pod(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    let node_cache = at(NODE_CACHE, 80);
    let from_pod = stage.pod(2).wait_answered_by(node_cache, 100, &["pod0"]);
    assert_eq!(
        from_pod.seen,
        BTreeSet::from([IpAddr::from(pod_ip(2))]),
        "{from_pod}"
    );
    stage.node().wait_answered_by(node_cache, 100, &["pod0"]);
}

/// remote-cache's only pod is on node2: a pod's and the node's traffic to it is turned away
/// (dropped, or refused in ipvs mode: see [`Mode::assert_turned_away`]), never sent across.
/// Once that pod is on this node, it is served.
fn without_a_local_pod_traffic_is_turned_away_until_one_is_scheduled_here(mode: Mode) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 3, &manifests);
    let remote_cache = at(REMOTE_CACHE, 80);
    // node-cache is served: the rules of this sync are in place.
    stage.pod(2).wait_answered_by(at(NODE_CACHE, 80), 20, &["pod0"]);
    mode.assert_turned_away(&stage.pod(2), remote_cache);
    mode.assert_turned_away(&stage.node(), remote_cache);

    manifests.endpoint("remote-cache", pod_ip(1))["nodeName"] = json!(NODE_NAME);
    stage.apply(&manifests);
    stage.pod(2).wait_answered_by(remote_cache, 20, &["pod1"]);
    stage.node().wait_answered_by(remote_cache, 20, &["pod1"]);
}
