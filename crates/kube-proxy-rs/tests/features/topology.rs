//! Topology-aware routing, on `examples/features/topology.yaml`: zone hints, with the zone
//! read from the Node's `topology.kubernetes.io/zone` label.

use std::net::Ipv4Addr;

use kpr_netns::pod_ip;
use serde_json::json;

use crate::Mode;
use crate::manifests::{Manifests, conditions};
use crate::stage::Stage;
use crate::traffic::at;

const FILE: &str = "topology.yaml";
/// zonal's cluster IP.
const ZONAL: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 10);
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

every_mode!(cluster_traffic_stays_in_the_nodes_zone_while_every_pod_has_a_hint);

/// pod0 and pod2 are hinted for zone-a, pod1 for zone-b; pod4 is the client.
///
/// 1. node1 is in zone-a: only pod0 and pod2 answer.
/// 2. The Node's label moves it to zone-b: only pod1 answers.
/// 3. It moves to zone-c, which no hint names: every pod answers.
/// 4. Back in zone-a, a ready pod3 without a hint joins: hints are ignored unless every
///    ready endpoint has one, so every pod answers.
///
/// Each step sends at least 100 connections: a pod used against the rules would be left out
/// by chance, or a pod the step should use missed, with odds below 10^-17.
fn cluster_traffic_stays_in_the_nodes_zone_while_every_pod_has_a_hint(mode: Mode) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 5, &manifests);
    let (client, zonal) = (stage.pod(4), at(ZONAL, 80));

    client.wait_answered_by(zonal, 100, &["pod0", "pod2"]);

    manifests.node()["metadata"]["labels"][ZONE_LABEL] = json!("zone-b");
    stage.apply(&manifests);
    client.wait_answered_by(zonal, 100, &["pod1"]);

    manifests.node()["metadata"]["labels"][ZONE_LABEL] = json!("zone-c");
    stage.apply(&manifests);
    client.wait_answered_by(zonal, 200, &["pod0", "pod1", "pod2"]);

    manifests.node()["metadata"]["labels"][ZONE_LABEL] = json!("zone-a");
    manifests.add_endpoint(
        "zonal",
        json!({"addresses": [pod_ip(3).to_string()], "conditions": conditions(true, true, false),
               "nodeName": "node2", "zone": "zone-a"}),
    );
    stage.apply(&manifests);
    client.wait_answered_by(zonal, 200, &["pod0", "pod1", "pod2", "pod3"]);
}
