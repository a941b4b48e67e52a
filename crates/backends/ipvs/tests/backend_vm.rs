//! The whole backend, one sync after another, on a kernel with IPVS (a throw-away guest):
//! the sets, rules, kube-ipvs0 addresses and virtual servers a sync leaves, real TCP
//! through a cluster IP, a sync that changes nothing writing nothing to IPVS, and a
//! deleted Service leaving no virtual server, address or set member behind.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;

use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_iptables::{IptablesCli, Variant};
use kpr_ipvs::rules::RuleOptions;
use kpr_ipvs::{IpsetNetlink, IpvsBackend, IpvsOptions};
use kpr_ipvs_netlink::Scheduler;
use kpr_model::IpFamily;
use kpr_netns::{Netns, spread};
use kpr_state::Backend;
use kpr_vm::{in_guest, squeeze_columns};
use kpr_world::{World, ep};
use serde_json::json;

fn backend(node: &Netns) -> IpvsBackend {
    family_backend(node, IpFamily::V4, "10.244.0.0/16", "192.168.0.10")
}

fn family_backend(node: &Netns, family: IpFamily, pods: &str, node_ip: &str) -> IpvsBackend {
    let options = IpvsOptions {
        scheduler: Scheduler::new("rr").unwrap(),
        rules: RuleOptions {
            family,
            masquerade_bit: 14,
            masquerade_all: false,
            local_detector: LocalDetector::ClusterCidr(vec![pods.parse().unwrap()]),
            random_fully: true,
        },
        node_port_addresses: NodePortAddresses::All,
        exclude_cidrs: vec![],
        node_ip: Some(node_ip.parse().unwrap()),
    };
    let iptables = IptablesCli::in_netns(family, Variant::Auto, node.name());
    IpvsBackend::new(options, Box::new(iptables), Box::new(IpsetNetlink::default()))
}

fn web(world: &mut World, endpoints: &[&str]) {
    world
        .service(
            "web",
            json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        )
        .slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            endpoints.iter().map(|e| ep(e)).collect(),
        );
}

#[test]
fn syncs_program_every_object_and_a_deleted_service_leaves_nothing() {
    in_guest(
        "syncs_program_every_object_and_a_deleted_service_leaves_nothing",
        || {
            let node = Netns::new("ipvs").unwrap();
            node.sh("modprobe ip_vs && ip link add eth0 type dummy && ip addr add 192.168.0.10/24 dev eth0 && ip link set eth0 up && \
                 ip link add pods type dummy && ip addr add 10.244.1.5/32 dev pods && \
                 ip addr add 10.244.2.6/32 dev pods && ip link set pods up && sysctl -qw net.ipv4.vs.conntrack=1")
            .unwrap();
            let _a = node
                .tcp_backend("10.244.1.5:8080".parse().unwrap(), "pod-a")
                .unwrap();
            let _b = node
                .tcp_backend("10.244.2.6:8080".parse().unwrap(), "pod-b")
                .unwrap();
            let mut backend = backend(&node);
            let mut world = World::new();
            web(&mut world, &["10.244.1.5", "10.244.2.6"]);

            let pending = world.pending();
            node.run(|| backend.sync(&pending.request(false))).unwrap();
            let ipvs = squeeze_columns(&node.sh("ipvsadm -Ln").unwrap());
            for line in [
                "TCP 10.96.0.10:80 rr",
                "TCP 192.168.0.10:30080 rr",
                "-> 10.244.1.5:8080 Masq 1 0 0",
            ] {
                assert!(ipvs.contains(line), "{line:?} not in:\n{ipvs}");
            }
            let link = node.sh("ip addr show dev kube-ipvs0").unwrap();
            assert!(link.contains("inet 10.96.0.10/32"), "{link}");
            let sets = node.sh("ipset save").unwrap();
            assert!(sets.contains("add KUBE-CLUSTER-IP 10.96.0.10,tcp:80"), "{sets}");
            assert!(sets.contains("add KUBE-NODE-PORT-TCP 30080"), "{sets}");
            let rules = node.sh("iptables-save").unwrap();
            assert!(rules.contains(
                "-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER"
            ));
            let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
            let answers = spread(&node, vip, 20);
            assert_eq!(
                (answers.get("pod-a"), answers.get("pod-b")),
                (Some(&10), Some(&10)),
                "{answers:?}"
            );

            // (Connection counts are part of the listing: compare after the traffic.)
            let before = squeeze_columns(&node.sh("ipvsadm -Ln").unwrap());
            let pending = world.pending();
            node.run(|| backend.sync(&pending.request(false))).unwrap();
            let after = squeeze_columns(&node.sh("ipvsadm -Ln").unwrap());
            assert_eq!(after, before, "a sync without changes keeps IPVS as it was");

            // A change is a partial sync: only the difference, no read-back.
            web(&mut world, &["10.244.1.5"]);
            let pending = world.pending();
            assert!(!pending.changed.is_empty());
            let report = node.run(|| backend.sync(&pending.request(false))).unwrap();
            assert!(!report.full);
            let stats = backend.last_stats();
            // Four virtual servers lose pod-b (the cluster IP and the NodePort on each of the
            // three node addresses, the pods' dummy link included): read back, one weight 0,
            // three deletions; nothing else written.
            assert_eq!((stats.ipvs_operations, stats.ipvs_dumps), (4, 4), "{stats:?}");
            assert!(stats.set_changes == 0 && !stats.rules_written, "{stats:?}");
            // pod-b still has connections in the cluster IP's table (TIME_WAIT): it drains at
            // weight 0 there; the NodePort servers, which it never served, drop it at once.
            let ipvs = squeeze_columns(&node.sh("ipvsadm -Ln").unwrap());
            assert!(ipvs.contains("-> 10.244.2.6:8080 Masq 0 0 10"), "{ipvs}");
            assert_eq!(ipvs.matches("10.244.2.6:8080").count(), 1, "{ipvs}");
            assert_eq!(backend.draining(), 1);
            assert_eq!(spread(&node, vip, 10).get("pod-a"), Some(&10));

            // Someone deletes a virtual server and empties a set: the sync period's tick (a sync
            // with nothing changed) reads the kernel back and repairs both.
            node.sh("ipvsadm -D -t 10.96.0.10:80 && ipset flush KUBE-CLUSTER-IP")
                .unwrap();
            let pending = world.pending();
            assert!(pending.changed.is_empty());
            let report = node.run(|| backend.sync(&pending.request(false))).unwrap();
            assert!(report.full);
            assert!(squeeze_columns(&node.sh("ipvsadm -Ln").unwrap()).contains("TCP 10.96.0.10:80 rr"));
            assert!(
                node.sh("ipset save")
                    .unwrap()
                    .contains("add KUBE-CLUSTER-IP 10.96.0.10,tcp:80")
            );
            assert_eq!(spread(&node, vip, 10).get("pod-a"), Some(&10));

            world.delete_service("web");
            let pending = world.pending();
            node.run(|| backend.sync(&pending.request(false))).unwrap();
            let ipvs = node.sh("ipvsadm -Ln").unwrap();
            assert!(!ipvs.contains("10.96.0.10") && !ipvs.contains("30080"), "{ipvs}");
            assert!(
                !node
                    .sh("ip addr show dev kube-ipvs0")
                    .unwrap()
                    .contains("10.96.0.10")
            );
            let sets = node.sh("ipset save").unwrap();
            assert!(!sets.contains("add KUBE-"), "every member gone:\n{sets}");
            assert!(sets.contains("create KUBE-CLUSTER-IP"), "the sets stay, empty");
        },
    );
}

#[test]
fn ipv6_services_are_served_through_their_own_sets_and_rules() {
    in_guest(
        "ipv6_services_are_served_through_their_own_sets_and_rules",
        || {
            let node = Netns::new("ipvs").unwrap();
            node.sh(
            "modprobe ip_vs && ip link add eth0 type dummy && ip -6 addr add fd00:1::10/64 dev eth0 nodad && \
             ip link set eth0 up && ip link add pods type dummy && ip -6 addr add fd00:244::5/128 dev pods nodad && \
             ip -6 addr add fd00:244::6/128 dev pods nodad && ip link set pods up",
        )
        .unwrap();
            let _a = node
                .tcp_backend("[fd00:244::5]:8080".parse().unwrap(), "pod-a")
                .unwrap();
            let _b = node
                .tcp_backend("[fd00:244::6]:8080".parse().unwrap(), "pod-b")
                .unwrap();
            let mut backend = family_backend(&node, IpFamily::V6, "fd00:244::/64", "fd00:1::10");
            let mut world = World::with_family(IpFamily::V6);
            world
                .service(
                    "web",
                    json!({"type": "ClusterIP", "clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"],
                       "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
                )
                .slice(
                    "web",
                    json!([{"name": "http", "port": 8080}]),
                    vec![ep("fd00:244::5"), ep("fd00:244::6")],
                );
            let pending = world.pending();
            node.run(|| backend.sync(&pending.request(false))).unwrap();
            let ipvs = squeeze_columns(&node.sh("ipvsadm -Ln").unwrap());
            assert!(ipvs.contains("TCP [fd00:96::10]:80 rr"), "{ipvs}");
            let sets = node.sh("ipset save").unwrap();
            assert!(
                sets.contains("add KUBE-6-CLUSTER-IP fd00:96::10,tcp:80"),
                "{sets}"
            );
            let rules = node.sh("ip6tables-save").unwrap();
            assert!(rules.contains("-A KUBE-SERVICES -s ::1/128 -j RETURN"), "{rules}");
            let vip: SocketAddr = "[fd00:96::10]:80".parse().unwrap();
            let answers = spread(&node, vip, 20);
            assert_eq!(
                (answers.get("pod-a"), answers.get("pod-b")),
                (Some(&10), Some(&10)),
                "{answers:?}"
            );
        },
    );
}
