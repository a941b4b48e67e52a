//! `externalTrafficPolicy: Local`, on `examples/features/external-traffic-policy-local.yaml`:
//! external traffic stays on the node it arrived at and keeps its source; a node without a
//! local pod drops it, and its health-check port tells the load balancer so; pods and the
//! node itself still reach every pod. (The health-check servers' own behaviour, as
//! endpoints come and go, is tested in `tests/e2e_health_check_ports.rs`.)

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use kpr_netns::{CLIENT_IP, NODE_IP, eventually, pod_ip};
use serde_json::{Value, json};

use crate::manifests::Manifests;
use crate::stage::Stage;
use crate::support::{CONVERGE, NODE_NAME, POLL};
use crate::traffic::at;
use crate::{Mode, objects};

const FILE: &str = "external-traffic-policy-local.yaml";
/// checkout: pod0 on this node, pod1 on node2.
const CHECKOUT_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 40);
const CHECKOUT_NODE_PORT: u16 = 30140;
const CHECKOUT_HEALTH_CHECK: u16 = 30141;
/// catalog: pod1 on node2 only.
const CATALOG_INGRESS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 41);
const CATALOG_NODE_PORT: u16 = 30142;
const CATALOG_HEALTH_CHECK: u16 = 30143;

// Not userspace: that mode ignores traffic policies, as upstream's did, and its pods see
// the proxy's own address, never the client's.
// The last two are upstream's scenarios (service.go) on the health-check port; ipvs mode:
// see docs/upstream-e2e.md.
netfilter_modes!(
    external_traffic_stays_on_this_node_and_keeps_the_client_address,
    a_node_without_a_local_pod_drops_external_traffic_until_one_runs_here,
    pods_and_the_node_reach_external_addresses_through_every_pod,
    should_fail_health_check_node_port_if_there_are_only_terminating_endpoints,
    should_implement_nodeport_and_healthchecknodeport_correctly_when_externaltrafficpolicy_changes,
);
// ipvs: upstream's ipvs mode sends external traffic to every pod when none is local (no
// DROP), and its external virtual servers are the same for pods and the node as for the
// outside client (no short circuit): see kpr-ipvs's UPSTREAM.md, "onlyLocal".
in_mode!(ipvs, crate::Mode::Ipvs;
    external_traffic_stays_on_this_node_and_keeps_the_client_address,
    without_a_local_pod_ipvs_sends_external_traffic_to_every_pod,
    in_ipvs_mode_pods_and_the_node_reach_external_addresses_as_the_client_does
);

/// A LoadBalancer Service with `externalTrafficPolicy: Local` and `health`'s NodePorts
/// (`node_port`, `health_check`), its slice with `endpoints`.
fn local_load_balancer(
    name: &str,
    n: u8,
    node_port: u16,
    health_check: u16,
    endpoints: Vec<Value>,
) -> Manifests {
    Manifests::new(
        "etp-upstream.yaml",
        vec![
            objects::service(
                name,
                Ipv4Addr::new(10, 96, 24, n),
                json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                       "healthCheckNodePort": health_check,
                       "ports": [objects::with_node_port(objects::tcp_port("http", 80), node_port)]}),
            ),
            objects::slice(
                name,
                json!([objects::slice_port("http", "TCP", crate::stage::POD_PORT)]),
                endpoints,
            ),
        ],
    )
}

/// This node's only pod of the Service starts terminating (still serving, as it drains):
/// the health-check port goes from 200 to 503 (a load balancer must stop sending new
/// clients), while a pod on this node still reaches the terminating pod through the
/// NodePort.
fn should_fail_health_check_node_port_if_there_are_only_terminating_endpoints(mode: Mode) {
    let mut manifests = local_load_balancer(
        "svc-proxy-terminating",
        10,
        30280,
        30281,
        vec![objects::ready_here(0)],
    );
    let stage = Stage::start(mode, 2, &manifests);
    assert_eq!(probe(&stage, 30281, 200), health("svc-proxy-terminating", 1));
    manifests.set_endpoints("svc-proxy-terminating", vec![objects::terminating(0, NODE_NAME)]);
    stage.apply(&manifests);
    assert_eq!(probe(&stage, 30281, 503), health("svc-proxy-terminating", 0));
    stage.pod(1).wait_answered_by(at(NODE_IP, 30280), 10, &["pod0"]);
}

/// Upstream walks three nodes (the endpoint's, a host-network client's, a third one)
/// through Local -> Cluster -> Local; this node plays each in turn:
///
/// 1. Local, the pod here: health check 200; the outside client is served through the
///    NodePort with its own address kept.
/// 2. Cluster: the health-check port closes (refused); the client is served through the
///    NodePort (masqueraded).
/// 3. Local again with the same health-check port, the pod on node2: this node is both
///    upstream's client node and its third node: the health check says 503; the node itself
///    (a host-network client) is still served through its own NodePort (short circuit); the
///    outside client is dropped.
fn should_implement_nodeport_and_healthchecknodeport_correctly_when_externaltrafficpolicy_changes(
    mode: Mode,
) {
    let name = "external-local-update";
    let mut manifests = local_load_balancer(name, 11, 30282, 30283, vec![objects::ready_here(0)]);
    let stage = Stage::start(mode, 2, &manifests);
    let node_port = at(NODE_IP, 30282);
    assert_eq!(probe(&stage, 30283, 200), health(name, 1));
    let outcome = stage.client().wait_answered_by(node_port, 10, &["pod0"]);
    assert_eq!(
        outcome.seen,
        BTreeSet::from([IpAddr::from(CLIENT_IP)]),
        "{outcome}"
    );

    let spec = &mut manifests.service_mut(name)["spec"];
    spec["externalTrafficPolicy"] = json!("Cluster");
    spec.as_object_mut().unwrap().remove("healthCheckNodePort");
    stage.apply(&manifests);
    eventually(CONVERGE, POLL, || {
        match stage
            .lab()
            .client()
            .http_get(at(NODE_IP, 30283), "/healthz", Duration::from_secs(2))
        {
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            other => Err(format!("the health-check port should be closed: {other:?}")),
        }
    });
    let outcome = stage.client().wait_answered_by(node_port, 10, &["pod0"]);
    assert!(
        !outcome.seen.contains(&IpAddr::from(CLIENT_IP)),
        "masqueraded: {outcome}"
    );

    let spec = &mut manifests.service_mut(name)["spec"];
    spec["externalTrafficPolicy"] = json!("Local");
    spec["healthCheckNodePort"] = json!(30283);
    manifests.set_endpoints(name, vec![objects::ready(0, objects::OTHER_NODE)]);
    stage.apply(&manifests);
    assert_eq!(probe(&stage, 30283, 503), health(name, 0));
    stage.node().wait_answered_by(node_port, 10, &["pod0"]);
    stage.client().assert_dropped(node_port);
}

/// The load balancer's probe of checkout's health-check port says this node has one local
/// pod. The client reaches checkout's ingress IP and NodePort: only pod0 (the pod on this
/// node) answers, and it sees the client's own address. 100 connections: were node2's pod
/// used, it would be left out by chance with odds of 2^-100.
fn external_traffic_stays_on_this_node_and_keeps_the_client_address(mode: Mode) {
    let stage = Stage::start(mode, 2, &Manifests::example(FILE));
    assert_eq!(probe(&stage, CHECKOUT_HEALTH_CHECK, 200), health("checkout", 1));
    for to in [at(CHECKOUT_INGRESS, 80), at(NODE_IP, CHECKOUT_NODE_PORT)] {
        let outcome = stage.client().wait_answered_by(to, 100, &["pod0"]);
        assert_eq!(
            outcome.seen,
            BTreeSet::from([IpAddr::from(CLIENT_IP)]),
            "pod0 should see the client's address when reached on {to}: {outcome}"
        );
    }
}

/// catalog has no pod on this node: the load balancer's probe of its health-check port
/// gets 503 with no local endpoint, so a load balancer avoids this node; traffic that
/// arrives anyway (the client's, to the ingress IP and to the NodePort) is dropped (times
/// out), not refused and not sent to node2's pod. Once catalog's pod runs here, the probe
/// gets 200 and the client is served by it, with its own address.
fn a_node_without_a_local_pod_drops_external_traffic_until_one_runs_here(mode: Mode) {
    let mut manifests = Manifests::example(FILE);
    let stage = Stage::start(mode, 3, &manifests);
    let (ingress, node_port) = (at(CATALOG_INGRESS, 80), at(NODE_IP, CATALOG_NODE_PORT));
    assert_eq!(probe(&stage, CATALOG_HEALTH_CHECK, 503), health("catalog", 0));
    // A pod is served: catalog's rules are in place, so what follows is their verdict.
    stage.pod(2).wait_answered_by(ingress, 20, &["pod1"]);
    stage.client().assert_dropped(ingress);
    stage.client().assert_dropped(node_port);

    manifests.endpoint("catalog", pod_ip(1))["nodeName"] = json!(NODE_NAME);
    stage.apply(&manifests);
    assert_eq!(probe(&stage, CATALOG_HEALTH_CHECK, 200), health("catalog", 1));
    for to in [ingress, node_port] {
        let outcome = stage.client().wait_answered_by(to, 20, &["pod1"]);
        assert_eq!(
            outcome.seen,
            BTreeSet::from([IpAddr::from(CLIENT_IP)]),
            "{outcome}"
        );
    }
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

/// ipvs mode's version of the second scenario: catalog's probe still says 503, but
/// traffic that arrives anyway falls back to node2's pod, which sees the client's address.
fn without_a_local_pod_ipvs_sends_external_traffic_to_every_pod(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    assert_eq!(probe(&stage, CATALOG_HEALTH_CHECK, 503), health("catalog", 0));
    for to in [at(CATALOG_INGRESS, 80), at(NODE_IP, CATALOG_NODE_PORT)] {
        let outcome = stage.client().wait_answered_by(to, 20, &["pod1"]);
        assert_eq!(
            outcome.seen,
            BTreeSet::from([IpAddr::from(CLIENT_IP)]),
            "{outcome}"
        );
    }
}

/// ipvs mode's version of the third scenario: checkout's external addresses reach only
/// this node's pod0 from a pod and from the node too; catalog's fall back to node2's pod.
fn in_ipvs_mode_pods_and_the_node_reach_external_addresses_as_the_client_does(mode: Mode) {
    let stage = Stage::start(mode, 3, &Manifests::example(FILE));
    let (pod, node) = (stage.pod(2), stage.node());
    for to in [at(CHECKOUT_INGRESS, 80), at(NODE_IP, CHECKOUT_NODE_PORT)] {
        // 100 connections: were node2's pod used, it would be left out with odds of 2^-100.
        pod.wait_answered_by(to, 100, &["pod0"]);
        node.wait_answered_by(to, 100, &["pod0"]);
    }
    for to in [at(CATALOG_INGRESS, 80), at(NODE_IP, CATALOG_NODE_PORT)] {
        pod.wait_answered_by(to, 20, &["pod1"]);
        node.wait_answered_by(to, 20, &["pod1"]);
    }
}

/// Probes the node's health-check port `port` from the outside client, as a cloud load
/// balancer does, until the answer has `status` (the server opens once the proxy has seen
/// the Service), and returns the JSON body.
#[track_caller]
pub fn probe(stage: &Stage, port: u16, status: u16) -> Value {
    let to = at(NODE_IP, port);
    let body = eventually(CONVERGE, POLL, || {
        match stage
            .lab()
            .client()
            .http_get(to, "/healthz", Duration::from_secs(2))
        {
            Ok((got, body)) if got == status => Ok(body),
            other => Err(format!("probe of {to}: {other:?}, want {status}")),
        }
    });
    serde_json::from_str(&body).unwrap_or_else(|err| panic!("{to} answered no JSON ({err}): {body:?}"))
}

/// The body upstream's health-check server gives for Service `default/<name>`.
pub fn health(name: &str, local_endpoints: usize) -> Value {
    json!({"service": {"namespace": "default", "name": name},
           "localEndpoints": local_endpoints, "serviceProxyHealthy": true})
}
