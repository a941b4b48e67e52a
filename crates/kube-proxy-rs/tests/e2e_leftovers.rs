//! kube-proxy-rs end to end, on what other kube-proxy modes leave behind and on upstream's
//! nfacct packet metrics: the real binary in the node namespace of a lab this test builds,
//! the leftovers made with the admin's tools as upstream's IPVS and nftables modes make
//! them, and real packets for the counters. Deadlines are ceilings against hangs.
//!
//! Scenarios a user can read:
//! - a node switched from IPVS or nftables mode to kube-proxy-rs loses the old mode's
//!   tables, chains, sets and `kube-ipvs0` at start-up, keeps everything that is not
//!   kube-proxy's, and serves its Services;
//! - `--cleanup` removes every mode's leftovers, and names what it could not remove; where
//!   there were no iptables tables it creates none (a legacy table, once there, costs every
//!   packet);
//! - connections to a NodePort on 127.0.0.1, and packets conntrack marks INVALID, show
//!   in `kubeproxy_iptables_localhost_nodeports_accepted_packets_total` and
//!   `kubeproxy_iptables_ct_state_invalid_dropped_packets_total`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use kpr_netns::{Netns, eventually, pod_ip};
use support::*;

/// What upstream's IPVS mode (chains, rules using its sets, sets, `kube-ipvs0` with a
/// service address) and nftables mode (`ip`/`ip6 kube-proxy`) leave on a node.
const LEFTOVERS: &str = "\
    nft add table ip kube-proxy && nft add chain ip kube-proxy services && \
    nft add table ip6 kube-proxy && nft add chain ip6 kube-proxy services && \
    ipset create KUBE-CLUSTER-IP hash:ip,port && ipset create KUBE-LOOP-BACK hash:ip,port,ip && \
    ipset create KUBE-IPVS-IPS hash:ip && ipset add KUBE-IPVS-IPS 10.96.0.99 && \
    ipset create KUBE-6-CLUSTER-IP hash:ip,port family inet6 && \
    ip link add kube-ipvs0 type bridge && ip addr add 10.96.0.99/32 dev kube-ipvs0 && \
    iptables -t nat -N KUBE-SERVICES && iptables -t nat -N KUBE-NODE-PORT && \
    iptables -t nat -N KUBE-LOAD-BALANCER && iptables -t nat -N KUBE-POSTROUTING && \
    iptables -t nat -A PREROUTING -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES && \
    iptables -t nat -A POSTROUTING -m comment --comment 'kubernetes postrouting rules' -j KUBE-POSTROUTING && \
    iptables -t nat -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT && \
    iptables -t nat -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT && \
    iptables -t nat -A KUBE-POSTROUTING -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE && \
    iptables -N KUBE-IPVS-FILTER && \
    iptables -A INPUT -m comment --comment 'kubernetes ipvs access filter' -j KUBE-IPVS-FILTER && \
    iptables -A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT";

/// The admin's own objects, with names close to kube-proxy's: never touched.
const FOREIGN: &str = "\
    nft add table inet kube-proxy && nft add table ip user-table && \
    ipset create KUBE-MINE hash:ip && ipset create user-set hash:ip && \
    ip link add kube-ipvs1 type bridge && \
    iptables -N USER-CHAIN && iptables -A USER-CHAIN -s 10.9.9.9/32 -j ACCEPT && \
    iptables -A INPUT -j USER-CHAIN";

fn make(node: &Netns, script: &str) {
    node.sh(script)
        .expect("making leftovers needs nft, ipset, iptables and bridge support");
}

fn nft_tables(node: &Netns) -> String {
    node.sh("nft list tables").unwrap()
}

fn ipsets(node: &Netns) -> Vec<String> {
    node.sh("ipset list -n")
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn has_link(node: &Netns, name: &str) -> bool {
    node.ip(&["link", "show", name]).is_ok()
}

/// Every upstream leftover is gone; every foreign object is there.
fn assert_only_foreign_objects_left(node: &Netns, iptables: &str) {
    let tables = nft_tables(node);
    assert!(!tables.contains("table ip kube-proxy"), "{tables}");
    assert!(!tables.contains("table ip6 kube-proxy"), "{tables}");
    assert!(tables.contains("table inet kube-proxy"), "{tables}");
    assert!(tables.contains("table ip user-table"), "{tables}");
    let mut sets = ipsets(node);
    sets.sort();
    assert_eq!(sets, ["KUBE-MINE", "user-set"]);
    assert!(!has_link(node, "kube-ipvs0"));
    assert!(has_link(node, "kube-ipvs1"));
    for ipvs_only in [
        "KUBE-IPVS-FILTER",
        "KUBE-NODE-PORT ",
        "KUBE-LOAD-BALANCER",
        "--match-set",
    ] {
        assert!(!iptables.contains(ipvs_only), "{ipvs_only} left:\n{iptables}");
    }
    assert!(
        iptables.contains("-A USER-CHAIN -s 10.9.9.9/32 -j ACCEPT"),
        "{iptables}"
    );
    assert!(iptables.contains("-A INPUT -j USER-CHAIN"), "{iptables}");
}

#[test]
fn starting_removes_what_ipvs_and_nftables_modes_left_and_serves() {
    let mut cluster = Cluster::new(1);
    cluster.tcp_backends(&[0], 8080);
    cluster.write("web.yaml", &web_yaml(&[0], Some(30080)));
    make(cluster.node(), LEFTOVERS);
    make(cluster.node(), FOREIGN);

    cluster.start_proxy(&[]);
    wait_spread(cluster.lab.pod(0), sock(WEB_VIP), 5, &["pod0"]);
    let iptables = cluster.iptables_save();
    assert_only_foreign_objects_left(cluster.node(), &iptables);
    assert!(
        iptables.contains("KUBE-SVC-"),
        "our own rules are in place:\n{iptables}"
    );
    let logs = cluster.proxy_logs();
    assert!(logs.contains("link kube-ipvs0"), "the removal is logged:\n{logs}");
}

#[test]
fn cleanup_removes_every_modes_leftovers_and_nothing_else() {
    let mut cluster = Cluster::new(1);
    cluster.tcp_backends(&[0], 8080);
    cluster.write("web.yaml", &web_yaml(&[0], Some(30080)));
    cluster.start_proxy(&[]);
    wait_spread(cluster.node(), sock(WEB_VIP), 5, &["pod0"]);
    cluster.proxy.take().unwrap().stop().unwrap();
    // Made after our run, so only --cleanup can have removed them.
    // (KUBE-SERVICES and KUBE-POSTROUTING are ours now; IPVS mode's rules go into them.)
    let leftovers = LEFTOVERS
        .replace("iptables -t nat -N KUBE-SERVICES && ", "")
        .replace("iptables -t nat -N KUBE-POSTROUTING && ", "");
    make(cluster.node(), &leftovers);
    make(cluster.node(), FOREIGN);

    let out = cluster
        .node()
        .command(proxy_binary())
        .arg("--cleanup")
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    let iptables = cluster.iptables_save() + &cluster.node().sh("iptables-legacy-save").unwrap();
    assert_only_foreign_objects_left(cluster.node(), &iptables);
    let kube: Vec<&str> = iptables.lines().filter(|l| l.contains("KUBE-")).collect();
    assert!(kube.is_empty(), "left behind: {kube:?}");
}

/// Looking for leftovers never creates a table: legacy iptables instantiates a table in the
/// namespace on the first `-t` naming it, and from then on the table's hooks see every
/// packet of the node. A node that never had iptables tables has none after `--cleanup`.
#[test]
fn cleanup_creates_no_iptables_table_where_there_was_none() {
    let node = Netns::new("notab").unwrap();
    let tables = || node.sh("cat /proc/net/ip_tables_names /proc/net/ip6_tables_names; nft list tables");
    assert_eq!(tables().unwrap(), "", "a new namespace has no tables");
    let out = node.command(proxy_binary()).arg("--cleanup").output().unwrap();
    let logs = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert_eq!(tables().unwrap(), "", "--cleanup created tables:\n{logs}");
}

#[test]
fn cleanup_names_the_set_a_foreign_rule_still_uses_and_exits_1() {
    let cluster = Cluster::new(1);
    make(cluster.node(), LEFTOVERS);
    make(
        cluster.node(),
        "iptables -N USER-SETS && iptables -A USER-SETS -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
    );
    let out = cluster
        .node()
        .command(proxy_binary())
        .arg("--cleanup")
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("ipset KUBE-CLUSTER-IP"),
        "the set is not named:\n{logs}"
    );
    assert_eq!(
        ipsets(cluster.node()),
        ["KUBE-CLUSTER-IP"],
        "everything else went"
    );
    assert!(!has_link(cluster.node(), "kube-ipvs0"));
    assert!(
        cluster.iptables_save().contains("-A USER-SETS"),
        "the user's rule stays"
    );
}

/// A connection from `client` to `server`, through the node, with one exchange done.
fn connected(client: &Netns, server: &Netns, address: SocketAddr) -> (TcpStream, TcpStream) {
    let listener = server.run(|| TcpListener::bind(address)).unwrap();
    let mut outgoing = client
        .run(|| TcpStream::connect_timeout(&address, Duration::from_secs(5)))
        .unwrap();
    let (mut incoming, _) = listener.accept().unwrap();
    outgoing.write_all(b"a").unwrap();
    let mut byte = [0];
    incoming.read_exact(&mut byte).unwrap();
    (outgoing, incoming)
}

const LOCALHOST_ACCEPTED: &str = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
const INVALID_DROPPED: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";

#[test]
fn localhost_nodeport_and_invalid_packets_show_in_upstreams_metrics() {
    let mut cluster = Cluster::new(1);
    cluster.tcp_backends(&[0], 8080);
    cluster.write("web.yaml", &web_yaml(&[0], Some(30080)));
    cluster.start_proxy(&[]);
    assert_eq!(
        cluster.metric(LOCALHOST_ACCEPTED),
        Some(0.0),
        "counters start at 0"
    );
    assert_eq!(cluster.metric(INVALID_DROPPED), Some(0.0));

    // Three connections to the NodePort on 127.0.0.1, one on the node's own address.
    let localhost = sock("127.0.0.1:30080");
    wait_spread(cluster.node(), localhost, 3, &["pod0"]);
    wait_spread(cluster.node(), sock("192.168.77.1:30080"), 1, &["pod0"]);
    assert_eq!(cluster.metric(LOCALHOST_ACCEPTED), Some(3.0));

    // The client talks to a pod through the node; then the node forgets the connection,
    // and (with loose pickup off) its next packets are INVALID there: dropped and counted.
    let node = cluster.node();
    node.set_sysctl("net.netfilter.nf_conntrack_tcp_loose", "0")
        .unwrap();
    let server = SocketAddr::new(pod_ip(0).into(), 9000);
    let (mut outgoing, _incoming) = connected(cluster.lab.client(), cluster.lab.pod(0), server);
    node.sh("conntrack -F").unwrap();
    outgoing.write_all(b"b").unwrap();
    eventually(CONVERGE, POLL, || match cluster.metric(INVALID_DROPPED) {
        Some(dropped) if dropped >= 1.0 => Ok(()),
        other => Err(format!("{INVALID_DROPPED}: {other:?}")),
    });
}
