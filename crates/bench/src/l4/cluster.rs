//! The one Service every path of the L4 benchmark reaches, written down once: its ports,
//! its backends (the lab's pods), where each path's client connects, and the manifest the
//! kube-proxy-rs rows read.
//!
//! One Service with two TCP ports, `bulk` (a server that sends without end) and `rr` (one
//! byte answered with one byte), ClusterIP and NodePort, in front of every pod of the lab.
//! The node is the lab's (`kpr_netns::NODE_IP`), named as the proxy is told
//! (`--hostname-override`).

use std::net::{Ipv4Addr, SocketAddr};

use kpr_netns::{NODE_IP, pod_ip};

use crate::cluster::NODE_NAME;

/// The Service's cluster IP: the address the client connects to through kube-proxy-rs.
pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const NAMESPACE: &str = "l4";
pub const SERVICE: &str = "l4";

/// One port of the Service and the HAProxy frontend standing in for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    pub name: &'static str,
    /// The Service port (on the cluster IP).
    pub service: u16,
    pub node_port: u16,
    /// Where the pods' servers listen.
    pub target: u16,
    /// Where HAProxy listens on the node for this port.
    pub haproxy: u16,
}

pub const BULK: Port = Port {
    name: "bulk",
    service: 5001,
    node_port: 30501,
    target: 5001,
    haproxy: 15001,
};

pub const RR: Port = Port {
    name: "rr",
    service: 80,
    node_port: 30080,
    target: 8080,
    haproxy: 18080,
};

/// Which path a row's traffic takes from the client to a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Path {
    /// kube-proxy-rs `--proxy-mode userspace`: client → cluster IP → the proxy → pod.
    Userspace,
    /// The same proxy, its listener reached on the node's address (the port its portal
    /// leads to) without the portal: what the proxy costs beside HAProxy reached the same
    /// way, with the portal's NAT left out (its rules are still in place).
    UserspaceListener,
    /// HAProxy `mode tcp` on the node: client → node address → HAProxy → pod.
    Haproxy,
    /// The same with `option splice-auto` (HAProxy's zero-copy forwarding).
    HaproxySplice,
    /// HAProxy `mode tcp` behind the userspace mode's portal: client → cluster IP,
    /// `REDIRECT` in the node's kernel → HAProxy → pod (what the portal costs).
    HaproxyPortal,
    /// HAProxy reached on the node's address while the portal's rules are in place: conntrack
    /// and the nat hooks see its connections, nothing rewrites them (the counterpart of
    /// [`Self::UserspaceListener`]).
    HaproxyBesidePortal,
    /// kube-proxy-rs `--proxy-mode iptables`: client → cluster IP, DNAT in the node's kernel → pod.
    Iptables,
    /// kube-proxy-rs `--proxy-mode nftables`: client → cluster IP, DNAT in the node's kernel → pod.
    Nftables,
    /// kube-proxy-rs `--proxy-mode ebpf`, the client's threads in the cgroup its programs
    /// are attached to: connect() to the cluster IP is rewritten to a pod's address, so the
    /// packets go client → pod as on the direct path.
    Ebpf,
    /// Client → pod, no proxy: the floor every other row is measured against.
    Direct,
    /// Client → pod while ebpf mode runs, the client's threads in its cgroup: what a pod's
    /// connections to anything but a Service pay for the mode (its program's lookup, the
    /// node's nftables rules, and conntrack on the node's bridge once those rules need it).
    DirectBesideEbpf,
}

impl Path {
    /// In the report's order: the (a) to (d).
    pub const ALL: [Self; 11] = [
        Self::Userspace,
        Self::UserspaceListener,
        Self::Haproxy,
        Self::HaproxySplice,
        Self::HaproxyPortal,
        Self::HaproxyBesidePortal,
        Self::Iptables,
        Self::Nftables,
        Self::Ebpf,
        Self::Direct,
        Self::DirectBesideEbpf,
    ];

    /// The order rows run in: paths that leave the node's netfilter untouched first. A
    /// kube-proxy-rs row registers conntrack and NAT in the node namespace, which then costs
    /// every later packet; no row may pay for an earlier row's rules.
    pub const RUN_ORDER: [Self; 11] = [
        Self::Direct,
        Self::Haproxy,
        Self::HaproxySplice,
        Self::HaproxyPortal,
        Self::HaproxyBesidePortal,
        Self::Userspace,
        Self::UserspaceListener,
        Self::Iptables,
        Self::Nftables,
        Self::Ebpf,
        Self::DirectBesideEbpf,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Userspace => "(a) kube-proxy-rs userspace",
            Self::UserspaceListener => "(a) kube-proxy-rs userspace, its listener reached directly",
            Self::Haproxy => "(b) HAProxy mode tcp",
            Self::HaproxySplice => "(b) HAProxy mode tcp, splice-auto",
            Self::HaproxyPortal => "(b) HAProxy mode tcp behind the portal",
            Self::HaproxyBesidePortal => "(b) HAProxy mode tcp beside the portal",
            Self::Iptables => "(c) kube-proxy-rs iptables",
            Self::Nftables => "(c) kube-proxy-rs nftables",
            Self::Ebpf => "(e) kube-proxy-rs ebpf",
            Self::Direct => "(d) direct to the pod",
            Self::DirectBesideEbpf => "(d) direct to the pod, ebpf mode running",
        }
    }

    /// The `--proxy-mode` of a kube-proxy-rs row.
    pub fn proxy_mode(self) -> Option<&'static str> {
        match self {
            Self::Userspace | Self::UserspaceListener => Some("userspace"),
            Self::Iptables => Some("iptables"),
            Self::Nftables => Some("nftables"),
            Self::Ebpf | Self::DirectBesideEbpf => Some("ebpf"),
            Self::Haproxy
            | Self::HaproxySplice
            | Self::HaproxyPortal
            | Self::HaproxyBesidePortal
            | Self::Direct => None,
        }
    }

    /// Where the client's connection number `n` to `port` goes: the Service's or HAProxy's
    /// one address, the proxy's listener on the node (port 0, which nothing accepts, until
    /// `listeners` are known), or, without a proxy, the pods in turn (round robin, as the
    /// proxies spread them).
    pub fn target(self, port: Port, backends: usize, n: usize, listeners: Option<Listeners>) -> SocketAddr {
        match self {
            Self::Userspace | Self::Iptables | Self::Nftables | Self::Ebpf | Self::HaproxyPortal => {
                SocketAddr::from((CLUSTER_IP, port.service))
            }
            Self::UserspaceListener => SocketAddr::from((NODE_IP, listeners.map_or(0, |l| l.port(port)))),
            Self::Haproxy | Self::HaproxySplice | Self::HaproxyBesidePortal => {
                SocketAddr::from((NODE_IP, port.haproxy))
            }
            Self::Direct | Self::DirectBesideEbpf => {
                SocketAddr::from((pod_ip(n % backends.max(1)), port.target))
            }
        }
    }
}

/// Where the client runs: outside the cluster (its connections arrive on the node's
/// link), or in a pod of its own on the node's bridge (not an endpoint), as a workload
/// calling a Service does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    Outside,
    Pod,
}

/// The node ports the userspace mode's listeners for [`BULK`] and [`RR`] took (from a
/// random place in `--proxy-port-range`, or the kernel's pick), as its portals name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listeners {
    pub bulk: u16,
    pub rr: u16,
}

impl Listeners {
    pub fn port(self, port: Port) -> u16 {
        if port == BULK { self.bulk } else { self.rr }
    }

    /// Reads both ports from the node's nat table (`iptables-save` text): the
    /// `KUBE-PORTALS-CONTAINER` rule for the cluster IP and the Service port, and its
    /// `REDIRECT --to-ports`. `Err` says which port's rule is missing.
    pub fn from_portals(saved_nat: &str) -> Result<Self, String> {
        let find = |port: Port| {
            saved_nat
                .lines()
                .find_map(|line| redirect_port(line, port))
                .ok_or_else(|| {
                    format!(
                        "no KUBE-PORTALS-CONTAINER rule redirects {CLUSTER_IP}:{} ({}) in the node's nat table",
                        port.service, port.name
                    )
                })
        };
        Ok(Self {
            bulk: find(BULK)?,
            rr: find(RR)?,
        })
    }
}

/// The `--to-ports` of `line` when it is the container portal of the cluster IP's `port`.
fn redirect_port(line: &str, port: Port) -> Option<u16> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flag: &str| words.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
    let portal = words.starts_with(&["-A", "KUBE-PORTALS-CONTAINER"])
        && after("-d") == Some(&format!("{CLUSTER_IP}/32"))
        && after("-p") == Some("tcp")
        && after("--dport") == Some(&port.service.to_string())
        && after("-j") == Some("REDIRECT");
    portal.then(|| after("--to-ports")?.parse().ok()).flatten()
}

/// The backends of `port`: every pod of the lab, pod 0 first.
pub fn backends(port: Port, count: usize) -> Vec<SocketAddr> {
    (0..count)
        .map(|i| SocketAddr::from((pod_ip(i), port.target)))
        .collect()
}

/// The manifest the kube-proxy-rs rows read: this node, the Service and its EndpointSlice
/// (every pod ready), as a JSON `List`.
pub fn manifest_json(backends: usize) -> String {
    let port = |p: Port| {
        serde_json::json!({"name": p.name, "port": p.service, "targetPort": p.target,
            "nodePort": p.node_port, "protocol": "TCP"})
    };
    let slice_port = |p: Port| serde_json::json!({"name": p.name, "port": p.target, "protocol": "TCP"});
    let endpoints: Vec<serde_json::Value> = (0..backends)
        .map(|i| {
            serde_json::json!({"addresses": [pod_ip(i).to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": NODE_NAME})
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME},
         "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP.to_string()}]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": SERVICE, "namespace": NAMESPACE},
         "spec": {"type": "NodePort", "clusterIP": CLUSTER_IP.to_string(),
                  "clusterIPs": [CLUSTER_IP.to_string()], "ports": [port(BULK), port(RR)]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": format!("{SERVICE}-1"), "namespace": NAMESPACE,
                      "labels": {"kubernetes.io/service-name": SERVICE}},
         "addressType": "IPv4", "ports": [slice_port(BULK), slice_port(RR)],
         "endpoints": endpoints},
    ]});
    format!("{list:#}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxied_paths_share_one_address_and_direct_goes_round_robin() {
        for n in [0, 7] {
            assert_eq!(
                Path::Userspace.target(RR, 4, n, None).to_string(),
                "10.96.0.10:80"
            );
            assert_eq!(
                Path::Iptables.target(BULK, 4, n, None).to_string(),
                "10.96.0.10:5001"
            );
            assert_eq!(
                Path::Haproxy.target(RR, 4, n, None).to_string(),
                "192.168.77.1:18080"
            );
            assert_eq!(
                Path::HaproxyPortal.target(RR, 4, n, None).to_string(),
                "10.96.0.10:80"
            );
        }
        let direct: Vec<String> = (0..5)
            .map(|n| Path::Direct.target(RR, 4, n, None).to_string())
            .collect();
        assert_eq!(
            direct,
            [
                "10.244.1.10:8080",
                "10.244.1.11:8080",
                "10.244.1.12:8080",
                "10.244.1.13:8080",
                "10.244.1.10:8080"
            ]
        );
    }

    #[test]
    fn the_listener_path_goes_to_the_node_at_the_ports_the_portals_name() {
        let listeners = Some(Listeners {
            bulk: 40001,
            rr: 40002,
        });
        assert_eq!(
            Path::UserspaceListener.target(BULK, 4, 3, listeners).to_string(),
            "192.168.77.1:40001"
        );
        assert_eq!(
            Path::UserspaceListener.target(RR, 4, 0, listeners).to_string(),
            "192.168.77.1:40002"
        );
        assert_eq!(Path::UserspaceListener.target(RR, 4, 0, None).port(), 0);
    }

    /// The ports come from the container portals of the cluster IP only: not from the host
    /// portals (DNAT), another address's rule, or the other Service port's.
    #[test]
    fn listeners_are_read_from_the_container_portals() {
        let saved = "*nat\n\
            :KUBE-PORTALS-CONTAINER - [0:0]\n\
            -A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment \"l4/l4:rr\" -m tcp --dport 80 -j DNAT --to-destination 192.168.77.1:1111\n\
            -A KUBE-PORTALS-CONTAINER -d 10.96.0.11/32 -p tcp -m comment --comment \"x/y:rr\" -m tcp --dport 80 -j REDIRECT --to-ports 2222\n\
            -A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p udp -m comment --comment \"l4/l4:u\" -m udp --dport 80 -j REDIRECT --to-ports 3333\n\
            -A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment \"l4/l4:bulk\" -m tcp --dport 5001 -j REDIRECT --to-ports 40001\n\
            -A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment \"l4/l4:rr\" -m tcp --dport 80 -j REDIRECT --to-ports 40002\n\
            COMMIT\n";
        assert_eq!(
            Listeners::from_portals(saved),
            Ok(Listeners {
                bulk: 40001,
                rr: 40002
            })
        );
        let without_rr: String = saved
            .lines()
            .filter(|l| !l.contains("40002"))
            .map(|l| format!("{l}\n"))
            .collect();
        let err = Listeners::from_portals(&without_rr).unwrap_err();
        assert!(err.contains("10.96.0.10:80 (rr)"), "{err}");
    }

    #[test]
    fn every_path_runs_once() {
        let mut run = Path::RUN_ORDER.to_vec();
        run.sort_by_key(|p| p.label());
        let mut all = Path::ALL.to_vec();
        all.sort_by_key(|p| p.label());
        assert_eq!(run, all);
        // No kube-proxy-rs row before a row without it, and no row through a portal before
        // the rows that reach HAProxy on the node's address.
        let first_proxy = Path::RUN_ORDER
            .iter()
            .position(|p| p.proxy_mode().is_some())
            .unwrap();
        let portal = Path::RUN_ORDER
            .iter()
            .position(|p| *p == Path::HaproxyPortal)
            .unwrap();
        assert!(portal > 2 && portal < first_proxy);
        assert!(
            Path::RUN_ORDER[first_proxy..]
                .iter()
                .all(|p| p.proxy_mode().is_some())
        );
    }

    /// What listens on the node (HAProxy, the NodePorts) never shares a port, nor do the
    /// pods' two servers.
    #[test]
    fn ports_do_not_collide() {
        assert_ne!(BULK.target, RR.target);
        assert_ne!(BULK.service, RR.service);
        let on_the_node = [BULK.node_port, BULK.haproxy, RR.node_port, RR.haproxy];
        let mut unique = on_the_node.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), on_the_node.len());
    }

    /// The manifest passes the manifest source's own validation (what the proxy rows read),
    /// whole: the Node, the Service and its slice, nothing refused.
    #[test]
    fn the_manifest_source_accepts_the_manifest() {
        use kpr_sources::Event;
        use kpr_sources::manifests::{FileRead, ManifestCatalog, Snapshot};
        let mut scan = Snapshot::new(std::time::Instant::now());
        scan.files.insert(
            std::path::PathBuf::from("/bench/l4.json"),
            FileRead::Bytes(manifest_json(4).into_bytes()),
        );
        let events = ManifestCatalog::new(Some(NODE_NAME.to_string())).apply(scan);
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| match e {
                Event::Node { object: Some(_) } => "node",
                Event::Service { object: Some(_), .. } => "service",
                Event::EndpointSlice { object: Some(_), .. } => "slice",
                Event::Rejected(r) => panic!("refused: {r}"),
                _ => "other",
            })
            .filter(|k| *k != "other")
            .collect();
        assert_eq!(kinds, ["node", "service", "slice"]);
    }

    #[test]
    fn manifest_matches_the_golden_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/l4-manifest.json");
        kpr_world::golden::check(&path, &manifest_json(2));
    }
}
