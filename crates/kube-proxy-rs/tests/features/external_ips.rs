//! External IPs, on `examples/features/external-ips.yaml`: an address the admin routes to
//! the nodes, served like the cluster IP.

use std::net::Ipv4Addr;

use crate::Mode;
use crate::manifests::Manifests;
use crate::stage::Stage;
use crate::support::assert_fair;
use crate::traffic::at;

const FILE: &str = "external-ips.yaml";
/// legacy-app's external IP.
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const BOTH_PODS: [&str; 2] = ["pod0", "pod1"];

every_mode!(the_external_ip_is_served_to_the_outside_client_the_node_and_pods);

/// legacy-app's external IP answers, from both pods, to the outside client (whose route
/// sends it to the node), to the node itself and to a pod.
fn the_external_ip_is_served_to_the_outside_client_the_node_and_pods(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    let external = at(EXTERNAL_IP, 80);
    // 200 connections: a serving pod is left out by chance with odds of 2^-199.
    let from_outside = stage.client().wait_answered_by(external, 200, &BOTH_PODS);
    assert_fair(&from_outside.answers);
    stage.node().wait_answered_by(external, 100, &BOTH_PODS);
    stage.pod(2).wait_answered_by(external, 100, &BOTH_PODS);
}
