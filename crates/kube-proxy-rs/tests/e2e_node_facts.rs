//! Settings derived from the node, end to end with real traffic in network namespaces: the
//! node IPs and primary family from the Node object, `--detect-local-mode` NodeCIDR (from
//! the Node's pod CIDRs, waited for and followed by a restart as upstream does),
//! BridgeInterface and InterfaceNamePrefix, and `nodePortAddresses: primary`. The Node comes
//! from the manifests, as a Node among them counts as the API's would. Deadlines are
//! ceilings against hangs, not speed checks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use kpr_netns::{
    Backend, NODE_IP, NODE_IP_V6, POD_GATEWAY, POD_GATEWAY_V6, POD_SUBNET, POD_SUBNET_V6, eventually, pod_ip,
    pod_ip_v6,
};
use support::families::{Family, node, peers, service, slice, tcp_backends};
use support::*;

const WEB_VIP_V4: &str = "10.96.0.10";
const WEB_VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0x10);
const NODE_PORT: u16 = 30080;
/// A cluster CIDR that calls the outside client local (it is the client's link): a
/// detector that used it would leave the client's traffic un-masqueraded. The modes below
/// must not use it.
const MISLEADING_CLUSTER_CIDR: &str = "--cluster-cidr=192.168.77.0/24,fd00:77::/64";

fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn vips() -> [IpAddr; 2] {
    [WEB_VIP_V4.parse().unwrap(), WEB_VIP_V6.into()]
}

/// The Node with both node IPs (IPv4 first) and both pod CIDRs of the lab.
fn lab_node() -> String {
    node(&[NODE_IP.into(), NODE_IP_V6.into()], &[POD_SUBNET, POD_SUBNET_V6])
}

/// A two-pod lab where pod 0 serves the dual-stack Service `web` on both families (a
/// NodePort Service when `node_port` is given), and the manifests hold `node` if given.
fn web_cluster(node: Option<String>, node_port: Option<u16>) -> (Cluster, Vec<Backend>) {
    let cluster = Cluster::new(2);
    let mut backends = tcp_backends(&cluster, Family::V4, &[0], 8080);
    backends.extend(tcp_backends(&cluster, Family::V6, &[0], 8080));
    let web = service("web", &vips(), 80, 8080, "TCP", node_port)
        + &slice("web", Family::V4, &[0], 8080, "TCP")
        + &slice("web", Family::V6, &[0], 8080, "TCP");
    cluster.write("web.yaml", &web);
    if let Some(node) = node {
        cluster.write("node.yaml", &node);
    }
    (cluster, backends)
}

/// The source addresses pod 0 sees for traffic to each of `web`'s cluster IPs, first from
/// pod 1, then from the outside client, as (from pod 1, from the client) per family.
fn sources_seen(cluster: &Cluster, backends: &[Backend]) -> Vec<(Vec<IpAddr>, Vec<IpAddr>)> {
    vips()
        .into_iter()
        .map(|vip| {
            let before = peers(backends).len();
            wait_spread(cluster.lab.pod(1), at(vip, 80), 5, &["pod0"]);
            let middle = peers(backends).len();
            wait_spread(cluster.lab.client(), at(vip, 80), 5, &["pod0"]);
            let all = peers(backends);
            let distinct = |slice: &[IpAddr]| {
                let mut seen = slice.to_vec();
                seen.dedup();
                seen
            };
            (distinct(&all[before..middle]), distinct(&all[middle..]))
        })
        .collect()
}

/// Pod traffic keeps its source (it is local); the client's is masqueraded to the node's
/// bridge address, in both families.
fn assert_pods_are_local_and_the_client_is_not(cluster: &Cluster, backends: &[Backend]) {
    let seen = sources_seen(cluster, backends);
    assert_eq!(
        seen,
        [
            (vec![pod_ip(1).into()], vec![POD_GATEWAY.into()]),
            (vec![pod_ip_v6(1).into()], vec![POD_GATEWAY_V6.into()]),
        ],
        "(from pod 1, from the client) per family"
    );
}

#[test]
fn node_cidr_mode_tells_pods_by_the_nodes_pod_cidrs() {
    let (mut cluster, backends) = web_cluster(Some(lab_node()), None);
    cluster.start_proxy(&["--detect-local-mode=NodeCIDR", MISLEADING_CLUSTER_CIDR]);
    assert_pods_are_local_and_the_client_is_not(&cluster, &backends);
    // The Node's pod CIDRs are the detectors, not the cluster CIDRs.
    let rules = cluster.iptables_save();
    assert!(rules.contains("! -s 10.244.1.0/24"), "{rules}");
    assert!(!rules.contains("192.168.77.0/24"), "{rules}");
}

#[test]
fn bridge_interface_mode_tells_pods_by_the_bridge_they_come_through() {
    let (mut cluster, backends) = web_cluster(None, None);
    cluster.start_proxy(&[
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=kbr0",
        MISLEADING_CLUSTER_CIDR,
    ]);
    assert_pods_are_local_and_the_client_is_not(&cluster, &backends);
}

/// The lab's pods are bridged: their traffic to a Service enters the node's stack (and
/// iptables) on the bridge `kbr0`, so the prefix that names pod interfaces here is `kbr`
/// (with a routed CNI it would be the pods' veth prefix, such as `cali`).
#[test]
fn interface_name_prefix_mode_tells_pods_by_their_interface_names() {
    let (mut cluster, backends) = web_cluster(None, None);
    cluster.start_proxy(&[
        "--detect-local-mode=InterfaceNamePrefix",
        "--pod-interface-name-prefix=kbr",
        MISLEADING_CLUSTER_CIDR,
    ]);
    assert_pods_are_local_and_the_client_is_not(&cluster, &backends);
    assert!(cluster.iptables_save().contains("! -i kbr+"));
}

/// As upstream, a NodeCIDR proxy waits for its Node's pod CIDRs (serving healthz meanwhile)
/// before it writes any rule.
#[test]
fn node_cidr_mode_waits_for_the_pod_cidrs_to_be_allocated() {
    let without_cidrs = node(&[NODE_IP.into()], &[]);
    let (mut cluster, backends) = web_cluster(Some(without_cidrs), None);
    cluster.spawn_proxy(&["--detect-local-mode=NodeCIDR"], true);
    eventually(CONVERGE, POLL, || {
        let logs = cluster.proxy_logs();
        logs.contains("awaiting podCIDR allocation")
            .then_some(())
            .ok_or(logs)
    });
    cluster.wait_listening();
    let (status, body) = cluster.get(HEALTHZ, "/healthz").unwrap();
    assert_eq!(
        status, 200,
        "waiting for the Node is starting, which is healthy: {body}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !cluster.iptables_save().contains("KUBE-SVC-"),
        "rules before the pod CIDRs"
    );

    cluster.write("node.yaml", &lab_node());
    cluster.wait_first_sync();
    assert_pods_are_local_and_the_client_is_not(&cluster, &backends);
}

/// Upstream's NodeCIDR proxy restarts when its pod CIDRs change (its detectors were built
/// from them); the DaemonSet starts it again. The rules stay in place meanwhile.
#[test]
fn a_change_of_the_pod_cidrs_restarts_a_node_cidr_proxy() {
    let (mut cluster, _backends) = web_cluster(Some(lab_node()), None);
    cluster.start_proxy(&["--detect-local-mode=NodeCIDR"]);
    wait_spread(cluster.lab.pod(1), at(vips()[0], 80), 5, &["pod0"]);

    cluster.write("node.yaml", &node(&[NODE_IP.into()], &["10.244.9.0/24"]));
    let proxy = cluster.proxy.as_mut().unwrap();
    let status = eventually(CONVERGE, POLL, || match proxy.try_wait() {
        Ok(Some(status)) => Ok(status),
        other => Err(format!("still running: {other:?}")),
    });
    assert_eq!(status.code(), Some(1), "{status:?}");
    let logs = cluster.proxy_logs();
    assert!(logs.contains("PodCIDRs changed for the node"), "{logs}");
    wait_spread(cluster.lab.pod(1), at(vips()[0], 80), 5, &["pod0"]);
}

/// `nodePortAddresses: primary` means the node IPs from the Node object: NodePorts answer
/// there and not on the node's other addresses (here its bridge addresses).
#[test]
fn primary_node_port_addresses_answer_on_the_node_ips_only() {
    let (mut cluster, _backends) = web_cluster(Some(lab_node()), Some(NODE_PORT));
    cluster.start_proxy(&["--nodeport-addresses=primary"]);
    for node_ip in [IpAddr::from(NODE_IP), IpAddr::from(NODE_IP_V6)] {
        wait_spread(cluster.lab.client(), at(node_ip, NODE_PORT), 5, &["pod0"]);
    }
    let pod = cluster.lab.pod(1);
    for other in [IpAddr::from(POD_GATEWAY), IpAddr::from(POD_GATEWAY_V6)] {
        let refused = pod.tcp_request(at(other, NODE_PORT), Duration::from_secs(2));
        assert_eq!(
            refused.as_ref().map_err(std::io::Error::kind),
            Err(ErrorKind::ConnectionRefused),
            "NodePort on {other}: {refused:?}"
        );
    }
    assert!(
        cluster
            .iptables_save()
            .contains("-d 192.168.77.1/32 -m comment --comment \"kubernetes service nodeports;"),
        "{}",
        cluster.iptables_save()
    );

    // The same node without the setting: every local address serves NodePorts.
    cluster.proxy.take().unwrap().stop().unwrap();
    cluster.start_proxy(&[]);
    for other in [IpAddr::from(POD_GATEWAY), IpAddr::from(POD_GATEWAY_V6)] {
        wait_spread(cluster.lab.pod(1), at(other, NODE_PORT), 5, &["pod0"]);
    }
}

/// The Node's first address decides the primary family (a dry run lists it first), unless
/// `--bind-address` names another.
#[test]
fn the_primary_family_follows_the_node_object_and_the_bind_address() {
    let cluster = Cluster::new(0);
    let dry_run = |extra: &[&str]| {
        let out = cluster
            .node()
            .command(proxy_binary())
            .args(["--dry-run", &format!("--hostname-override={NODE_NAME}")])
            .arg(format!("--manifests={}", cluster.manifest_path().display()))
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    cluster.write("node.yaml", &node(&[NODE_IP_V6.into(), NODE_IP.into()], &[]));
    assert!(dry_run(&[]).starts_with("# IPv6 rules"));
    assert!(dry_run(&["--bind-address=192.168.77.1"]).starts_with("# IPv4 rules"));
    cluster.write("node.yaml", &node(&[NODE_IP.into(), NODE_IP_V6.into()], &[]));
    let rules = dry_run(&["--nodeport-addresses=primary"]);
    assert!(rules.starts_with("# IPv4 rules"), "{rules}");
    assert!(rules.contains("-d 192.168.77.1 -j KUBE-NODEPORTS"), "{rules}");
    assert!(rules.contains("-d fd00:77::1 -j KUBE-NODEPORTS"), "{rules}");
}
