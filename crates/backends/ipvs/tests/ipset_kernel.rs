//! The restore script against the real ipset in a throw-away namespace: what `ipset save`
//! reads back is what was wanted, after a first sync and after a change.

#![allow(clippy::unwrap_used)]

use kpr_ipvs::ipset::{Family, Member, Protocol, SetKind, SetSpec, Sets, parse_save, restore_script};
use kpr_netns::Netns;

const SPECS: [SetSpec; 4] = [
    SetSpec {
        name: "KUBE-CLUSTER-IP",
        kind: SetKind::IpPort,
        family: Family::V4,
    },
    SetSpec {
        name: "KUBE-NODE-PORT-UDP",
        kind: SetKind::Port,
        family: Family::V4,
    },
    SetSpec {
        name: "KUBE-6-LOOP-BACK",
        kind: SetKind::IpPortIp,
        family: Family::V6,
    },
    SetSpec {
        name: "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        kind: SetKind::IpPortNet,
        family: Family::V4,
    },
];

fn apply(node: &Netns, script: &str) {
    node.sh(&format!("ipset restore -exist <<'EOF'\n{script}EOF"))
        .unwrap();
}

fn read_back(node: &Netns) -> Sets {
    parse_save(&node.sh("ipset save").unwrap(), &SPECS).unwrap()
}

fn wanted(cluster_ips: &[&str]) -> Sets {
    let mut sets = Sets::default();
    for spec in SPECS {
        sets.declare(spec);
    }
    for ip in cluster_ips {
        let member = Member::IpPort(ip.parse().unwrap(), Protocol::Tcp, 443);
        sets.insert("KUBE-CLUSTER-IP", member).unwrap();
    }
    sets.insert("KUBE-NODE-PORT-UDP", Member::Port(30053)).unwrap();
    let hairpin = Member::IpPortIp(
        "fd00::5".parse().unwrap(),
        Protocol::Tcp,
        80,
        "fd00::5".parse().unwrap(),
    );
    sets.insert("KUBE-6-LOOP-BACK", hairpin).unwrap();
    let range = Member::IpPortNet(
        "203.0.113.1".parse().unwrap(),
        Protocol::Tcp,
        80,
        "192.0.2.0/24".parse().unwrap(),
    );
    sets.insert("KUBE-LOAD-BALANCER-SOURCE-CIDR", range).unwrap();
    sets
}

#[test]
fn the_kernel_holds_what_was_wanted_after_each_sync() {
    let node = Netns::new("ipset").unwrap();
    let first = wanted(&["10.96.0.1", "10.96.0.2"]);
    apply(&node, &restore_script(&first, &read_back(&node)));
    assert_eq!(read_back(&node), first);

    let second = wanted(&["10.96.0.2", "10.96.0.3"]);
    let script = restore_script(&second, &read_back(&node));
    assert_eq!(script.lines().count(), 2, "one deletion, one addition:\n{script}");
    apply(&node, &script);
    assert_eq!(read_back(&node), second);
    assert_eq!(restore_script(&second, &read_back(&node)), "");
}
