//! Real traffic through the nftables mode's maps, in a namespace lab (node, pods, outside
//! client; see kpr-netns): the Service features beyond plain ClusterIP/NodePort, and the
//! switch between iptables and nftables modes in both directions. Only namespaces the test
//! created are touched; dropping the lab removes everything.

#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{Via, http_slice_port, transport};
use kpr_host::LocalDetector;
use kpr_iptables::{IptablesBackend, IptablesCli, IptablesOptions, Variant};
use kpr_model::IpFamily;
use kpr_netns::{
    Backend as Server, CLIENT_IP, CLUSTER_CIDR, Lab, NODE_IP, Netns, pod_ip, spread, spread_udp,
};
use kpr_nftables::{NftablesBackend, NftablesOptions, cleanup};
use kpr_state::Backend;
use kpr_world::{World, ep};
use serde_json::{Value, json};

const LB_IP: Ipv4Addr = Ipv4Addr::new(5, 6, 7, 8);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn opts() -> NftablesOptions {
    NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![CLUSTER_CIDR.parse().unwrap()]),
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        ..NftablesOptions::default()
    }
}

fn nft_backend(netns: &Netns, via: Via) -> NftablesBackend {
    NftablesBackend::new(opts(), transport(netns, via, opts().affinity_capacity)).unwrap()
}

/// A lab with `n` pods serving TCP on 8080 (answering `pod<i>`), the client routing the
/// load-balancer and external IPs to the node.
struct Cluster {
    lab: Lab,
    servers: Vec<Server>,
}

impl Cluster {
    fn new(n: usize) -> Self {
        let lab = Lab::new(n).unwrap();
        let servers = (0..n)
            .map(|i| {
                lab.pod(i)
                    .tcp_backend(sock(pod_ip(i), 8080), &format!("pod{i}"))
                    .unwrap()
            })
            .collect();
        for ip in [LB_IP, EXTERNAL_IP] {
            lab.client()
                .ip(&["route", "add", &format!("{ip}/32"), "via", &NODE_IP.to_string()])
                .unwrap();
        }
        Self { lab, servers }
    }
}

fn endpoint(i: usize, extra: &str) -> Value {
    ep(format!("{} {extra}", pod_ip(i)).trim())
}

fn answered(counts: &BTreeMap<String, usize>) -> Vec<&str> {
    counts.keys().map(String::as_str).collect()
}

fn sync(backend: &mut dyn Backend, world: &mut World) -> kpr_state::SyncReport {
    backend.sync(&world.pending().request(false)).unwrap()
}

fn external_traffic_policy_local_keeps_the_client_ip_and_short_circuits_pods(via: Via) {
    let cluster = Cluster::new(3);
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local",
                               "externalIPs": [EXTERNAL_IP.to_string()],
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                               "status": {"loadBalancer": {"ingress": [{"ip": LB_IP.to_string()}]}}}),
        )
        .slice(
            "web",
            http_slice_port(),
            vec![endpoint(0, "local"), endpoint(1, "")],
        );
    let mut backend = nft_backend(cluster.lab.node(), via);
    sync(&mut backend, &mut world);

    let client = cluster.lab.client();
    for dest in [sock(NODE_IP, 30080), sock(LB_IP, 80), sock(EXTERNAL_IP, 80)] {
        assert_eq!(
            answered(&spread(client, dest, 30)),
            ["pod0"],
            "{dest}: only the local endpoint"
        );
        // Pods reach every endpoint (as if through the load balancer).
        assert_eq!(
            answered(&spread(cluster.lab.pod(2), dest, 60)),
            ["pod0", "pod1"],
            "{dest} from a pod"
        );
    }
    assert!(
        cluster.servers[0]
            .peers()
            .iter()
            .any(|p| p.ip() == IpAddr::V4(CLIENT_IP)),
        "the client's own address arrives: {:?}",
        cluster.servers[0].peers()
    );

    // No local endpoint left: outside traffic is dropped, pods still get through.
    world.slice("web", http_slice_port(), vec![endpoint(1, "")]);
    assert!(!sync(&mut backend, &mut world).full);
    let err = client
        .tcp_request(sock(NODE_IP, 30080), Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert_eq!(
        answered(&spread(cluster.lab.pod(2), sock(NODE_IP, 30080), 20)),
        ["pod1"]
    );
}

fn cluster_policy_masquerades_outside_traffic(via: Via) {
    let cluster = Cluster::new(2);
    let mut world = World::new();
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![endpoint(0, ""), endpoint(1, "")]);
    let mut backend = nft_backend(cluster.lab.node(), via);
    sync(&mut backend, &mut world);
    assert_eq!(
        answered(&spread(cluster.lab.client(), sock(NODE_IP, 30080), 40)),
        ["pod0", "pod1"]
    );
    let peers: Vec<_> = cluster.servers.iter().flat_map(|s| s.peers()).collect();
    assert!(
        peers.iter().all(|p| p.ip() != IpAddr::V4(CLIENT_IP)),
        "masqueraded: {peers:?}"
    );
}

fn load_balancer_source_ranges_admit_only_listed_clients(via: Via) {
    let cluster = Cluster::new(1);
    let spec = |range: &str| {
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10", "loadBalancerSourceRanges": [range],
               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
               "status": {"loadBalancer": {"ingress": [{"ip": LB_IP.to_string()}]}}})
    };
    let mut world = World::new();
    world
        .service("web", spec("192.168.77.0/24"))
        .slice("web", http_slice_port(), vec![endpoint(0, "")]);
    let mut backend = nft_backend(cluster.lab.node(), via);
    sync(&mut backend, &mut world);
    let client = cluster.lab.client();
    assert_eq!(
        client
            .tcp_request(sock(LB_IP, 80), Duration::from_secs(2))
            .unwrap(),
        "pod0"
    );

    world.service("web", spec("198.51.100.0/24"));
    assert!(!sync(&mut backend, &mut world).full);
    let err = client
        .tcp_request(sock(LB_IP, 80), Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "dropped by firewall-check");
    // NodePorts are not subject to the ranges, as upstream.
    assert_eq!(
        client
            .tcp_request(sock(NODE_IP, 30080), Duration::from_secs(2))
            .unwrap(),
        "pod0"
    );
}

fn client_ip_affinity_sticks_to_one_endpoint(via: Via) {
    let cluster = Cluster::new(3);
    let mut world = World::new();
    world
        .service("web", json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                               "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}))
        .slice("web", http_slice_port(), vec![endpoint(0, ""), endpoint(1, "")]);
    let mut backend = nft_backend(cluster.lab.node(), via);
    sync(&mut backend, &mut world);
    let vip = sock([10, 96, 0, 10], 80);
    let first = answered(&spread(cluster.lab.pod(2), vip, 30))
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>();
    assert_eq!(first.len(), 1, "one endpoint for one client: {first:?}");
    // Another client is tracked on its own; the node's own traffic too.
    assert_eq!(answered(&spread(cluster.lab.node(), vip, 20)).len(), 1);
    // A third endpoint: the sticky client stays where it was.
    world.slice(
        "web",
        http_slice_port(),
        vec![endpoint(0, ""), endpoint(1, ""), endpoint(2, "")],
    );
    assert!(!sync(&mut backend, &mut world).full);
    assert_eq!(
        answered(&spread(cluster.lab.pod(2), vip, 20)),
        [first[0].as_str()]
    );
}

fn udp_service_spreads_over_its_pods(via: Via) {
    let lab = Lab::new(3).unwrap();
    let _udp: Vec<_> = (0..2)
        .map(|i| {
            lab.pod(i)
                .udp_backend(sock(pod_ip(i), 5353), &format!("pod{i}"))
                .unwrap()
        })
        .collect();
    let mut world = World::new();
    world
        .service("dns", json!({"type": "ClusterIP", "clusterIP": "10.96.0.53",
                               "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}))
        .slice("dns", json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]), vec![endpoint(0, ""), endpoint(1, "")]);
    let mut backend = nft_backend(lab.node(), via);
    sync(&mut backend, &mut world);
    assert_eq!(
        answered(&spread_udp(lab.pod(2), sock([10, 96, 0, 53], 53), 60)),
        ["pod0", "pod1"]
    );
}

/// Switching modes: the new mode's start removes the old one's rules (iptables cleanup for
/// iptables -> nftables, the nftables table for nftables -> iptables), and traffic works
/// after each switch.
fn switching_between_iptables_and_nftables_both_ways(via: Via) {
    let cluster = Cluster::new(2);
    let node = cluster.lab.node();
    let mut world = World::new();
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![endpoint(0, ""), endpoint(1, "")]);
    let state = world.pending();
    let iptables = || {
        let cli = IptablesCli::in_netns(IpFamily::V4, Variant::Nft, node.name());
        let opts = IptablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![CLUSTER_CIDR.parse().unwrap()]),
            ..IptablesOptions::default()
        };
        IptablesBackend::new(opts, Box::new(cli)).unwrap()
    };
    let iptables_rules = || {
        let out = node.command("iptables-nft-save").output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains("KUBE-SERVICES")
    };
    // Read and removed through the transport under test.
    let nft_table = || transport(node, via, 1).read_back(IpFamily::V4).unwrap().is_some();
    let works = || {
        assert_eq!(
            answered(&spread(cluster.lab.client(), sock(NODE_IP, 30080), 30)),
            ["pod0", "pod1"]
        );
    };

    iptables().sync(&state.request(true)).unwrap();
    works();
    // iptables -> nftables.
    let report = kpr_iptables::cleanup(&IptablesCli::in_netns(IpFamily::V4, Variant::Nft, node.name()));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!iptables_rules());
    let mut nft = nft_backend(node, via);
    nft.sync(&state.request(true)).unwrap();
    assert!(nft_table());
    works();
    // nftables -> iptables.
    assert!(cleanup(&mut *transport(node, via, 1), IpFamily::V4).unwrap());
    assert!(!nft_table());
    iptables().sync(&state.request(true)).unwrap();
    assert!(iptables_rules());
    works();
}

/// One UDP request from a fixed source port: every call is the same conntrack flow.
fn udp_from_fixed_port(ns: &Netns, to: SocketAddr) -> std::io::Result<String> {
    ns.udp_request_from_port(40053, to, Duration::from_millis(500))
}

/// Stale UDP conntrack entries are deleted after the sync that removes their endpoint
/// (kpr-conntrack's reconciler, called by the backend), so a long-lived flow moves.
fn a_udp_flow_moves_when_its_endpoint_leaves(via: Via) {
    let lab = Lab::new(3).unwrap();
    let _udp: Vec<_> = (0..2)
        .map(|i| {
            lab.pod(i)
                .udp_backend(sock(pod_ip(i), 5353), &format!("pod{i}"))
                .unwrap()
        })
        .collect();
    let dns = |endpoints: Vec<Value>, world: &mut World| {
        world
            .service("dns", json!({"type": "ClusterIP", "clusterIP": "10.96.0.53",
                                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}))
            .slice("dns", json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]), endpoints);
    };
    let mut world = World::new();
    dns(vec![endpoint(0, "")], &mut world);
    let mut backend = nft_backend(lab.node(), via)
        .with_conntrack(Box::new(kpr_conntrack::Reconciler::netlink(IpFamily::V4)));
    let node = lab.node();
    let mut sync_in_node = |world: &mut World| {
        let pending = world.pending();
        node.run(|| backend.sync(&pending.request(false)).map(|r| r.full).unwrap())
    };
    assert!(sync_in_node(&mut world));
    let vip = sock([10, 96, 0, 53], 53);
    assert_eq!(udp_from_fixed_port(lab.pod(2), vip).unwrap(), "pod0");

    // pod0 still answers, but it left the Service: only deleting the flow's entry moves it.
    dns(vec![endpoint(1, "")], &mut world);
    assert!(!sync_in_node(&mut world));
    assert_eq!(udp_from_fixed_port(lab.pod(2), vip).unwrap(), "pod1");
}

/// Cluster-IP traffic from outside the pod network is masqueraded (replies must come back
/// through this node); a pod reaching itself through its Service is masqueraded too
/// (hairpin), or its reply would bypass the DNAT's reverse translation.
fn off_cluster_and_hairpin_traffic_to_a_cluster_ip_is_masqueraded(via: Via) {
    let cluster = Cluster::new(1);
    cluster
        .lab
        .client()
        .ip(&["route", "add", "10.96.0.0/16", "via", &NODE_IP.to_string()])
        .unwrap();
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        )
        .slice("web", http_slice_port(), vec![endpoint(0, "")]);
    let mut backend = nft_backend(cluster.lab.node(), via);
    sync(&mut backend, &mut world);
    let vip = sock([10, 96, 0, 10], 80);
    assert_eq!(
        cluster
            .lab
            .client()
            .tcp_request(vip, Duration::from_secs(2))
            .unwrap(),
        "pod0"
    );
    assert_eq!(
        cluster
            .lab
            .pod(0)
            .tcp_request(vip, Duration::from_secs(2))
            .unwrap(),
        "pod0",
        "hairpin"
    );
    let peers = cluster.servers[0].peers();
    assert_eq!(peers.len(), 2);
    assert!(
        peers
            .iter()
            .all(|p| p.ip() != IpAddr::V4(CLIENT_IP) && p.ip() != IpAddr::V4(pod_ip(0))),
        "{peers:?}"
    );
}

/// `--nodeport-addresses`: NodePorts answer only on the node addresses inside the CIDRs.
fn nodeport_addresses_limit_where_node_ports_answer(via: Via) {
    let cluster = Cluster::new(1);
    let node = cluster.lab.node();
    // A second node address, outside the CIDR, reachable from the client.
    node.ip(&["addr", "add", "192.168.78.1/24", "dev", "eth0"])
        .unwrap();
    cluster
        .lab
        .client()
        .ip(&["addr", "add", "192.168.78.2/24", "dev", "eth0"])
        .unwrap();
    let opts = NftablesOptions {
        nodeport_addresses: kpr_host::NodePortAddresses::Cidrs(vec!["192.168.77.0/24".parse().unwrap()]),
        ..opts()
    };
    let transport = transport(node, via, opts.affinity_capacity);
    let addresses = kpr_host::FixedAddresses(vec![IpAddr::V4(NODE_IP), "192.168.78.1".parse().unwrap()]);
    let mut backend = NftablesBackend::new(opts, transport)
        .unwrap()
        .with_local_addresses(Box::new(addresses));
    let mut world = World::new();
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![endpoint(0, "")]);
    sync(&mut backend, &mut world);
    let client = cluster.lab.client();
    assert_eq!(
        client
            .tcp_request(sock(NODE_IP, 30080), Duration::from_secs(2))
            .unwrap(),
        "pod0"
    );
    let other = client
        .tcp_request(sock([192, 168, 78, 1], 30080), Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(
        other.kind(),
        ErrorKind::ConnectionRefused,
        "nothing listens there: no NodePort on that address"
    );
}

/// The `ip6 kube-proxy` table carries IPv6 traffic the same way.
fn ipv6_cluster_ip_and_node_port_carry_traffic(via: Via) {
    use kpr_netns::{CLUSTER_CIDR_V6, NODE_IP_V6, pod_ip_v6};
    let lab = Lab::new(3).unwrap();
    let _servers: Vec<_> = (0..2)
        .map(|i| {
            lab.pod(i)
                .tcp_backend(sock(pod_ip_v6(i), 8080), &format!("pod{i}"))
                .unwrap()
        })
        .collect();
    let opts = NftablesOptions {
        family: IpFamily::V6,
        local_detector: LocalDetector::ClusterCidr(vec![CLUSTER_CIDR_V6.parse().unwrap()]),
        service_cidrs: vec!["fd00:96::/112".parse().unwrap()],
        ..NftablesOptions::default()
    };
    let transport = transport(lab.node(), via, opts.affinity_capacity);
    let mut backend = NftablesBackend::new(opts, transport).unwrap();
    let mut world = World::with_family(IpFamily::V6);
    world
        .service("web", json!({"type": "NodePort", "clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"],
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}))
        .slice("web", http_slice_port(), vec![ep(&pod_ip_v6(0).to_string()), ep(&pod_ip_v6(1).to_string())]);
    sync(&mut backend, &mut world);
    let vip = sock("fd00:96::10".parse::<IpAddr>().unwrap(), 80);
    // The rules are in at once; the retries only cover IPv6 neighbour discovery on a
    // namespace's first connection (the deadline is a ceiling against hangs).
    let settled = |ns: &Netns, dest: SocketAddr| {
        kpr_netns::eventually(Duration::from_secs(20), Duration::from_millis(200), || {
            let counts = spread(ns, dest, 40);
            match answered(&counts)[..] {
                ["pod0", "pod1"] => Ok(()),
                _ => Err(format!("{dest}: {counts:?}")),
            }
        })
    };
    settled(lab.pod(2), vip);
    settled(lab.client(), sock(NODE_IP_V6, 30080));
    settled(lab.pod(1), vip);
}

/// Full syncs after the first rebuild the table in place, keeping the affinity sets and
/// the endpoints' slots: a sticky client stays with its endpoint.
fn client_ip_affinity_survives_full_syncs(via: Via) {
    let cluster = Cluster::new(4);
    let mut world = World::new();
    world
        .service("web", json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
                               "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                               "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}))
        .slice("web", http_slice_port(), vec![endpoint(0, ""), endpoint(1, ""), endpoint(2, "")]);
    let mut backend = nft_backend(cluster.lab.node(), via);
    let pending = world.pending();
    assert!(backend.sync(&pending.request(false)).unwrap().full);
    let vip = sock([10, 96, 0, 10], 80);
    let first = answered(&spread(cluster.lab.pod(3), vip, 10))
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>();
    assert_eq!(first.len(), 1, "{first:?}");
    for _ in 0..3 {
        assert!(backend.sync(&pending.request(true)).unwrap().full);
        assert_eq!(answered(&spread(cluster.lab.pod(3), vip, 5)), [first[0].as_str()]);
    }
}

through_both_transports!(
    external_traffic_policy_local_keeps_the_client_ip_and_short_circuits_pods,
    cluster_policy_masquerades_outside_traffic,
    load_balancer_source_ranges_admit_only_listed_clients,
    client_ip_affinity_sticks_to_one_endpoint,
    udp_service_spreads_over_its_pods,
    switching_between_iptables_and_nftables_both_ways,
    a_udp_flow_moves_when_its_endpoint_leaves,
    off_cluster_and_hairpin_traffic_to_a_cluster_ip_is_masqueraded,
    nodeport_addresses_limit_where_node_ports_answer,
    ipv6_cluster_ip_and_node_port_carry_traffic,
    client_ip_affinity_survives_full_syncs,
);
