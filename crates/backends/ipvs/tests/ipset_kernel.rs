//! The proxy's ipset path (netlink) against the real kernel in a throw-away namespace, with
//! the `ipset` tool's `ipset save` as the independent view: what it shows is what was
//! wanted, after a first sync and after a change; and sets the tool wrote read back the
//! same through netlink. Needs root and the `ipset` tool; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

use kpr_ipvs::ipset::{
    Family, Ipset, IpsetCli, IpsetNetlink, Member, Protocol, SetKind, SetSpec, Sets, changes, parse_save,
};
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

/// What `ipset save` shows.
fn saved(node: &Netns) -> Sets {
    let text = node
        .sh("ipset save")
        .expect("ipset save (is the ipset tool installed?)");
    parse_save(&text, &SPECS).unwrap()
}

/// The sync's two steps through `client` in `node`: read the kernel, write the changes;
/// how many changes that was.
fn sync(node: &Netns, client: &mut (dyn Ipset + Send), wanted: &Sets) -> usize {
    node.run(|| {
        let current = client.read(&SPECS).unwrap();
        let writes = changes(wanted, &current);
        client.write(&writes).unwrap();
        writes.len()
    })
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
    let mut netlink = IpsetNetlink::default();
    let first = wanted(&["10.96.0.1", "10.96.0.2"]);
    sync(&node, &mut netlink, &first);
    assert_eq!(saved(&node), first);

    let second = wanted(&["10.96.0.2", "10.96.0.3"]);
    assert_eq!(
        sync(&node, &mut netlink, &second),
        2,
        "one deletion, one addition"
    );
    assert_eq!(saved(&node), second);
    assert_eq!(sync(&node, &mut netlink, &second), 0, "nothing left to change");
}

#[test]
fn what_the_tool_wrote_reads_back_the_same_through_netlink() {
    let node = Netns::new("ipset").unwrap();
    let sets = wanted(&["10.96.0.1", "10.96.0.7"]);
    sync(&node, &mut IpsetCli, &sets);
    assert_eq!(saved(&node), sets);
    let read = node.run(|| IpsetNetlink::default().read(&SPECS).unwrap());
    assert_eq!(read, sets);
}

#[test]
fn this_kernel_has_every_set_type_the_mode_uses() {
    let node = Netns::new("ipset").unwrap();
    node.run(|| IpsetNetlink::default().check_kernel()).unwrap();
}
