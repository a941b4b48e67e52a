//! Kernel tests: what upstream's ipvs mode leaves, made with the admin's tools (`ipset`,
//! `ip`, `nft`) inside a network namespace the test creates, removed by [`remove_all`]
//! inside it; the same tools then show what is left. Foreign objects with similar names
//! (and other modes' objects) must survive. Nothing touches the root namespace, and
//! dropping the namespace frees everything, also when a test panics.
//!
//! The kernel needs ipset and veth/bridge (IPVS is absent on CI's kernel: its absence must
//! be reported as "nothing to remove", which every test here exercises).

#![allow(clippy::unwrap_used)]

use kpr_ipvs::leftovers::remove_all;
use kpr_ipvs_netlink::IPVS_LINK;
use kpr_netns::Netns;

/// A namespace holding what upstream's IPVS mode leaves, nftables mode's tables (another
/// mode's: they stay), and look-alikes that are not upstream's.
fn node_with_leftovers() -> Netns {
    let node = Netns::new("leftovers").unwrap();
    node.sh(
        "nft add table ip kube-proxy && nft add chain ip kube-proxy services && \
         nft add table ip6 kube-proxy && nft add chain ip6 kube-proxy services && \
         nft add table inet kube-proxy && nft add table ip user-table && \
         ipset create KUBE-CLUSTER-IP hash:ip,port && \
         ipset create KUBE-6-CLUSTER-IP hash:ip,port family inet6 && \
         ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 && \
         ipset create KUBE-MINE hash:ip && ipset create user-set hash:ip && \
         ip link add kube-ipvs0 type bridge && ip addr add 10.96.0.1/32 dev kube-ipvs0 && \
         ip link add kube-ipvs1 type bridge",
    )
    .expect("making leftovers needs nft, ipset, iproute2 and bridge support");
    node
}

fn tables(node: &Netns) -> Vec<String> {
    let mut tables: Vec<String> = node
        .sh("nft list tables")
        .unwrap()
        .lines()
        .map(|l| l.trim_start_matches("table ").to_string())
        .collect();
    tables.sort();
    tables
}

fn sets(node: &Netns) -> Vec<String> {
    let mut sets: Vec<String> = node
        .sh("ipset list -n")
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    sets.sort();
    sets
}

fn has_link(node: &Netns, name: &str) -> bool {
    node.ip(&["link", "show", name]).is_ok()
}

#[test]
fn removes_upstreams_tables_link_and_sets_and_nothing_else() {
    let node = node_with_leftovers();
    let report = node.run(remove_all);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let mut removed = report.removed.clone();
    removed.sort();
    assert_eq!(
        removed,
        [
            "ipset KUBE-6-CLUSTER-IP",
            "ipset KUBE-CLUSTER-IP",
            "ipset KUBE-NODE-PORT-TCP",
            "link kube-ipvs0",
        ]
    );
    assert_eq!(
        tables(&node),
        [
            "inet kube-proxy",
            "ip kube-proxy",
            "ip user-table",
            "ip6 kube-proxy"
        ],
        "nftables mode's tables are that mode's to remove"
    );
    assert_eq!(sets(&node), ["KUBE-MINE", "user-set"]);
    assert!(!has_link(&node, IPVS_LINK));
    assert!(has_link(&node, "kube-ipvs1"), "a look-alike link stays");

    let again = node.run(remove_all);
    assert!(again.failures.is_empty() && again.removed.is_empty(), "{again:?}");
}

#[test]
fn a_set_still_used_by_a_foreign_rule_is_reported_by_name_and_the_rest_goes() {
    let node = node_with_leftovers();
    node.sh("iptables -N USER-CHAIN && iptables -A USER-CHAIN -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT")
        .unwrap();
    let report = node.run(remove_all);
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    let failure = report.failures[0].clone();
    assert!(
        failure.starts_with("ipset KUBE-CLUSTER-IP: ") && failure.contains("in use"),
        "{failure}"
    );
    assert!(sets(&node).contains(&"KUBE-CLUSTER-IP".to_string()));
    assert!(
        !sets(&node).contains(&"KUBE-NODE-PORT-TCP".to_string()),
        "the other sets still go"
    );
    assert!(!has_link(&node, IPVS_LINK));
}

#[test]
fn a_clean_node_has_nothing_to_remove() {
    let node = Netns::new("clean").unwrap();
    let report = node.run(remove_all);
    assert!(
        report.failures.is_empty() && report.removed.is_empty(),
        "{report:?}"
    );
}
