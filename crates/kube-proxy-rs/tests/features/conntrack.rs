//! Upstream's `SIGDescribe("Conntrack")` (test/e2e/network/conntrack.go) and
//! `SIGDescribe("KubeProxy")` (kube_proxy.go) scenarios, each named after its `It(...)`.
//!
//! UDP has no connection to close: a client that keeps its socket keeps its conntrack
//! entry, and the entry keeps sending its datagrams to the endpoint it was DNATed to.
//! Upstream's clients (`nc -u -p 12345` in a loop) are [`kpr_netns::UdpFlow`]s here: one
//! source port, a datagram every 100 ms. The pods that leave a Service keep serving, so a
//! flow that still reaches one after it left is a stale entry the proxy failed to delete.
//! "A second node" is an endpoint whose `nodeName` is node2, as elsewhere in the suite.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use kpr_netns::{CLIENT_IP, NODE_IP, Netns, Segment, UdpFlow, eventually, pod_ip};
use serde_json::{Value, json};

use crate::Mode;
use crate::manifests::{Manifests, conditions};
use crate::objects::{
    OTHER_NODE, endpoint, ready, ready_here, service, slice, slice_port, tcp_port, udp_port, with_node_port,
};
use crate::stage::{POD_PORT, Stage};
use crate::support::{CONVERGE, POLL};
use crate::traffic::{Outcome, at};

const FILE: &str = "conntrack.yaml";
/// Upstream's client source port.
const SOURCE_PORT: u16 = 12345;
/// How often a flow sends.
const FLOW_INTERVAL: Duration = Duration::from_millis(100);
/// A flow has moved once its last replies all come from the pod wanted.
const SETTLED: usize = 3;

netfilter_modes!(
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service,
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service,
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service_and_client_is_hostnetwork,
    should_be_able_to_preserve_udp_traffic_when_initial_unready_endpoints_get_ready,
    proxy_implementation_should_not_be_vulnerable_to_the_invalid_conntrack_state_bug,
    should_set_tcp_close_wait_timeout,
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service_with_internaltrafficpolicy_set_to_local,
);
// Not the internalTrafficPolicy scenario: userspace mode ignores traffic policies (see
// `kernel_modes!`). ipvs mode: see docs/upstream-e2e.md.
in_mode!(userspace, crate::Mode::Userspace;
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service,
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service,
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service_and_client_is_hostnetwork,
    should_be_able_to_preserve_udp_traffic_when_initial_unready_endpoints_get_ready,
    proxy_implementation_should_not_be_vulnerable_to_the_invalid_conntrack_state_bug,
    should_set_tcp_close_wait_timeout
);

/// The cluster IP of scenario Service `n`.
pub fn vip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 21, n)
}

/// UDP Service `name` on `vip(n)`:80 (a NodePort Service when `node_port` is given, with
/// `extra` merged into its spec) and its slice with `endpoints`.
pub fn udp_service(
    name: &str,
    n: u8,
    node_port: Option<u16>,
    extra: Value,
    endpoints: Vec<Value>,
) -> Vec<Value> {
    let mut spec = match node_port {
        Some(node_port) => {
            json!({"type": "NodePort", "ports": [with_node_port(udp_port("udp", 80), node_port)]})
        }
        None => json!({"ports": [udp_port("udp", 80)]}),
    };
    crate::objects::merge(&mut spec, extra);
    vec![
        service(name, vip(n), spec),
        slice(name, json!([slice_port("udp", "UDP", POD_PORT)]), endpoints),
    ]
}

/// The scenario's file: `docs` and this node's Node. The Node gives the proxy its node IP,
/// which userspace mode's portal for the node's own traffic DNATs to: without it the
/// fallback is loopback, and UDP replies to a host-network client would leave from the
/// node's address instead, which its conntrack entry does not expect.
fn with_node(docs: Vec<Value>) -> Manifests {
    Manifests::new(FILE, [vec![crate::objects::this_node()], docs].concat())
}

/// A stage whose pods `udp_pods` also serve UDP on [`POD_PORT`].
fn udp_stage(mode: Mode, pods: usize, udp_pods: &[usize], manifests: &Manifests) -> Stage {
    let mut stage = Stage::start(mode, pods, manifests);
    for &pod in udp_pods {
        stage.serve_udp(pod, POD_PORT);
    }
    stage
}

/// Starts upstream's client in `ns`: a flow to `to` from [`SOURCE_PORT`].
pub fn flow(ns: &Netns, to: SocketAddr) -> UdpFlow {
    ns.udp_flow(SOURCE_PORT, to, FLOW_INTERVAL).unwrap()
}

/// The pod that answered `reply` (`"pod3 from 10.244.1.12"`), if a pod did.
fn answered_by(reply: &str) -> Option<String> {
    let outcome = Outcome::from_replies(BTreeMap::from([(reply.to_owned(), 1)]));
    outcome.pods().first().map(|pod| (*pod).to_owned())
}

/// Waits until the last [`SETTLED`] datagrams of `flow` were all answered by `pod`.
#[track_caller]
pub fn wait_flow_reaches(flow: &UdpFlow, pod: &str) {
    eventually(CONVERGE, POLL, || {
        let replies = flow.replies();
        let last = &replies[replies.len().saturating_sub(SETTLED)..];
        if last.len() == SETTLED && last.iter().all(|r| answered_by(r).as_deref() == Some(pod)) {
            Ok(())
        } else {
            Err(format!(
                "the flow to {} should reach {pod}; its last replies: {:?}",
                flow.to(),
                &replies[replies.len().saturating_sub(10)..]
            ))
        }
    });
}

/// Waits until the last [`SETTLED`] datagrams of `flow` were answered by no pod.
#[track_caller]
pub fn wait_flow_unanswered(flow: &UdpFlow) {
    eventually(CONVERGE, POLL, || {
        let replies = flow.replies();
        let last = &replies[replies.len().saturating_sub(SETTLED)..];
        if last.len() == SETTLED && last.iter().all(|r| answered_by(r).is_none()) {
            Ok(())
        } else {
            Err(format!(
                "the flow to {} should go unanswered; its last replies: {:?}",
                flow.to(),
                &replies[replies.len().saturating_sub(10)..]
            ))
        }
    });
}

/// Upstream's sequence: the client sends before the Service has a pod; pod1 (here pod0)
/// comes, the client reaches it; pod2 (here pod1) comes and pod1 goes, and the client,
/// still on its one source port, reaches pod2. The pods serve throughout: only deleting the
/// flow's entry moves it.
fn cycle_server_pods(mode: Mode, name: &str, n: u8, node_port: Option<u16>, node: &str, client: Client) {
    let mut manifests = with_node(udp_service(name, n, node_port, json!({}), vec![]));
    let stage = udp_stage(mode, 3, &[0, 1], &manifests);
    let to = match node_port {
        Some(node_port) => at(NODE_IP, node_port),
        None => at(vip(n), 80),
    };
    let flow = flow(client.ns(&stage), to);
    manifests.set_endpoints(name, vec![ready(0, node)]);
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod0");
    manifests.set_endpoints(name, vec![ready(1, node)]);
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod1");
}

/// Where upstream's client runs.
#[derive(Clone, Copy)]
enum Client {
    /// A pod on this node.
    Pod,
    /// A host-network pod: the node itself.
    Node,
    /// Another node's pod reaching this node's NodePort: the outside client.
    Outside,
}

impl Client {
    fn ns(self, stage: &Stage) -> &Netns {
        match self {
            Client::Pod => stage.lab().pod(2),
            Client::Node => stage.lab().node(),
            Client::Outside => stage.lab().client(),
        }
    }
}

/// The client on another node sends to this node's NodePort; the server pods are on this
/// node.
pub(crate) fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service(
    mode: Mode,
) {
    cycle_server_pods(
        mode,
        "svc-udp",
        10,
        Some(30241),
        crate::support::NODE_NAME,
        Client::Outside,
    );
}

/// The client pod on this node sends to the cluster IP; the server pods are on node2.
fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service(mode: Mode) {
    cycle_server_pods(mode, "svc-udp", 11, None, OTHER_NODE, Client::Pod);
}

/// As the ClusterIP scenario, the client on the node's own network.
fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service_and_client_is_hostnetwork(
    mode: Mode,
) {
    cycle_server_pods(mode, "svc-udp", 12, None, OTHER_NODE, Client::Node);
}

/// Upstream issue #126934: a DaemonSet serves the Service, whose internalTrafficPolicy is
/// Local, so the client pod reaches this node's server pod (pod0; node2's is pod1). That
/// pod is recreated (pod3 here): the client, still on its source port, reaches the new one.
fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service_with_internaltrafficpolicy_set_to_local(
    mode: Mode,
) {
    let local = json!({"internalTrafficPolicy": "Local"});
    let mut manifests = with_node(udp_service(
        "svc-udp",
        13,
        None,
        local,
        vec![ready_here(0), ready(1, OTHER_NODE)],
    ));
    let stage = udp_stage(mode, 4, &[0, 1, 3], &manifests);
    let flow = flow(stage.lab().pod(2), at(vip(13), 80));
    wait_flow_reaches(&flow, "pod0");
    manifests.set_endpoints("svc-udp", vec![ready(1, OTHER_NODE), ready_here(3)]);
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod3");
}

/// Upstream issue #105657: the server pod's init container keeps it unready for a while;
/// the client sends all along. Once the pod is ready, the client reaches it (no entry made
/// while there was no ready endpoint may keep its datagrams elsewhere).
fn should_be_able_to_preserve_udp_traffic_when_initial_unready_endpoints_get_ready(mode: Mode) {
    let unready = endpoint(0, OTHER_NODE, conditions(false, false, false));
    let mut manifests = with_node(udp_service("svc-udp", 14, None, json!({}), vec![unready]));
    let stage = udp_stage(mode, 3, &[0], &manifests);
    let flow = flow(stage.lab().pod(2), at(vip(14), 80));
    wait_flow_unanswered(&flow);
    manifests.set_endpoints("svc-udp", vec![ready(0, OTHER_NODE)]);
    stage.apply(&manifests);
    wait_flow_reaches(&flow, "pod0");
}

/// Upstream issue #74839, with upstream's "boom server": pod0 serves TCP 9000 behind a
/// Service; a pod connects through the Service, and pod0 then sends segments far outside
/// the connection's window (as a spurious retransmission can be) that acknowledge exactly
/// what the client sent. Conntrack marks them INVALID. Were they let through, they would
/// reach the client un-NATed (from pod0's own address), the client would answer with a
/// reset carrying that acknowledgement as its sequence number, and pod0 would take it: the
/// connection dies. The proxy drops them (or, in userspace mode, holds the connection
/// itself, whose socket ignores them): the connection keeps working both ways.
pub(crate) fn proxy_implementation_should_not_be_vulnerable_to_the_invalid_conntrack_state_bug(mode: Mode) {
    let manifests = Manifests::new(
        FILE,
        vec![
            service("boom-server", vip(15), json!({"ports": [tcp_port("boom", 9000)]})),
            slice(
                "boom-server",
                json!([slice_port("boom", "TCP", 9000)]),
                vec![ready_here(0)],
            ),
        ],
    );
    let stage = Stage::start(mode, 2, &manifests);
    let server = at(pod_ip(0), 9000);
    let listener = stage.lab().pod(0).run(|| TcpListener::bind(server).unwrap());
    let capture = stage.lab().pod(0).capture_tcp(9000).unwrap();
    let to = at(vip(15), 9000);
    // The first connections may find the rules not in yet.
    let mut client = eventually(CONVERGE, POLL, || {
        stage
            .lab()
            .pod(1)
            .run(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)))
            .map_err(|err| format!("connecting to {to}: {err}"))
    });
    let (mut accepted, _) = listener.accept().unwrap();
    for stream in [&client, &accepted] {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    exchange(&mut client, &mut accepted, b"hello");
    // The client's "hello" as pod0 received it: whom pod0 talks to, and the numbers.
    let hello = capture
        .segment_carrying(b"hello", Duration::from_secs(5))
        .unwrap();
    for i in 0..3_u32 {
        stage
            .lab()
            .pod(0)
            .send_tcp_segment(&Segment {
                from: hello.to,
                to: hello.from,
                // pod0's next byte would be hello.ack + 5: this is a quarter of the
                // sequence space past any window.
                seq: hello.ack.wrapping_add(5 + 0x4000_0000 + i * 1000),
                ack: hello.seq.wrapping_add(5),
                payload: b"boom".to_vec(),
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    // A reset, had one been sent, has long arrived; the connection must still carry bytes.
    std::thread::sleep(Duration::from_millis(500));
    exchange(&mut client, &mut accepted, b"still here");
}

/// One message each way over a held connection; panics on any failure (a reset shows as
/// `ConnectionReset` or an early end of stream).
#[track_caller]
fn exchange(client: &mut TcpStream, served: &mut TcpStream, message: &[u8]) {
    let mut buf = vec![0_u8; message.len()];
    client.write_all(message).unwrap();
    served
        .read_exact(&mut buf)
        .unwrap_or_else(|err| panic!("the server's side of the connection: {err}"));
    assert_eq!(buf, message);
    served.write_all(message).unwrap();
    client
        .read_exact(&mut buf)
        .unwrap_or_else(|err| panic!("the client's side of the connection: {err}"));
    assert_eq!(buf, message);
}

/// A client pod connects to a server on another node (here the outside client's address);
/// the server closes its side and the client does not: the node's conntrack entry for the
/// connection is in CLOSE_WAIT, with the timeout kube-proxy sets for that state (1 h by
/// default; the kernel's own is 60 s).
fn should_set_tcp_close_wait_timeout(mode: Mode) {
    const PORT: u16 = 11302;
    let stage = Stage::start(mode, 1, &Manifests::new(FILE, vec![]));
    let server = at(CLIENT_IP, PORT);
    let listener = stage.lab().client().run(|| TcpListener::bind(server).unwrap());
    let client = stage
        .lab()
        .pod(0)
        .run(|| TcpStream::connect_timeout(&server, Duration::from_secs(5)))
        .unwrap();
    let (accepted, _) = listener.accept().unwrap();
    accepted.shutdown(std::net::Shutdown::Write).unwrap();
    let listing = eventually(CONVERGE, POLL, || {
        let listing = stage
            .lab()
            .node()
            .sh(&format!("conntrack -L -p tcp --dport {PORT} 2>/dev/null"))
            .map_err(|err| err.to_string())?;
        if listing.contains("CLOSE_WAIT") {
            Ok(listing)
        } else {
            Err(format!("no CLOSE_WAIT entry yet:\n{listing}"))
        }
    });
    let timeout: u64 = listing
        .lines()
        .find(|line| line.contains("CLOSE_WAIT"))
        .and_then(|line| line.split_whitespace().nth(2))
        .and_then(|field| field.parse().ok())
        .unwrap_or_else(|| panic!("no timeout in the entry:\n{listing}"));
    assert!(
        (3600 - 60..=3600).contains(&timeout),
        "the CLOSE_WAIT entry's timeout is {timeout} s, want about 3600:\n{listing}"
    );
    drop((client, accepted));
}

/// `conntrack -L` inside the node: the UDP entries to `to`.
pub fn udp_entries_to(stage: &Stage, to: SocketAddr) -> String {
    stage
        .lab()
        .node()
        .sh(&format!(
            "conntrack -L -p udp --orig-dst {} --orig-port-dst {} 2>/dev/null",
            to.ip(),
            to.port()
        ))
        .unwrap()
}
