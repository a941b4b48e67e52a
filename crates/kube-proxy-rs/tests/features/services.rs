//! Upstream's `SIGDescribe("Services")` scenarios (test/e2e/network/service.go) that a node
//! proxy decides, each named after its `It(...)`. docs/upstream-e2e.md maps every scenario
//! of that file to its test here, or says why it cannot run in a namespace lab.
//!
//! Each builds the objects upstream's test creates, as the API server and the EndpointSlice
//! controller leave them ([`crate::objects`]); a pod that upstream creates or deletes is
//! an endpoint added to or removed from the slice (the lab's pods serve all along, so only
//! the proxy decides who answers). Clients are pods and the node (upstream's exec pods and
//! host-network exec pods) and, for NodePorts, the outside client.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::{NODE_IP, pod_ip};
use serde_json::{Value, json};

use crate::Mode;
use crate::manifests::{Manifests, conditions};
use crate::objects::{
    OTHER_NODE, endpoint, external_name_service, named_slice, ready, ready_here, service, slice, slice_port,
    tcp_port, udp_port, with_node_port,
};
use crate::stage::{POD_PORT, Stage};
use crate::traffic::at;

const FILE: &str = "services.yaml";

netfilter_modes!(
    should_serve_a_basic_endpoint_from_pods,
    should_serve_multiport_endpoints_from_pods,
    should_be_updated_after_adding_or_deleting_ports,
    should_allow_pods_to_hairpin_back_to_themselves_through_services,
    should_be_able_to_up_and_down_services,
    should_work_after_the_service_has_been_recreated,
    should_work_after_restarting_kube_proxy,
    should_be_able_to_create_a_functioning_nodeport_service,
    should_be_able_to_update_service_type_to_nodeport_listening_on_same_port_number_but_different_protocols,
    should_be_able_to_change_the_type_from_externalname_to_clusterip,
    should_be_able_to_change_the_type_from_externalname_to_nodeport,
    should_be_able_to_change_the_type_from_clusterip_to_externalname,
    should_be_able_to_change_the_type_from_nodeport_to_externalname,
    should_release_nodeports_on_delete,
    should_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_true,
    should_not_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_false,
    should_be_rejected_when_no_endpoints_exist,
    should_serve_endpoints_on_same_port_and_different_protocols,
    should_serve_endpoints_on_same_port_and_different_protocol_for_internal_traffic_on_type_loadbalancer,
    should_preserve_source_pod_ip_for_traffic_thru_service_cluster_ip,
);
// Not the source-address scenario: in userspace mode the pod sees the proxy's own address,
// never the client's (upstream's userspace proxy skipped it too). ipvs mode: see the docs.
in_mode!(userspace, crate::Mode::Userspace;
    should_serve_a_basic_endpoint_from_pods,
    should_serve_multiport_endpoints_from_pods,
    should_be_updated_after_adding_or_deleting_ports,
    should_allow_pods_to_hairpin_back_to_themselves_through_services,
    should_be_able_to_up_and_down_services,
    should_work_after_the_service_has_been_recreated,
    should_work_after_restarting_kube_proxy,
    should_be_able_to_create_a_functioning_nodeport_service,
    should_be_able_to_update_service_type_to_nodeport_listening_on_same_port_number_but_different_protocols,
    should_be_able_to_change_the_type_from_externalname_to_clusterip,
    should_be_able_to_change_the_type_from_externalname_to_nodeport,
    should_be_able_to_change_the_type_from_clusterip_to_externalname,
    should_be_able_to_change_the_type_from_nodeport_to_externalname,
    should_release_nodeports_on_delete,
    should_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_true,
    should_not_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_false,
    should_be_rejected_when_no_endpoints_exist,
    should_serve_endpoints_on_same_port_and_different_protocols,
    should_serve_endpoints_on_same_port_and_different_protocol_for_internal_traffic_on_type_loadbalancer
);

/// The cluster IP of scenario Service `n`.
fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 20, n)
}

/// One TCP Service `name` on `vip(n)`:80 and its slice with `endpoints`.
fn web(name: &str, n: u8, endpoints: Vec<Value>) -> Vec<Value> {
    vec![
        service(name, vip(n), json!({"ports": [tcp_port("http", 80)]})),
        slice(name, json!([slice_port("http", "TCP", POD_PORT)]), endpoints),
    ]
}

/// Pods answering `pods` names, in order: `["pod0", "pod1"]`.
fn names(pods: &[usize]) -> Vec<String> {
    pods.iter().map(|i| format!("pod{i}")).collect()
}

/// Waits until `sender` to `to` is answered by exactly `pods`: 20 connections per pod, so
/// a pod missed (or one answering against the rules) by chance has odds below 2^-19.
#[track_caller]
fn wait_served(sender: &crate::traffic::Sender<'_>, to: std::net::SocketAddr, pods: &[usize]) {
    let names = names(pods);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    sender.wait_answered_by(to, 20 * pods.len(), &names);
}

/// Upstream creates a Service with no pods, adds pod1 and pod2, deletes them again, and
/// checks the endpoints and reachability at each step. No endpoint: refused; then exactly the
/// pods listed answer.
fn should_serve_a_basic_endpoint_from_pods(mode: Mode) {
    let mut manifests = Manifests::new(FILE, web("endpoint-test2", 10, vec![]));
    let stage = Stage::start(mode, 3, &manifests);
    let (client, to) = (stage.pod(2), at(vip(10), 80));
    client.wait_refused(to);
    for pods in [&[0][..], &[0, 1], &[1]] {
        manifests.set_endpoints("endpoint-test2", pods.iter().map(|&i| ready_here(i)).collect());
        stage.apply(&manifests);
        wait_served(&client, to, pods);
    }
    manifests.set_endpoints("endpoint-test2", vec![]);
    stage.apply(&manifests);
    client.wait_refused(to);
}

/// Two named ports, 80 -> `svc1` and 81 -> `svc2`; pod0 offers `svc1` on 100, pod1 `svc2`
/// on 101. The controller writes one slice per set of pod ports, so each Service port maps
/// to its own pod and port. Pods are deleted one by one.
fn should_serve_multiport_endpoints_from_pods(mode: Mode) {
    let ports = json!({"ports": [
        {"name": "portname1", "port": 80, "protocol": "TCP", "targetPort": "svc1"},
        {"name": "portname2", "port": 81, "protocol": "TCP", "targetPort": "svc2"}]});
    let mut manifests = Manifests::new(
        FILE,
        vec![
            service("multi-endpoint-test", vip(11), ports),
            named_slice(
                "multi-endpoint-test-svc1",
                "multi-endpoint-test",
                json!([slice_port("portname1", "TCP", 100)]),
                vec![ready_here(0)],
            ),
            named_slice(
                "multi-endpoint-test-svc2",
                "multi-endpoint-test",
                json!([slice_port("portname2", "TCP", 101)]),
                vec![ready_here(1)],
            ),
        ],
    );
    let mut stage = Stage::start(mode, 3, &manifests);
    stage.serve_tcp(0, 100);
    stage.serve_tcp(1, 101);
    let (client, first, second) = (stage.pod(2), at(vip(11), 80), at(vip(11), 81));
    wait_served(&client, first, &[0]);
    wait_served(&client, second, &[1]);

    manifests.slice_named("multi-endpoint-test-svc1")["endpoints"] = json!([]);
    stage.apply(&manifests);
    client.wait_refused(first);
    wait_served(&client, second, &[1]);

    manifests.slice_named("multi-endpoint-test-svc2")["endpoints"] = json!([]);
    stage.apply(&manifests);
    client.wait_refused(second);
}

/// A Service with port 80 (-> pod0's 100) gets a second port 81 (-> pod1's 101), then loses
/// it again: 81 answers only while the Service has it, and 80 throughout.
fn should_be_updated_after_adding_or_deleting_ports(mode: Mode) {
    let first_port = json!({"name": "portname1", "port": 80, "protocol": "TCP", "targetPort": "svc1"});
    let mut manifests = Manifests::new(
        FILE,
        vec![
            service("edit-port-test", vip(12), json!({"ports": [first_port.clone()]})),
            named_slice(
                "edit-port-test-svc1",
                "edit-port-test",
                json!([slice_port("portname1", "TCP", 100)]),
                vec![ready_here(0)],
            ),
        ],
    );
    let mut stage = Stage::start(mode, 3, &manifests);
    stage.serve_tcp(0, 100);
    stage.serve_tcp(1, 101);
    let (client, first, second) = (stage.pod(2), at(vip(12), 80), at(vip(12), 81));
    wait_served(&client, first, &[0]);

    let second_port = json!({"name": "portname2", "port": 81, "protocol": "TCP", "targetPort": "svc2"});
    manifests.service_mut("edit-port-test")["spec"]["ports"] = json!([first_port.clone(), second_port]);
    manifests.add(named_slice(
        "edit-port-test-svc2",
        "edit-port-test",
        json!([slice_port("portname2", "TCP", 101)]),
        vec![ready_here(1)],
    ));
    stage.apply(&manifests);
    wait_served(&client, second, &[1]);
    wait_served(&client, first, &[0]);

    manifests.service_mut("edit-port-test")["spec"]["ports"] = json!([first_port]);
    manifests.delete_slice("edit-port-test-svc2");
    stage.apply(&manifests);
    client.wait_unanswered(second);
    wait_served(&client, first, &[0]);
}

/// A pod on another node (simulated: the outside client holding an address of node2's pod
/// range, routed to this node as another node's pod traffic is) and a pod on this node
/// reach a cluster IP; the pod behind it sees each client's own address: pod-to-pod traffic
/// through a Service is not masqueraded.
fn should_preserve_source_pod_ip_for_traffic_thru_service_cluster_ip(mode: Mode) {
    let manifests = Manifests::new(FILE, web("sourceip-test", 13, vec![ready_here(0)]));
    let stage = Stage::start(mode, 2, &manifests);
    let remote_pod = Ipv4Addr::new(10, 244, 2, 5);
    stage
        .lab()
        .client()
        .ip(&["addr", "add", &format!("{remote_pod}/32"), "dev", "eth0"])
        .unwrap();
    let to = at(vip(13), 80);
    for (client, own) in [
        (stage.pod(1), IpAddr::from(pod_ip(1))),
        (stage.client_from(remote_pod), IpAddr::from(remote_pod)),
    ] {
        let outcome = client.wait_answered_by(to, 10, &["pod0"]);
        assert_eq!(
            outcome.seen,
            BTreeSet::from([own]),
            "{} through the cluster IP: {outcome}",
            client.label
        );
    }
}

/// A pod reaches itself through its own Service (the bridge sends the DNATed packet back
/// out of the port it came in on; the reply must be masqueraded to find its way back).
fn should_allow_pods_to_hairpin_back_to_themselves_through_services(mode: Mode) {
    let manifests = Manifests::new(FILE, web("hairpin-test", 14, vec![ready_here(0)]));
    let stage = Stage::start(mode, 1, &manifests);
    stage.pod(0).wait_answered_by(at(vip(14), 80), 10, &["pod0"]);
}

/// Two Services up, checked from a pod and from the node; the first one deleted: it is
/// down, the second still up; a third created: the second and third up.
fn should_be_able_to_up_and_down_services(mode: Mode) {
    let mut docs = web("up-down-1", 15, vec![ready_here(0), ready_here(1)]);
    docs.extend(web("up-down-2", 16, vec![ready_here(2), ready_here(3)]));
    let mut manifests = Manifests::new(FILE, docs);
    let stage = Stage::start(mode, 5, &manifests);
    let (first, second, third) = (at(vip(15), 80), at(vip(16), 80), at(vip(17), 80));
    for client in [stage.pod(4), stage.node()] {
        wait_served(&client, first, &[0, 1]);
        wait_served(&client, second, &[2, 3]);
    }

    manifests.delete_service("up-down-1");
    stage.apply(&manifests);
    stage.node().wait_unanswered(first);
    for client in [stage.pod(4), stage.node()] {
        wait_served(&client, second, &[2, 3]);
    }

    for doc in web("up-down-3", 17, vec![ready_here(0), ready_here(1)]) {
        manifests.add(doc);
    }
    stage.apply(&manifests);
    for client in [stage.pod(4), stage.node()] {
        wait_served(&client, second, &[2, 3]);
        wait_served(&client, third, &[0, 1]);
    }
}

/// The Service is deleted (its slice goes with it) and created again, with the cluster IP
/// the API server allocates then: the old address goes dark, the new one serves the pod.
fn should_work_after_the_service_has_been_recreated(mode: Mode) {
    let mut manifests = Manifests::new(FILE, web("service-deletion", 18, vec![ready_here(0)]));
    let stage = Stage::start(mode, 2, &manifests);
    let client = stage.pod(1);
    wait_served(&client, at(vip(18), 80), &[0]);

    manifests.delete_service("service-deletion");
    stage.apply(&manifests);
    client.wait_unanswered(at(vip(18), 80));

    for doc in web("service-deletion", 19, vec![ready_here(0)]) {
        manifests.add(doc);
    }
    stage.apply(&manifests);
    wait_served(&client, at(vip(19), 80), &[0]);
}

/// Two Services serve; the proxy restarts (SIGTERM, as a DaemonSet rollout does); both
/// serve again, and a Service created after the restart does too.
pub(crate) fn should_work_after_restarting_kube_proxy(mode: Mode) {
    let mut docs = web("restart-proxy-1", 20, vec![ready_here(0), ready_here(1)]);
    docs.extend(web("restart-proxy-2", 21, vec![ready_here(2)]));
    let mut manifests = Manifests::new(FILE, docs);
    let mut stage = Stage::start(mode, 4, &manifests);
    let (first, second) = (at(vip(20), 80), at(vip(21), 80));
    for client in [stage.pod(3), stage.node()] {
        wait_served(&client, first, &[0, 1]);
        wait_served(&client, second, &[2]);
    }

    stage.restart_proxy();
    for doc in web("restart-proxy-3", 22, vec![ready_here(1)]) {
        manifests.add(doc);
    }
    stage.apply(&manifests);
    for client in [stage.pod(3), stage.node()] {
        wait_served(&client, first, &[0, 1]);
        wait_served(&client, second, &[2]);
        wait_served(&client, at(vip(22), 80), &[1]);
    }
}

/// A NodePort Service with two pods: a pod reaches it on its cluster IP and on the node's
/// address at the NodePort, and so does the outside client.
fn should_be_able_to_create_a_functioning_nodeport_service(mode: Mode) {
    let manifests = Manifests::new(
        FILE,
        vec![
            service(
                "nodeport-test",
                vip(23),
                json!({"type": "NodePort", "ports": [with_node_port(tcp_port("http", 80), 30223)]}),
            ),
            slice(
                "nodeport-test",
                json!([slice_port("http", "TCP", POD_PORT)]),
                vec![ready_here(0), ready_here(1)],
            ),
        ],
    );
    let stage = Stage::start(mode, 3, &manifests);
    let node_port = at(NODE_IP, 30223);
    wait_served(&stage.pod(2), at(vip(23), 80), &[0, 1]);
    wait_served(&stage.pod(2), node_port, &[0, 1]);
    wait_served(&stage.client(), node_port, &[0, 1]);
}

/// A ClusterIP TCP Service becomes a NodePort Service, then gets a UDP port with the same
/// port number and the same NodePort number: TCP and UDP each reach the pods, on the cluster
/// IP and on the NodePort.
fn should_be_able_to_update_service_type_to_nodeport_listening_on_same_port_number_but_different_protocols(
    mode: Mode,
) {
    let mut manifests = Manifests::new(FILE, web("nodeport-update-service", 24, vec![ready_here(0)]));
    let mut stage = Stage::start(mode, 2, &manifests);
    stage.serve_udp(0, POD_PORT);
    let (client, to, node_port) = (stage.pod(1), at(vip(24), 80), at(NODE_IP, 30224));
    wait_served(&client, to, &[0]);

    let tcp = with_node_port(tcp_port("tcp-port", 80), 30224);
    manifests.service_mut("nodeport-update-service")["spec"] = merged_spec(
        &manifests,
        "nodeport-update-service",
        json!({"type": "NodePort", "ports": [tcp.clone()]}),
    );
    manifests.slice("nodeport-update-service")["ports"] = json!([slice_port("tcp-port", "TCP", POD_PORT)]);
    stage.apply(&manifests);
    wait_served(&client, node_port, &[0]);
    wait_served(&stage.client(), node_port, &[0]);

    let udp = with_node_port(udp_port("udp-port", 80), 30224);
    manifests.service_mut("nodeport-update-service")["spec"]["ports"] = json!([tcp, udp]);
    manifests.slice("nodeport-update-service")["ports"] = json!([
        slice_port("tcp-port", "TCP", POD_PORT),
        slice_port("udp-port", "UDP", POD_PORT)
    ]);
    stage.apply(&manifests);
    for to in [to, node_port] {
        client.wait_udp_answered_by(to, 5, &["pod0"]);
        wait_served(&client, to, &[0]);
    }
    stage.client().wait_udp_answered_by(node_port, 5, &["pod0"]);
    wait_served(&stage.client(), node_port, &[0]);
}

/// `spec` of Service `name` with `patch` merged in.
fn merged_spec(manifests: &Manifests, name: &str, patch: Value) -> Value {
    let mut spec = manifests.service(name)["spec"].clone();
    crate::objects::merge(&mut spec, patch);
    spec
}

/// The spec of a TCP Service on `vip(n)`:80, a NodePort one when `node_port` is given.
fn tcp_spec(n: u8, node_port: Option<u16>) -> Value {
    let name = "http";
    let cluster_ip = vip(n).to_string();
    match node_port {
        Some(node_port) => json!({"type": "NodePort", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                                  "selector": {"app": "x"},
                                  "ports": [with_node_port(tcp_port(name, 80), node_port)]}),
        None => json!({"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                       "selector": {"app": "x"}, "ports": [tcp_port(name, 80)]}),
    }
}

/// The slice the controller writes once the type change gives the Service a selector:
/// pods 0 and 1.
fn two_pods(service: &str) -> Value {
    slice(
        service,
        json!([slice_port("http", "TCP", POD_PORT)]),
        vec![ready_here(0), ready_here(1)],
    )
}

/// An ExternalName Service (a DNS alias: nothing to program) becomes a ClusterIP Service
/// with two pods: a pod reaches them on its cluster IP.
fn should_be_able_to_change_the_type_from_externalname_to_clusterip(mode: Mode) {
    let mut manifests = Manifests::new(FILE, vec![external_name_service("externalname-service")]);
    let stage = Stage::start(mode, 3, &manifests);
    manifests.service_mut("externalname-service")["spec"] = tcp_spec(25, None);
    manifests.add(two_pods("externalname-service"));
    stage.apply(&manifests);
    wait_served(&stage.pod(2), at(vip(25), 80), &[0, 1]);
}

/// An ExternalName Service becomes a NodePort Service with two pods: a pod reaches them on
/// its cluster IP and on the NodePort; the outside client on the NodePort.
fn should_be_able_to_change_the_type_from_externalname_to_nodeport(mode: Mode) {
    let mut manifests = Manifests::new(FILE, vec![external_name_service("externalname-service")]);
    let stage = Stage::start(mode, 3, &manifests);
    manifests.service_mut("externalname-service")["spec"] = tcp_spec(26, Some(30226));
    manifests.add(two_pods("externalname-service"));
    stage.apply(&manifests);
    let node_port = at(NODE_IP, 30226);
    wait_served(&stage.pod(2), at(vip(26), 80), &[0, 1]);
    wait_served(&stage.pod(2), node_port, &[0, 1]);
    wait_served(&stage.client(), node_port, &[0, 1]);
}

/// A ClusterIP Service becomes an ExternalName Service (the API server clears its cluster
/// IP; the controller deletes its slice): the node stops serving the old cluster IP. (The
/// DNS answer upstream checks is cluster DNS's, not the proxy's.)
fn should_be_able_to_change_the_type_from_clusterip_to_externalname(mode: Mode) {
    let mut manifests = Manifests::new(
        FILE,
        vec![
            service("clusterip-service", vip(27), tcp_spec(27, None)),
            two_pods("clusterip-service"),
        ],
    );
    let stage = Stage::start(mode, 3, &manifests);
    wait_served(&stage.pod(2), at(vip(27), 80), &[0, 1]);
    to_external_name(&mut manifests, "clusterip-service");
    stage.apply(&manifests);
    stage.pod(2).wait_unanswered(at(vip(27), 80));
}

/// A NodePort Service becomes an ExternalName Service: its cluster IP and its NodePort stop
/// answering (the NodePort is released: connections to it are refused, as to any closed
/// port of the node).
fn should_be_able_to_change_the_type_from_nodeport_to_externalname(mode: Mode) {
    let mut manifests = Manifests::new(
        FILE,
        vec![
            service("nodeport-service", vip(28), tcp_spec(28, Some(30228))),
            two_pods("nodeport-service"),
        ],
    );
    let stage = Stage::start(mode, 3, &manifests);
    let node_port = at(NODE_IP, 30228);
    wait_served(&stage.client(), node_port, &[0, 1]);
    to_external_name(&mut manifests, "nodeport-service");
    stage.apply(&manifests);
    stage.client().wait_refused(node_port);
    stage.pod(2).wait_unanswered(at(vip(28), 80));
}

/// Service `name` as the API server leaves it after a change to ExternalName: no cluster
/// IP, no NodePorts; and no slice (no selector).
fn to_external_name(manifests: &mut Manifests, name: &str) {
    let ports = manifests.service(name)["spec"]["ports"].clone();
    let mut external = external_name_service(name);
    let mut ports = ports.as_array().cloned().unwrap_or_default();
    for port in &mut ports {
        port.as_object_mut().map(|p| p.remove("nodePort"));
    }
    external["spec"]["ports"] = Value::Array(ports);
    manifests.delete_service(name);
    manifests.add(external);
}

/// A NodePort Service is deleted: nothing holds its NodePort any more (no socket listens on
/// it in the node; connections to it are refused like those to any closed port), and a new
/// Service can take the same NodePort and serves on it.
fn should_release_nodeports_on_delete(mode: Mode) {
    let nodeport = |n| {
        vec![
            service("nodeport-reuse", vip(n), tcp_spec(n, Some(30229))),
            two_pods("nodeport-reuse"),
        ]
    };
    let mut manifests = Manifests::new(FILE, nodeport(29));
    let stage = Stage::start(mode, 3, &manifests);
    let node_port = at(NODE_IP, 30229);
    wait_served(&stage.client(), node_port, &[0, 1]);

    manifests.delete_service("nodeport-reuse");
    stage.apply(&manifests);
    stage.client().wait_refused(node_port);
    let listening = stage
        .lab()
        .node()
        .sh("ss -Htanl 'sport = :30229'; ss -Huanl 'sport = :30229'")
        .unwrap();
    assert_eq!(listening.trim(), "", "NodePort 30229 still held:\n{listening}");

    for doc in nodeport(30) {
        manifests.add(doc);
    }
    stage.apply(&manifests);
    wait_served(&stage.client(), node_port, &[0, 1]);
}

/// The slice the controller writes for `publishNotReadyAddresses` Services, upstream's
/// `webserver` pod on node2 after its deletion: terminating and no longer serving, but
/// `ready` because the Service publishes addresses that are not ready.
fn publishing_not_ready(publish: bool) -> Value {
    endpoint(0, OTHER_NODE, conditions(publish, false, true))
}

/// The NodePort Service `svc-tolerate-unready` of upstream's two publishNotReadyAddresses
/// scenarios, pod0 on node2 ready.
fn tolerate_unready(name: &str, n: u8, node_port: u16, publish: bool) -> Vec<Value> {
    let mut spec = tcp_spec(n, Some(node_port));
    spec["publishNotReadyAddresses"] = json!(publish);
    vec![
        service(name, vip(n), spec),
        slice(
            name,
            json!([slice_port("http", "TCP", POD_PORT)]),
            vec![ready(0, OTHER_NODE)],
        ),
    ]
}

/// The Service publishes addresses that are not ready; its only pod (on node2) is deleted
/// and stops being ready while it drains. The controller keeps it `ready`, so a pod on this
/// node still reaches it on the cluster IP and on this node's NodePort. (Upstream also tries
/// node2's NodePort: that is node2's proxy.)
fn should_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_true(
    mode: Mode,
) {
    let mut manifests = Manifests::new(FILE, tolerate_unready("svc-tolerate-unready", 31, 30231, true));
    let stage = Stage::start(mode, 2, &manifests);
    let (client, to, node_port) = (stage.pod(1), at(vip(31), 80), at(NODE_IP, 30231));
    wait_served(&client, to, &[0]);
    manifests.set_endpoints("svc-tolerate-unready", vec![publishing_not_ready(true)]);
    // Whether the proxy has taken the change is not visible in the answers.
    stage.apply_and_wait_synced(&manifests);
    for to in [to, node_port] {
        wait_served(&client, to, &[0]);
    }
}

/// The same without `publishNotReadyAddresses`: the draining pod is not `ready` (nor
/// serving), so it gets nothing: the cluster IP and the NodePort are refused.
fn should_not_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_false(
    mode: Mode,
) {
    let mut manifests = Manifests::new(
        FILE,
        tolerate_unready("svc-not-tolerate-unready", 32, 30232, false),
    );
    let stage = Stage::start(mode, 2, &manifests);
    let (client, to, node_port) = (stage.pod(1), at(vip(32), 80), at(NODE_IP, 30232));
    wait_served(&client, to, &[0]);
    manifests.set_endpoints("svc-not-tolerate-unready", vec![publishing_not_ready(false)]);
    stage.apply(&manifests);
    client.wait_refused(to);
    client.wait_refused(node_port);
}

/// A Service whose slice lists no endpoint: a connection is refused at once (the proxy
/// rejects it), not left to time out.
pub(crate) fn should_be_rejected_when_no_endpoints_exist(mode: Mode) {
    let manifests = Manifests::new(FILE, web("no-pods", 33, vec![]));
    let stage = Stage::start(mode, 1, &manifests);
    stage.pod(0).wait_refused(at(vip(33), 80));
    stage.node().wait_refused(at(vip(33), 80));
}

/// The two ports of one Service: TCP 80 and UDP 80, both to the pod's port 8080.
fn multiprotocol_ports(tcp: bool, udp: bool) -> (Value, Value) {
    let (mut service_ports, mut slice_ports) = (vec![], vec![]);
    if tcp {
        service_ports.push(tcp_port("tcp-port", 80));
        slice_ports.push(slice_port("tcp-port", "TCP", POD_PORT));
    }
    if udp {
        service_ports.push(udp_port("udp-port", 80));
        slice_ports.push(slice_port("udp-port", "UDP", POD_PORT));
    }
    (Value::Array(service_ports), Value::Array(slice_ports))
}

/// One Service with TCP 80 and UDP 80 to pod0, which serves both: both answer. With only
/// the TCP port left, UDP goes unanswered; with only the UDP port, TCP does.
fn should_serve_endpoints_on_same_port_and_different_protocols(mode: Mode) {
    let (service_ports, slice_ports) = multiprotocol_ports(true, true);
    let mut manifests = Manifests::new(
        FILE,
        vec![
            service("multiprotocol-test", vip(34), json!({"ports": service_ports})),
            slice("multiprotocol-test", slice_ports, vec![ready_here(0)]),
        ],
    );
    let mut stage = Stage::start(mode, 2, &manifests);
    stage.serve_udp(0, POD_PORT);
    let (client, to) = (stage.pod(1), at(vip(34), 80));
    wait_served(&client, to, &[0]);
    client.wait_udp_answered_by(to, 5, &["pod0"]);

    for (tcp, udp) in [(true, false), (false, true)] {
        let (service_ports, slice_ports) = multiprotocol_ports(tcp, udp);
        manifests.service_mut("multiprotocol-test")["spec"]["ports"] = service_ports;
        manifests.slice("multiprotocol-test")["ports"] = slice_ports;
        stage.apply(&manifests);
        if tcp {
            client.wait_udp_unanswered(to);
            wait_served(&client, to, &[0]);
        } else {
            client.wait_unanswered(to);
            client.wait_udp_answered_by(to, 5, &["pod0"]);
        }
    }
}

/// A LoadBalancer Service whose load balancer is not there yet (no ingress) with TCP 80
/// and UDP 80 to pod0's named ports: from inside the cluster both answer, on the cluster
/// IP and on the NodePorts.
fn should_serve_endpoints_on_same_port_and_different_protocol_for_internal_traffic_on_type_loadbalancer(
    mode: Mode,
) {
    let ports = json!([
        {"name": "portname1", "port": 80, "protocol": "TCP", "targetPort": "svc1", "nodePort": 30235},
        {"name": "portname2", "port": 80, "protocol": "UDP", "targetPort": "svc2", "nodePort": 30236}]);
    let manifests = Manifests::new(
        FILE,
        vec![
            service(
                "multiprotocol-lb-test",
                vip(35),
                json!({"type": "LoadBalancer", "ports": ports}),
            ),
            slice(
                "multiprotocol-lb-test",
                json!([
                    slice_port("portname1", "TCP", 100),
                    slice_port("portname2", "UDP", 100)
                ]),
                vec![ready_here(0)],
            ),
        ],
    );
    let mut stage = Stage::start(mode, 2, &manifests);
    stage.serve_tcp(0, 100);
    stage.serve_udp(0, 100);
    let client = stage.pod(1);
    wait_served(&client, at(vip(35), 80), &[0]);
    client.wait_udp_answered_by(at(vip(35), 80), 5, &["pod0"]);
    wait_served(&client, at(NODE_IP, 30235), &[0]);
    client.wait_udp_answered_by(at(NODE_IP, 30236), 5, &["pod0"]);
}
