//! `internalTrafficPolicy: Local`, on `examples/features/internal-traffic-policy-local.yaml`:
//! cluster-IP traffic from pods and from the node stays on this node, or is turned away.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::pod_ip;
use serde_json::json;

use crate::Mode;
use crate::manifests::Manifests;
use crate::stage::Stage;
use crate::support::NODE_NAME;
use crate::traffic::at;

const FILE: &str = "internal-traffic-policy-local.yaml";
/// node-cache: pod0 on this node, pod1 on node2.
const NODE_CACHE: Ipv4Addr = Ipv4Addr::new(10, 96, 5, 10);
/// remote-cache: pod1 on node2 only.
const REMOTE_CACHE: Ipv4Addr = Ipv4Addr::new(10, 96, 5, 20);

// Not userspace: that mode ignores internalTrafficPolicy, as upstream's did (its proxy
// predates the field), and its pods see the proxy's own address, not the calling pod's.
kernel_modes!(
    cluster_ip_traffic_goes_only_to_this_nodes_pod,
    without_a_local_pod_traffic_is_turned_away_until_one_is_scheduled_here,
);

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
