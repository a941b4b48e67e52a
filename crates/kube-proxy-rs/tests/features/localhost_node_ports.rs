//! NodePorts on the node's loopback address in nftables mode (upstream 1.37, KEP-6032): with
//! the gate `KubeProxyNFTablesLocalhostNodePorts` and `localhost` among the NodePort
//! addresses, a process on the node reaches a TCP Service through `127.0.0.1:<nodePort>`,
//! carried by the proxy's own listener; UDP there is rejected and counted in
//! `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`.
//!
//! nftables mode only: iptables and userspace modes serve localhost NodePorts through
//! `route_localnet` and a DNAT (`--iptables-localhost-nodeports`, upstream's, without a
//! gate), and ipvs mode not at all, as upstream's.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use kpr_netns::NODE_IP;
use serde_json::json;

use crate::Mode;
use crate::manifests::Manifests;
use crate::objects::{
    OTHER_NODE, ready, ready_here, service, slice, slice_port, tcp_port, this_node, udp_port, with_node_port,
};
use crate::stage::{POD_PORT, Stage};
use crate::support::{CONVERGE, POLL};
use crate::traffic::at;

const FILE: &str = "localhost-node-ports.yaml";
const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

in_mode!(nftables, crate::Mode::Nftables;
    the_node_reaches_tcp_node_ports_on_localhost_and_udp_there_is_rejected_and_counted
);

/// `web` (Cluster policy: a pod here and one on node2), `local` (Local policy, the same
/// pods) and `dns` (UDP, a pod here). From the node, `127.0.0.1:<nodePort>` reaches both
/// pods of `web` and only this node's pod of `local`; UDP to `dns`'s NodePort there is
/// refused, each datagram counted, while on the node's address it is answered. The
/// metrics show one listener per TCP NodePort, no listener failure, and the rejected
/// packets. 40 requests to two pods miss one of them by chance with probability 2^-39.
fn the_node_reaches_tcp_node_ports_on_localhost_and_udp_there_is_rejected_and_counted(mode: Mode) {
    let tcp = |name: &str, n: u8, node_port: u16, extra: serde_json::Value| {
        let mut spec =
            json!({"type": "NodePort", "ports": [with_node_port(tcp_port("http", 80), node_port)]});
        crate::objects::merge(&mut spec, extra);
        vec![
            service(name, Ipv4Addr::new(10, 96, 23, n), spec),
            slice(
                name,
                json!([slice_port("http", "TCP", POD_PORT)]),
                vec![ready_here(0), ready(1, OTHER_NODE)],
            ),
        ]
    };
    let mut docs = vec![this_node()];
    docs.extend(tcp("web", 10, 30280, json!({})));
    docs.extend(tcp("local", 11, 30281, json!({"externalTrafficPolicy": "Local"})));
    docs.push(service(
        "dns",
        Ipv4Addr::new(10, 96, 23, 12),
        json!({"type": "NodePort", "ports": [with_node_port(udp_port("dns", 53), 30253)]}),
    ));
    docs.push(slice(
        "dns",
        json!([slice_port("dns", "UDP", POD_PORT)]),
        vec![ready_here(0)],
    ));
    let manifests = Manifests::new(FILE, docs);
    let mut stage = Stage::start_with(
        mode,
        2,
        &manifests,
        &[
            "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
            "--nodeport-addresses=primary,localhost",
        ],
    );
    stage.serve_udp(0, POD_PORT);

    let node = stage.node();
    node.wait_answered_by(at(LOCALHOST, 30280), 40, &["pod0", "pod1"]);
    node.wait_answered_by(at(LOCALHOST, 30281), 20, &["pod0"]);
    // The node's own address goes through the rules, as without the gate.
    node.wait_answered_by(at(NODE_IP, 30280), 40, &["pod0", "pod1"]);
    node.wait_udp_answered_by(at(NODE_IP, 30253), 3, &["pod0"]);

    let udp = node.udp_requests(at(LOCALHOST, 30253), 5);
    assert!(udp.answers.is_empty(), "{udp}");
    assert_eq!(
        udp.failures,
        BTreeMap::from([("connection refused".to_owned(), 5)]),
        "{udp}"
    );
    let sample = |name: &str, labels: &str| {
        stage.metric(&format!(
            "kubeproxy_nftables_localhost_nodeport_{name}{{{labels}}}"
        ))
    };
    // The counter is read from the table at each scrape.
    kpr_netns::eventually(CONVERGE, POLL, || {
        match sample("rejected_packets_total", "ip_family=\"IPv4\",protocol=\"UDP\"") {
            Some(5.0) => Ok(()),
            other => Err(format!("rejected UDP packets: {other:?}\n{}", stage.proxy_logs())),
        }
    });
    assert_eq!(
        sample("listeners", "ip_family=\"IPv4\""),
        Some(2.0),
        "{}",
        stage.proxy_logs()
    );
    assert_eq!(
        sample("listener_creation_failures_total", "ip_family=\"IPv4\"").unwrap_or(0.0),
        0.0,
        "{}",
        stage.proxy_logs()
    );
}
