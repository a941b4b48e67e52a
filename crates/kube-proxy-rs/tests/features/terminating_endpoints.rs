//! Terminating endpoints, on `examples/features/terminating-endpoints.yaml`: a rollout walked
//! step by step, with new connections going where upstream sends them.

use std::net::Ipv4Addr;

use kpr_netns::{NODE_IP, pod_ip};
use serde_json::json;

use crate::manifests::{Manifests, conditions};
use crate::stage::Stage;
use crate::support::NODE_NAME;
use crate::traffic::at;
use crate::{Mode, objects};

const FILE: &str = "terminating-endpoints.yaml";
/// rollout's cluster IP.
const ROLLOUT: Ipv4Addr = Ipv4Addr::new(10, 96, 6, 10);

// The last three are upstream's fallback scenarios (service.go); their
// internalTrafficPolicy=Cluster one is the first. Userspace mode has no traffic policies;
// ipvs mode: see docs/upstream-e2e.md.
netfilter_modes!(
    terminating_pods_serve_only_while_no_ready_pod_is_left,
    should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externalltrafficpolicy_cluster,
    should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_local,
    should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_local,
);
in_mode!(userspace, crate::Mode::Userspace;
    terminating_pods_serve_only_while_no_ready_pod_is_left,
    should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externalltrafficpolicy_cluster
);
in_mode!(ipvs, crate::Mode::Ipvs; terminating_pods_serve_only_while_no_ready_pod_is_left);

/// Service `svc-proxy-terminating` (`spec` merged in, TCP 80 -> 8080, NodePort 30290 when
/// it is a NodePort Service) with pod0 on this node, ready.
fn proxy_terminating(spec: serde_json::Value) -> Manifests {
    let mut spec_with_port = json!({"ports": [objects::tcp_port("http", 80)]});
    if spec["type"] == "NodePort" {
        spec_with_port["ports"][0]["nodePort"] = json!(30290);
    }
    objects::merge(&mut spec_with_port, spec);
    Manifests::new(
        "terminating-upstream.yaml",
        vec![
            objects::service(
                "svc-proxy-terminating",
                Ipv4Addr::new(10, 96, 26, 10),
                spec_with_port,
            ),
            objects::slice(
                "svc-proxy-terminating",
                json!([objects::slice_port("http", "TCP", crate::stage::POD_PORT)]),
                vec![objects::ready_here(0)],
            ),
        ],
    )
}

/// The only pod is deleted and drains (terminating, still serving): with
/// `internalTrafficPolicy: Local` a pod on its node still reaches it; a pod on another node
/// (here: once the terminating pod is node2's) is turned away.
fn should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_local(
    mode: Mode,
) {
    let mut manifests = proxy_terminating(json!({"internalTrafficPolicy": "Local"}));
    let stage = Stage::start(mode, 2, &manifests);
    let (client, to) = (stage.pod(1), at(Ipv4Addr::new(10, 96, 26, 10), 80));
    client.wait_answered_by(to, 10, &["pod0"]);
    manifests.set_endpoints("svc-proxy-terminating", vec![objects::terminating(0, NODE_NAME)]);
    stage.apply_and_wait_synced(&manifests);
    client.wait_answered_by(to, 10, &["pod0"]);
    manifests.set_endpoints(
        "svc-proxy-terminating",
        vec![objects::terminating(0, objects::OTHER_NODE)],
    );
    stage.apply_and_wait_synced(&manifests);
    mode.assert_turned_away(&client, to);
}

/// (Upstream's name has the typo "externallTrafficPolicy".) A NodePort Service with
/// `externalTrafficPolicy: Cluster`; its only pod, on this node, drains: a pod on this node
/// and the outside client (upstream's pod on another node) still reach it through this
/// node's NodePort.
fn should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externalltrafficpolicy_cluster(
    mode: Mode,
) {
    let mut manifests = proxy_terminating(json!({"type": "NodePort"}));
    let stage = Stage::start(mode, 2, &manifests);
    let node_port = at(NODE_IP, 30290);
    stage.client().wait_answered_by(node_port, 10, &["pod0"]);
    manifests.set_endpoints("svc-proxy-terminating", vec![objects::terminating(0, NODE_NAME)]);
    stage.apply_and_wait_synced(&manifests);
    stage.pod(1).wait_answered_by(node_port, 10, &["pod0"]);
    stage.client().wait_answered_by(node_port, 10, &["pod0"]);
}

/// `externalTrafficPolicy: Local`; the only pod, on this node, drains: a pod on this node
/// and the outside client still reach it through this node's NodePort (the client keeps
/// its address). At a node without it (here: once it is node2's pod), the outside client is
/// dropped.
fn should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_local(
    mode: Mode,
) {
    let mut manifests = proxy_terminating(json!({"type": "NodePort", "externalTrafficPolicy": "Local"}));
    let stage = Stage::start(mode, 2, &manifests);
    let node_port = at(NODE_IP, 30290);
    stage.client().wait_answered_by(node_port, 10, &["pod0"]);
    manifests.set_endpoints("svc-proxy-terminating", vec![objects::terminating(0, NODE_NAME)]);
    stage.apply_and_wait_synced(&manifests);
    stage.pod(1).wait_answered_by(node_port, 10, &["pod0"]);
    let outcome = stage.client().wait_answered_by(node_port, 10, &["pod0"]);
    assert_eq!(
        outcome.seen,
        std::collections::BTreeSet::from([std::net::IpAddr::from(kpr_netns::CLIENT_IP)]),
        "{outcome}"
    );
    manifests.set_endpoints(
        "svc-proxy-terminating",
        vec![objects::terminating(0, objects::OTHER_NODE)],
    );
    stage.apply_and_wait_synced(&manifests);
    stage.client().assert_dropped(node_port);
}

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
