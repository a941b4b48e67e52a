//! `internalTrafficPolicy: Local`, on `examples/features/internal-traffic-policy-local.yaml`:
//! cluster-IP traffic from pods and from the node stays on this node, or is dropped.

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
in_mode!(iptables, crate::Mode::Iptables;
    cluster_ip_traffic_goes_only_to_this_nodes_pod,
    without_a_local_pod_traffic_is_dropped_until_one_is_scheduled_here
);
in_mode!(nftables, crate::Mode::Nftables;
    cluster_ip_traffic_goes_only_to_this_nodes_pod,
    without_a_local_pod_traffic_is_dropped_until_one_is_scheduled_here
);
// ipvs: a cluster IP without a local pod is a virtual server without real servers, which
// the kernel refuses (upstream's ipvs mode has no DROP rule for it).
in_mode!(ipvs, crate::Mode::Ipvs;
    cluster_ip_traffic_goes_only_to_this_nodes_pod,
    without_a_local_pod_traffic_is_refused_until_one_is_scheduled_here
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

/// remote-cache's only pod is on node2: a pod's and the node's traffic to it is dropped
/// (times out), never sent across. Once that pod is on this node, it is served.
fn without_a_local_pod_traffic_is_dropped_until_one_is_scheduled_here(mode: Mode) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 3, &manifests);
    let remote_cache = at(REMOTE_CACHE, 80);
    // node-cache is served: the rules of this sync are in place.
    stage.pod(2).wait_answered_by(at(NODE_CACHE, 80), 20, &["pod0"]);
    stage.pod(2).assert_dropped(remote_cache);
    stage.node().assert_dropped(remote_cache);

    manifests.endpoint("remote-cache", pod_ip(1))["nodeName"] = json!(NODE_NAME);
    stage.apply(&manifests);
    stage.pod(2).wait_answered_by(remote_cache, 20, &["pod1"]);
    stage.node().wait_answered_by(remote_cache, 20, &["pod1"]);
}

/// ipvs mode's version of the above: remote-cache's virtual server has no real server while
/// its only pod is on node2, so a pod's and the node's connections are refused at once.
fn without_a_local_pod_traffic_is_refused_until_one_is_scheduled_here(mode: Mode) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 3, &manifests);
    let remote_cache = at(REMOTE_CACHE, 80);
    stage.pod(2).wait_answered_by(at(NODE_CACHE, 80), 20, &["pod0"]);
    stage.pod(2).wait_refused(remote_cache);
    stage.node().wait_refused(remote_cache);

    manifests.endpoint("remote-cache", pod_ip(1))["nodeName"] = json!(NODE_NAME);
    stage.apply(&manifests);
    stage.pod(2).wait_answered_by(remote_cache, 20, &["pod1"]);
    stage.node().wait_answered_by(remote_cache, 20, &["pod1"]);
}
