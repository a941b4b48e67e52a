//! Localhost NodePorts (upstream 1.37, KEP-6032, the gate
//! `KubeProxyNFTablesLocalhostNodePorts`) on the real kernel: the real backend with its
//! localhost proxy in the node of a namespace lab, real TCP from the node to
//! `127.0.0.1:<nodePort>` reaching the pods the NodePort's rules would choose, and UDP to a
//! loopback NodePort rejected and counted in the table's named counters, read back as
//! `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`.
//!
//! Everything runs on threads inside the node's namespace (the proxy's listeners and its
//! TCP thread are created there); dropping the lab removes everything.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use common::{Via, transport};
use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_model::IpFamily;
use kpr_netns::{Backend as Server, CLUSTER_CIDR, Lab, NODE_IP, pod_ip, spread, spread_udp};
use kpr_nftables::metrics::{NetlinkRejectedPackets, NftablesMetrics};
use kpr_nftables::{LocalhostNodePorts, LocalhostProxy, NftablesBackend, NftablesOptions};
use kpr_state::Backend;
use kpr_world::{World, ep};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// `web`: Cluster policy, a local and a remote pod.
const WEB: u16 = 30080;
/// `local`: Local policy, the same two pods.
const LOCAL: u16 = 30081;
/// `busy`: a NodePort someone else holds on the loopback address.
const BUSY: u16 = 30082;
/// `dns`: UDP.
const DNS: u16 = 30053;

fn sock(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// `nodePortAddresses: [<node IP>/32, 127.0.0.0/8]` with the gate on: this family runs the
/// proxy.
fn opts() -> NftablesOptions {
    let addresses = NodePortAddresses::Cidrs(vec![
        format!("{NODE_IP}/32").parse().unwrap(),
        "127.0.0.0/8".parse().unwrap(),
    ]);
    NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![CLUSTER_CIDR.parse().unwrap()]),
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap()],
        localhost_nodeports: LocalhostNodePorts::decide(true, &addresses, IpFamily::V4),
        nodeport_addresses: addresses,
        ..NftablesOptions::default()
    }
}

fn endpoint(i: usize, extra: &str) -> Value {
    ep(format!("{} {extra}", pod_ip(i)).trim())
}

/// A NodePort Service's spec: port `p` 80 -> 8080 of `protocol` on `node_port`, `extra`
/// merged in.
fn node_port(cluster_ip: &str, protocol: &str, node_port: u16, extra: Value) -> Value {
    let mut spec = json!({"type": "NodePort", "clusterIP": cluster_ip,
        "ports": [{"name": "p", "port": 80, "protocol": protocol, "targetPort": 8080, "nodePort": node_port}]});
    for (key, value) in extra.as_object().unwrap() {
        spec[key] = value.clone();
    }
    spec
}

fn slice_port(protocol: &str) -> Value {
    json!([{"name": "p", "port": 8080, "protocol": protocol}])
}

fn answered(counts: &BTreeMap<String, usize>) -> Vec<&str> {
    counts.keys().map(String::as_str).collect()
}

/// The metrics text of `registry`, read on the calling thread (so the rejected packets are
/// read from its namespace's table).
fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The value of the sample `name{labels}` in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The whole story on one lab (a lab costs seconds): Cluster policy reaches both pods,
/// Local policy only this node's, a NodePort without a local endpoint is refused, a port
/// held by someone else counts a failure and is retried, UDP is rejected and counted, and
/// the NodePorts on the node's own address are untouched by all of it.
fn tcp_on_loopback_reaches_the_pods_and_udp_is_rejected_and_counted(via: Via) {
    let lab = Lab::new(3).unwrap();
    let _servers: Vec<Server> = (0..2)
        .flat_map(|i| {
            [
                lab.pod(i)
                    .tcp_backend(sock(pod_ip(i), 8080), &format!("pod{i}"))
                    .unwrap(),
                lab.pod(i)
                    .udp_backend(sock(pod_ip(i), 8080), &format!("pod{i}"))
                    .unwrap(),
            ]
        })
        .collect();
    let node = lab.node();
    let mut world = World::new();
    world
        .service("web", node_port("10.96.0.10", "TCP", WEB, json!({})))
        .slice(
            "web",
            slice_port("TCP"),
            vec![endpoint(0, "local"), endpoint(1, "")],
        )
        .service(
            "local",
            node_port(
                "10.96.0.11",
                "TCP",
                LOCAL,
                json!({"externalTrafficPolicy": "Local"}),
            ),
        )
        .slice(
            "local",
            slice_port("TCP"),
            vec![endpoint(0, "local"), endpoint(1, "")],
        )
        .service("busy", node_port("10.96.0.12", "TCP", BUSY, json!({})))
        .slice("busy", slice_port("TCP"), vec![endpoint(1, "")])
        .service("dns", node_port("10.96.0.13", "UDP", DNS, json!({})))
        .slice("dns", slice_port("UDP"), vec![endpoint(0, "local")]);

    node.run(|| {
        // The relay's runtime (its UDP side, unused here): its threads in this namespace.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut registry = Registry::default();
        let metrics = NftablesMetrics::register(&mut registry)
            .register_localhost(&mut registry, Arc::new(NetlinkRejectedPackets));
        let budget = kpr_relay::Budget::new(kpr_relay::Limits::default());
        let proxy = LocalhostProxy::new(IpFamily::V4, &budget, runtime.handle().clone())
            .with_metrics(metrics.localhost().unwrap().clone());
        let opts = opts();
        assert_eq!(opts.localhost_nodeports, LocalhostNodePorts::Proxied);
        let mut backend = NftablesBackend::new(opts.clone(), transport(node, via, opts.affinity_capacity))
            .unwrap()
            .with_localhost_proxy(proxy);

        // Someone else listens on 127.0.0.1:BUSY.
        let blocker = TcpListener::bind(sock(LOCALHOST, BUSY)).unwrap();
        assert!(backend.sync(&world.pending().request(false)).unwrap().full);
        let proxy = backend.localhost_proxy().unwrap();
        assert_eq!(
            proxy.ports(),
            [WEB, LOCAL],
            "UDP gets no listener, BUSY could not"
        );

        let text = metrics_text(&registry);
        let v4 = "{ip_family=\"IPv4\"}";
        let listeners = format!("kubeproxy_nftables_localhost_nodeport_listeners{v4}");
        let failures = format!("kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total{v4}");
        assert_eq!(sample(&text, &listeners), Some(2.0), "{text}");
        assert_eq!(sample(&text, &failures), Some(1.0), "{text}");

        // Cluster policy: both pods, through the listener (the NodePort rules leave
        // loopback alone). The pods see the node's address: the proxy connected.
        let web = spread(node, sock(LOCALHOST, WEB), 40);
        assert_eq!(answered(&web), ["pod0", "pod1"], "{web:?}");
        // Local policy: only this node's pod.
        let local = spread(node, sock(LOCALHOST, LOCAL), 20);
        assert_eq!(answered(&local), ["pod0"], "{local:?}");
        // The node's own address still goes through the rules.
        assert_eq!(answered(&spread(node, sock(NODE_IP, WEB), 40)), ["pod0", "pod1"]);
        assert_eq!(
            answered(&spread(lab.client(), sock(NODE_IP, LOCAL), 10)),
            ["pod0"]
        );

        // UDP to a loopback NodePort: rejected (refused at once) and counted, one packet
        // per datagram; on the node's address the same NodePort answers.
        let udp = spread_udp(node, sock(LOCALHOST, DNS), 5);
        assert_eq!(
            udp,
            BTreeMap::from([("error: connection refused".to_owned(), 5)]),
            "{udp:?}"
        );
        assert_eq!(answered(&spread_udp(node, sock(NODE_IP, DNS), 3)), ["pod0"]);
        let text = metrics_text(&registry);
        let rejected = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";
        assert_eq!(
            sample(
                &text,
                &format!("{rejected}{{ip_family=\"IPv4\",protocol=\"UDP\"}}")
            ),
            Some(5.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                &format!("{rejected}{{ip_family=\"IPv4\",protocol=\"SCTP\"}}")
            ),
            Some(0.0),
            "{text}"
        );
        assert!(!text.contains("protocol=\"TCP\""), "TCP is the proxy's: {text}");

        // The port is free again: the next sync retries it, though `busy` did not change.
        drop(blocker);
        world.service("other", node_port("10.96.0.14", "TCP", 30090, json!({})));
        assert!(!backend.sync(&world.pending().request(false)).unwrap().full);
        assert_eq!(
            backend.localhost_proxy().unwrap().ports(),
            [WEB, LOCAL, BUSY],
            "no endpoint, no listener for `other`"
        );
        assert_eq!(answered(&spread(node, sock(LOCALHOST, BUSY), 5)), ["pod1"]);
        // Nothing listens where there is no endpoint: refused at once.
        let err = connect(sock(LOCALHOST, 30090)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused);

        // Local policy loses its local pod: the listener goes (refused), with no fallback to
        // the remote pod; the changed Service's listener is all that is touched.
        world.slice("local", slice_port("TCP"), vec![endpoint(1, "")]);
        assert!(!backend.sync(&world.pending().request(false)).unwrap().full);
        assert_eq!(backend.localhost_proxy().unwrap().ports(), [WEB, BUSY]);
        let err = connect(sock(LOCALHOST, LOCAL)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
        // Its endpoints change in place: the listener stays and follows them.
        world.slice("web", slice_port("TCP"), vec![endpoint(1, "")]);
        assert!(!backend.sync(&world.pending().request(false)).unwrap().full);
        assert_eq!(answered(&spread(node, sock(LOCALHOST, WEB), 10)), ["pod1"]);

        // The Service goes: its listener goes.
        world.delete_service("web");
        assert!(!backend.sync(&world.pending().request(false)).unwrap().full);
        assert_eq!(backend.localhost_proxy().unwrap().ports(), [BUSY]);
        let text = metrics_text(&registry);
        assert_eq!(sample(&text, &listeners), Some(1.0), "{text}");
        assert_eq!(sample(&text, &failures), Some(1.0), "{text}");
        assert_eq!(backend.localhost_proxy().unwrap().active_connections(), 0);
    });
}

/// A TCP connection from the calling thread's namespace.
fn connect(to: SocketAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&to, Duration::from_secs(2))
}

/// The gate on without a loopback address among the NodePort addresses: no proxy, and TCP
/// is rejected and counted too (upstream's `TestLocalhostNodePortRejectAll`).
fn without_the_proxy_tcp_to_a_loopback_node_port_is_rejected_and_counted(via: Via) {
    let lab = Lab::new(1).unwrap();
    let _server = lab.pod(0).tcp_backend(sock(pod_ip(0), 8080), "pod0").unwrap();
    let node = lab.node();
    let mut world = World::new();
    world
        .service("web", node_port("10.96.0.10", "TCP", WEB, json!({})))
        .slice("web", slice_port("TCP"), vec![endpoint(0, "local")]);
    node.run(|| {
        let addresses = NodePortAddresses::Cidrs(vec![format!("{NODE_IP}/32").parse().unwrap()]);
        let opts = NftablesOptions {
            localhost_nodeports: LocalhostNodePorts::decide(true, &addresses, IpFamily::V4),
            nodeport_addresses: addresses,
            ..opts()
        };
        assert_eq!(opts.localhost_nodeports, LocalhostNodePorts::Rejected);
        let mut registry = Registry::default();
        let _metrics =
            NftablesMetrics::register(&mut registry).register_localhost(&mut registry, Arc::new(NetlinkRejectedPackets));
        let mut backend = NftablesBackend::new(opts.clone(), transport(node, via, opts.affinity_capacity)).unwrap();
        backend.sync(&world.pending().request(false)).unwrap();
        // A process listening there does not get the packets: the table rejects them first.
        let _someone = TcpListener::bind(sock(LOCALHOST, WEB)).unwrap();
        for _ in 0..3 {
            let err = connect(sock(LOCALHOST, WEB)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
        }
        assert_eq!(answered(&spread(node, sock(NODE_IP, WEB), 5)), ["pod0"]);
        let text = metrics_text(&registry);
        let tcp = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=\"IPv4\",protocol=\"TCP\"}";
        assert_eq!(sample(&text, tcp), Some(3.0), "{text}");
    });
}

/// IPv6: the listener is on `[::1]`, the pods are reached over IPv6, and UDP to `[::1]` at
/// a NodePort is counted under `ip_family="IPv6"` (netlink only: the two transports write
/// the same objects, `kernel.rs` proves it).
#[test]
fn ipv6_tcp_on_loopback_reaches_the_pods_and_udp_is_rejected_and_counted() {
    use kpr_netns::{CLUSTER_CIDR_V6, pod_ip_v6};
    let lab = Lab::new(2).unwrap();
    let _servers: Vec<Server> = (0..2)
        .map(|i| {
            lab.pod(i)
                .tcp_backend(sock(pod_ip_v6(i), 8080), &format!("pod{i}"))
                .unwrap()
        })
        .collect();
    let node = lab.node();
    let mut world = World::with_family(IpFamily::V6);
    let v6 = |ip: &str, protocol: &str, node_port: u16| {
        json!({"type": "NodePort", "clusterIP": ip, "ipFamilies": ["IPv6"],
               "ports": [{"name": "p", "port": 80, "protocol": protocol, "targetPort": 8080, "nodePort": node_port}]})
    };
    world
        .service("web", v6("fd00:96::10", "TCP", WEB))
        .slice(
            "web",
            slice_port("TCP"),
            vec![ep(&pod_ip_v6(0).to_string()), ep(&pod_ip_v6(1).to_string())],
        )
        .service("dns", v6("fd00:96::11", "UDP", DNS))
        .slice("dns", slice_port("UDP"), vec![ep(&pod_ip_v6(0).to_string())]);
    node.run(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut registry = Registry::default();
        let metrics = NftablesMetrics::register(&mut registry)
            .register_localhost(&mut registry, Arc::new(NetlinkRejectedPackets));
        let budget = kpr_relay::Budget::new(kpr_relay::Limits::default());
        let proxy = LocalhostProxy::new(IpFamily::V6, &budget, runtime.handle().clone())
            .with_metrics(metrics.localhost().unwrap().clone());
        let addresses = NodePortAddresses::Cidrs(vec!["::1/128".parse().unwrap()]);
        let opts = NftablesOptions {
            family: IpFamily::V6,
            local_detector: LocalDetector::ClusterCidr(vec![CLUSTER_CIDR_V6.parse().unwrap()]),
            service_cidrs: vec!["fd00:96::/112".parse().unwrap()],
            localhost_nodeports: LocalhostNodePorts::decide(true, &addresses, IpFamily::V6),
            nodeport_addresses: addresses,
            ..NftablesOptions::default()
        };
        assert_eq!(opts.localhost_nodeports, LocalhostNodePorts::Proxied);
        let mut backend = NftablesBackend::new(
            opts.clone(),
            transport(node, Via::Netlink, opts.affinity_capacity),
        )
        .unwrap()
        .with_localhost_proxy(proxy);
        backend.sync(&world.pending().request(false)).unwrap();
        assert_eq!(backend.localhost_proxy().unwrap().ports(), [WEB]);

        let loopback = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        // Retries only cover IPv6 neighbour discovery on the first connections.
        kpr_netns::eventually(Duration::from_secs(20), Duration::from_millis(200), || {
            let counts = spread(node, sock(loopback, WEB), 40);
            match answered(&counts)[..] {
                ["pod0", "pod1"] => Ok(()),
                _ => Err(format!("[::1]:{WEB}: {counts:?}")),
            }
        });
        let udp = spread_udp(node, sock(loopback, DNS), 4);
        assert_eq!(
            udp,
            BTreeMap::from([("error: connection refused".to_owned(), 4)]),
            "{udp:?}"
        );
        let text = metrics_text(&registry);
        let rejected = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";
        assert_eq!(
            sample(
                &text,
                &format!("{rejected}{{ip_family=\"IPv6\",protocol=\"UDP\"}}")
            ),
            Some(4.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "kubeproxy_nftables_localhost_nodeport_listeners{ip_family=\"IPv6\"}"
            ),
            Some(1.0),
            "{text}"
        );
    });
}

through_both_transports!(
    tcp_on_loopback_reaches_the_pods_and_udp_is_rejected_and_counted,
    without_the_proxy_tcp_to_a_loopback_node_port_is_rejected_and_counted,
);
