//! Kernel tests: the real [`Reconciler`] over ctnetlink against real UDP conntrack entries,
//! made by real datagrams that the node of a namespace lab DNATs. What was deleted and
//! kept is read back with the `conntrack` tool, not with the code under test.
//!
//! Needs root, iproute2, iptables, the `conntrack` tool and the kernel's conntrack netlink
//! interface; a missing piece fails the test (never skips it). Nothing runs in the root
//! namespace; the lab is deleted when the test ends, also when it panics.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::{Ipv6Addr, SocketAddr};

use kpr_conntrack::{Conntrack, ConntrackTable, NetlinkTable, Reconciler, Scope};
use kpr_model::IpFamily;
use kpr_netns::{CLIENT_IP, Netns};
use kpr_world::{World, ep};
use support::{
    EXTERNAL_IP, OTHER_VIP, PORT, Route, Seen, VIP, conntrack, conntrack_entries, dns_service,
    dns_slice_ports, lab, node_port, pod, send_routes,
};

fn route(
    frontend: std::net::SocketAddrV4,
    first_source_port: u16,
    endpoint: std::net::SocketAddrV4,
) -> Route {
    Route {
        frontend,
        first_source_port,
        count: 3,
        endpoint,
    }
}

fn vip() -> std::net::SocketAddrV4 {
    std::net::SocketAddrV4::new(VIP, PORT)
}

/// Where each entry's reply comes from, by client source port.
fn replies(seen: &[Seen]) -> Vec<(u16, SocketAddr)> {
    seen.iter().map(|s| (s.source_port, s.reply_source)).collect()
}

/// Source ports of `route`, paired with its endpoint: what its flows look like.
fn flows_of(route: &Route) -> Vec<(u16, SocketAddr)> {
    route
        .source_ports()
        .map(|port| (port, SocketAddr::V4(route.endpoint)))
        .collect()
}

#[test]
fn a_restart_keeps_flows_to_serving_endpoints_and_drops_those_to_endpoints_that_left_meanwhile() {
    // Flows through every kind of frontend: to pod 0 (ready), pod 1 (terminating but
    // serving) and pod 2, which left the Service while the proxy was down (so no sync's
    // changes ever mention it).
    let ext = std::net::SocketAddrV4::new(EXTERNAL_IP, PORT);
    let routes = [
        route(vip(), 41000, pod(0)),
        route(vip(), 41010, pod(1)),
        route(vip(), 41020, pod(2)),
        route(ext, 41100, pod(0)),
        route(ext, 41120, pod(2)),
        route(node_port(), 41200, pod(1)),
        route(node_port(), 41220, pod(2)),
    ];
    let lab = lab(3, &routes);
    send_routes(lab.client(), &routes);
    let before = replies(&conntrack_entries(lab.node()));
    let all: Vec<_> = routes.iter().flat_map(flows_of).collect();
    assert_eq!(before, sorted(all), "every datagram made one DNATed entry");

    // The proxy starts: its first sync sees pods 0 and 1 only.
    let mut cluster = World::new();
    cluster.service("dns", dns_service()).slice(
        "dns",
        dns_slice_ports(pod(0).port()),
        vec![
            ep(&pod(0).ip().to_string()),
            ep(&format!("{} serving terminating", pod(1).ip())),
        ],
    );
    let first = cluster.pending();
    let report = lab
        .node()
        .run(|| Reconciler::netlink(IpFamily::V4).after_sync(&first.request(false)))
        .expect("the first sync reconciles the whole table");
    assert_eq!(report.deleted, 9, "the three flows per frontend to pod 2");

    let kept: Vec<_> = routes
        .iter()
        .filter(|r| r.endpoint != pod(2))
        .flat_map(flows_of)
        .collect();
    assert_eq!(replies(&conntrack_entries(lab.node())), sorted(kept));
}

#[test]
fn after_a_sync_only_flows_to_endpoints_that_stopped_serving_go_and_other_destinations_stay() {
    let other = std::net::SocketAddrV4::new(OTHER_VIP, PORT);
    let routes = [
        route(vip(), 42000, pod(0)),
        route(vip(), 42010, pod(1)),
        route(node_port(), 42100, pod(1)),
        // Not a Service address: nobody's business.
        route(other, 42200, pod(1)),
    ];
    let lab = lab(2, &routes);
    let mut cluster = World::new();
    let both = vec![ep(&pod(0).ip().to_string()), ep(&pod(1).ip().to_string())];
    cluster
        .service("dns", dns_service())
        .slice("dns", dns_slice_ports(pod(0).port()), both);
    let first = cluster.pending();
    let mut reconciler = Reconciler::netlink(IpFamily::V4);
    lab.node().run(|| reconciler.after_sync(&first.request(false)));

    send_routes(lab.client(), &routes);
    // Pod 1 stops serving (not ready, not serving): a targeted reconcile of the Service.
    cluster.slice(
        "dns",
        dns_slice_ports(pod(0).port()),
        vec![
            ep(&pod(0).ip().to_string()),
            ep(&format!("{} notready", pod(1).ip())),
        ],
    );
    let second = cluster.pending();
    let report = lab
        .node()
        .run(|| reconciler.after_sync(&second.request(false)))
        .expect("the Service's change is reconciled");
    assert_eq!(report.deleted, 6, "the VIP's and the NodePort's flows to pod 1");

    let kept: Vec<_> = [routes[0], routes[3]].iter().flat_map(flows_of).collect();
    assert_eq!(replies(&conntrack_entries(lab.node())), sorted(kept));
}

#[test]
fn flows_created_before_the_rules_existed_are_dropped_once_the_service_has_endpoints() {
    // Before any DNAT rule, datagrams to the NodePort leave entries that answer from the
    // node's own address. (Inserted with the conntrack tool, as the kernel would have
    // made them: this lab's node does not track traffic nothing NATs.)
    let lab = lab(1, &[]);
    let node = lab.node();
    for source_port in ["43000", "43001"] {
        insert(
            node,
            &CLIENT_IP.to_string(),
            source_port,
            &node_port().to_string(),
            &node_port().to_string(),
        );
    }
    assert_eq!(conntrack_entries(node).len(), 2);

    let mut cluster = World::new();
    cluster.service("dns", dns_service()).slice(
        "dns",
        dns_slice_ports(pod(0).port()),
        vec![ep(&pod(0).ip().to_string())],
    );
    let first = cluster.pending();
    let report = node
        .run(|| Reconciler::netlink(IpFamily::V4).after_sync(&first.request(false)))
        .unwrap();
    assert_eq!(report.deleted, 2);
    assert!(conntrack_entries(node).is_empty());
}

/// Inserts a UDP entry `client:source_port -> to` answered from `reply_from` (both
/// `ip:port`, IPv6 in brackets) with the conntrack tool.
fn insert(netns: &Netns, client: &str, source_port: &str, to: &str, reply_from: &str) {
    let to: SocketAddr = to.parse().unwrap();
    let reply_from: SocketAddr = reply_from.parse().unwrap();
    let (to_ip, to_port) = (to.ip().to_string(), to.port().to_string());
    let (reply_ip, reply_port) = (reply_from.ip().to_string(), reply_from.port().to_string());
    let args = [
        ["-I", "-p", "udp", "-t", "600", "-u", "SEEN_REPLY"].as_slice(),
        &["-s", client, "-d", &to_ip],
        &["--sport", source_port, "--dport", &to_port],
        &["--reply-src", &reply_ip, "--reply-dst", client],
        &["--reply-port-src", &reply_port, "--reply-port-dst", source_port],
    ]
    .concat();
    conntrack(netns, &args);
}

#[test]
fn scoped_dumps_return_only_their_frontend() {
    let ext = std::net::SocketAddrV4::new(EXTERNAL_IP, PORT);
    let routes = [
        route(vip(), 44000, pod(0)),
        route(ext, 44100, pod(0)),
        route(node_port(), 44200, pod(0)),
    ];
    let lab = lab(1, &routes);
    send_routes(lab.client(), &routes);
    let mut table = NetlinkTable::new();
    let mut ports = |scope: Scope| -> Vec<u16> {
        let listing = lab.node().run(|| table.udp_entries(IpFamily::V4, scope)).unwrap();
        let mut ports: Vec<u16> = listing.entries.iter().map(|e| e.original.src.port()).collect();
        ports.sort();
        ports
    };
    assert_eq!(ports(Scope::To(SocketAddr::V4(vip()))), [44000, 44001, 44002]);
    assert_eq!(ports(Scope::To(SocketAddr::V4(ext))), [44100, 44101, 44102]);
    assert_eq!(ports(Scope::ToPort(node_port().port())), [44200, 44201, 44202]);
    assert_eq!(ports(Scope::All).len(), 9);
    assert_eq!(ports(Scope::To("10.96.0.54:53".parse().unwrap())), [] as [u16; 0]);
}

#[test]
fn ipv6_entries_are_listed_and_deleted_exactly() {
    let netns = Netns::new("ct6").expect("creating a network namespace (needs root)");
    let client: Ipv6Addr = "fd00:77::2".parse().unwrap();
    let vip6: Ipv6Addr = "fd00:96::53".parse().unwrap();
    // Entries inserted by the conntrack tool: as if fd00:77::2 talked to the VIP and the
    // node DNATed it to fd00:244::10 (kept) or fd00:244::99 (gone).
    for (source_port, endpoint) in [("45000", "[fd00:244::10]:5353"), ("45001", "[fd00:244::99]:5353")] {
        insert(
            &netns,
            &client.to_string(),
            source_port,
            &format!("[{vip6}]:53"),
            endpoint,
        );
    }
    let mut cluster = World::with_family(IpFamily::V6);
    cluster
        .service(
            "dns",
            serde_json::json!({"clusterIP": vip6.to_string(), "ipFamilies": ["IPv6"],
                               "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
        )
        .slice("dns", dns_slice_ports(5353), vec![ep("fd00:244::10")]);
    let first = cluster.pending();
    let (listed, report) = netns.run(|| {
        let v4 = NetlinkTable::new().udp_entries(IpFamily::V4, Scope::All).unwrap();
        assert!(v4.entries.is_empty(), "IPv6 entries are not listed for IPv4");
        let listed = NetlinkTable::new().udp_entries(IpFamily::V6, Scope::All).unwrap();
        (
            listed,
            Reconciler::netlink(IpFamily::V6).after_sync(&first.request(false)),
        )
    });
    assert_eq!(listed.entries.len(), 2);
    assert_eq!(report.unwrap().deleted, 1);
    let text = conntrack(&netns, &["-L", "-f", "ipv6", "-p", "udp"]);
    assert!(
        text.contains("fd00:244::10") && !text.contains("fd00:244::99"),
        "{text}"
    );
}

fn sorted(mut flows: Vec<(u16, SocketAddr)>) -> Vec<(u16, SocketAddr)> {
    flows.sort();
    flows
}
