//! Terminating endpoints, on `examples/features/terminating-endpoints.yaml`: a rollout walked
//! step by step, with new connections going where upstream sends them.

use std::net::Ipv4Addr;

use kpr_netns::pod_ip;
use serde_json::json;

use crate::Mode;
use crate::manifests::{Manifests, conditions};
use crate::stage::Stage;
use crate::support::NODE_NAME;
use crate::traffic::at;

const FILE: &str = "terminating-endpoints.yaml";
/// rollout's cluster IP.
const ROLLOUT: Ipv4Addr = Ipv4Addr::new(10, 96, 6, 10);

every_mode!(terminating_pods_serve_only_while_no_ready_pod_is_left);

/// pod0 is ready, pod1 terminating but still serving, pod2 terminating and no longer
/// serving; pod4 is the client.
///
/// 1. Only the ready pod0 gets connections.
/// 2. pod0 is gone: the still-serving pod1 takes them (so the Service keeps working while
///    it drains); pod2 never does.
/// 3. A new pod3 is ready: it takes every connection, pod1 none.
/// 4. pod3 is deleted and pod1 stops serving: nothing serves, connections are refused at
///    once (not left to time out).
///
/// 100 connections per step: a pod used against the rules would be left out by chance with
/// odds below 10^-17.
fn terminating_pods_serve_only_while_no_ready_pod_is_left(mode: Mode) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 5, &manifests);
    let (client, rollout) = (stage.pod(4), at(ROLLOUT, 80));

    client.wait_answered_by(rollout, 100, &["pod0"]);

    manifests.remove_endpoint("rollout", pod_ip(0));
    stage.apply(&manifests);
    client.wait_answered_by(rollout, 100, &["pod1"]);

    manifests.add_endpoint(
        "rollout",
        json!({"addresses": [pod_ip(3).to_string()], "conditions": conditions(true, true, false),
               "nodeName": NODE_NAME}),
    );
    stage.apply(&manifests);
    client.wait_answered_by(rollout, 100, &["pod3"]);

    manifests.remove_endpoint("rollout", pod_ip(3));
    manifests.endpoint("rollout", pod_ip(1))["conditions"] = conditions(false, false, true);
    stage.apply(&manifests);
    client.wait_refused(rollout);
}
