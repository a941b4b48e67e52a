//! ebpf mode's own claim, proven on the lab: a pod's or the node's connection to a cluster
//! IP is given the pod's address at `connect()`, so the node's conntrack table holds no
//! entry to the Service address (no DNAT), while the answer is the same as nftables mode's.
//! nftables mode plays it too, as the control: there the entry is there.

use std::net::Ipv4Addr;

use serde_json::json;

use crate::manifests::Manifests;
use crate::mode::Mode;
use crate::objects::{ready_here, service, slice, slice_port, tcp_port, this_node};
use crate::stage::{POD_PORT, Stage};
use crate::traffic::at;

in_mode!(ebpf, crate::Mode::Ebpf; local_connections_to_a_cluster_ip_are_not_nated);
in_mode!(nftables, crate::Mode::Nftables; local_connections_to_a_cluster_ip_are_not_nated);

const FILE: &str = "socket-layer.yaml";
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 30, 1);

fn local_connections_to_a_cluster_ip_are_not_nated(mode: Mode) {
    let manifests = Manifests::new(
        FILE,
        vec![
            this_node(),
            service("direct", VIP, json!({"ports": [tcp_port("http", 80)]})),
            slice(
                "direct",
                json!([slice_port("http", "TCP", POD_PORT)]),
                vec![ready_here(1), ready_here(2)],
            ),
        ],
    );
    let stage = Stage::start(mode, 3, &manifests);
    let to = at(VIP, 80);
    // From pod 0 and from the node: every connection answered by pod 1 or 2.
    let from_pod = stage.pod(0).wait_answered_by(to, 20, &["pod1", "pod2"]);
    let from_node = stage.node().wait_answered_by(to, 20, &["pod1", "pod2"]);
    let entries = stage
        .lab()
        .node()
        .sh(&format!("conntrack -L -p tcp --orig-dst {VIP} 2>/dev/null; true"))
        .unwrap();
    let nated = entries.lines().filter(|line| line.contains("dport=80")).count();
    match mode {
        Mode::Ebpf => assert_eq!(
            nated, 0,
            "no conntrack entry to the Service address in ebpf mode:\n{entries}\n{from_pod:?} {from_node:?}"
        ),
        _ => assert!(nated > 0, "nftables mode DNATs the Service address:\n{entries}"),
    }
}
