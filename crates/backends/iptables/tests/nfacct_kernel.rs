//! Kernel tests for upstream's nfacct counters: created through nfnetlink_acct in a
//! network namespace the test creates (each namespace has its own), matched by the rules
//! the real [`IptablesBackend`] writes with each iptables variant, and moved by real
//! connections, read back through the same netlink code the metrics use.
//!
//! Variants follow kernel.rs: both must work; `KPR_SKIP_IPTABLES_VARIANTS` may name one a
//! machine cannot run (CI never sets it).

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::skip_requested;
use kpr_iptables::{
    Accounting, CT_STATE_INVALID_DROPPED, IptablesBackend, IptablesCli, IptablesOptions,
    LOCALHOST_NODEPORTS_ACCEPTED, NetlinkAccounting, NfacctCounters, Variant, ensure_counters,
};
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_world::{World, ep};
use serde_json::json;

const POD: &str = "10.244.1.5";

fn packets(ns: &Netns, counter: &str) -> u64 {
    ns.run(|| NetlinkAccounting.get(counter))
        .unwrap()
        .unwrap_or_else(|| panic!("counter {counter} is gone"))
        .packets
}

/// Counters made in a fresh namespace: none before, both after, at 0, and a second
/// ensure keeps them (and their counts).
#[test]
fn counters_are_created_once_per_namespace() {
    let ns = Netns::new("nfacct").unwrap();
    let before = ns
        .run(|| NetlinkAccounting.get(LOCALHOST_NODEPORTS_ACCEPTED))
        .unwrap();
    assert_eq!(before, None, "a new namespace has no counters");
    assert_eq!(
        ns.run(|| ensure_counters(&NetlinkAccounting)),
        NfacctCounters::ALL
    );
    assert_eq!(packets(&ns, LOCALHOST_NODEPORTS_ACCEPTED), 0);
    assert_eq!(packets(&ns, CT_STATE_INVALID_DROPPED), 0);
    assert_eq!(
        ns.run(|| ensure_counters(&NetlinkAccounting)),
        NfacctCounters::ALL
    );
}

/// A NodePort Service on 30080 whose one endpoint listens on an address of the
/// namespace's loopback, so the namespace is node and pod at once.
fn localhost_nodeport_connections_are_counted(variant: Variant) {
    if skip_requested(variant) {
        return;
    }
    let ns = Netns::new("nfacct").unwrap();
    let counters = ns.run(|| ensure_counters(&NetlinkAccounting));
    ns.ip(&["addr", "add", &format!("{POD}/32"), "dev", "lo"])
        .unwrap();
    ns.set_sysctl("net.ipv4.conf.all.route_localnet", "1").unwrap();
    let _pod = ns
        .tcp_backend(format!("{POD}:8080").parse().unwrap(), "pod")
        .unwrap();
    let opts = IptablesOptions {
        nfacct: counters,
        ..IptablesOptions::default()
    };
    let cli = IptablesCli::in_netns(IpFamily::V4, variant, ns.name());
    let mut backend = IptablesBackend::new(opts, Box::new(cli)).unwrap();
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        )
        .slice("web", json!([{"name": "http", "port": 8080}]), vec![ep(POD)]);
    let pending = world.pending();
    backend
        .sync_rules(&pending.request(false))
        .unwrap_or_else(|e| panic!("the kernel refused the nfacct rules: {e}"));

    let localhost: SocketAddr = "127.0.0.1:30080".parse().unwrap();
    for _ in 0..3 {
        assert_eq!(ns.tcp_request(localhost, Duration::from_secs(5)).unwrap(), "pod");
    }
    // The nat table sees the first packet of each connection only.
    assert_eq!(packets(&ns, LOCALHOST_NODEPORTS_ACCEPTED), 3);
    // The same NodePort on the pod's address is not counted as localhost.
    let direct: SocketAddr = format!("{POD}:30080").parse().unwrap();
    assert_eq!(ns.tcp_request(direct, Duration::from_secs(5)).unwrap(), "pod");
    assert_eq!(packets(&ns, LOCALHOST_NODEPORTS_ACCEPTED), 3);
}

#[test]
fn localhost_nodeport_connections_are_counted_legacy() {
    localhost_nodeport_connections_are_counted(Variant::Legacy);
}

#[test]
fn localhost_nodeport_connections_are_counted_nft() {
    localhost_nodeport_connections_are_counted(Variant::Nft);
}
