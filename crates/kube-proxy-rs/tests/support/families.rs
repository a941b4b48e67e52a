//! Dual-stack and node-fact scenarios: IPv6 backends, Services of either or both families,
//! IPv6 slices, and this node's Node as a manifest (its addresses and pod CIDRs).

use std::net::{IpAddr, SocketAddr};

use kpr_netns::{Backend, pod_ip, pod_ip_v6};

use super::{Cluster, NODE_NAME};

/// Both cluster CIDRs of the lab, as a dual-stack cluster's `--cluster-cidr`.
pub const DUAL_STACK_CLUSTER_CIDR: &str = "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56";

/// Which addresses of the pods a slice or backend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn pod_ip(self, index: usize) -> IpAddr {
        match self {
            Self::V4 => pod_ip(index).into(),
            Self::V6 => pod_ip_v6(index).into(),
        }
    }

    /// The name the API uses (`ipFamilies`, `addressType`).
    pub fn api(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// TCP backends answering "pod<i>" on the `family` address of each pod in `pods`; they stop
/// when the returned handles drop.
pub fn tcp_backends(cluster: &Cluster, family: Family, pods: &[usize], port: u16) -> Vec<Backend> {
    pods.iter()
        .map(|&i| {
            let addr = SocketAddr::new(family.pod_ip(i), port);
            cluster.lab.pod(i).tcp_backend(addr, &format!("pod{i}")).unwrap()
        })
        .collect()
}

/// Like [`tcp_backends`], over UDP.
pub fn udp_backends(cluster: &Cluster, family: Family, pods: &[usize], port: u16) -> Vec<Backend> {
    pods.iter()
        .map(|&i| {
            let addr = SocketAddr::new(family.pod_ip(i), port);
            cluster.lab.pod(i).udp_backend(addr, &format!("pod{i}")).unwrap()
        })
        .collect()
}

/// Source addresses of every connection or datagram `backends` answered.
pub fn peers(backends: &[Backend]) -> Vec<IpAddr> {
    backends.iter().flat_map(Backend::peers).map(|p| p.ip()).collect()
}

/// Service `name` with one cluster IP per entry of `cluster_ips` (their families in that
/// order, dual-stack when there are two), port `port` -> `target` over `protocol`, and a
/// NodePort Service when `node_port` is given.
pub fn service(
    name: &str,
    cluster_ips: &[IpAddr],
    port: u16,
    target: u16,
    protocol: &str,
    node_port: Option<u16>,
) -> String {
    let (kind, node_port) = match node_port {
        Some(p) => ("NodePort", format!("\n    nodePort: {p}")),
        None => ("ClusterIP", String::new()),
    };
    let families: Vec<&str> = cluster_ips
        .iter()
        .map(|ip| if ip.is_ipv4() { "IPv4" } else { "IPv6" })
        .collect();
    let policy = if cluster_ips.len() > 1 {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    let ips: Vec<String> = cluster_ips.iter().map(ToString::to_string).collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: {kind}\n  \
         clusterIP: {first}\n  clusterIPs: [{ips}]\n  ipFamilies: [{families}]\n  ipFamilyPolicy: {policy}\n  \
         ports:\n  - name: p\n    port: {port}\n    targetPort: {target}\n    protocol: {protocol}{node_port}\n",
        first = ips[0],
        ips = ips.join(", "),
        families = families.join(", "),
    )
}

/// An EndpointSlice of `family` for Service `name`, with ready endpoints on `pods` on this
/// node (one slice per family, as the endpoint-slice controller makes them).
pub fn slice(name: &str, family: Family, pods: &[usize], port: u16, protocol: &str) -> String {
    let endpoints: String = pods
        .iter()
        .map(|&i| {
            format!(
                "- addresses: [\"{}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  nodeName: {NODE_NAME}\n",
                family.pod_ip(i)
            )
        })
        .collect();
    let endpoints = if endpoints.is_empty() {
        "[]\n".to_string()
    } else {
        format!("\n{endpoints}")
    };
    let suffix = family.api().to_lowercase();
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{suffix}\n  \
         namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\naddressType: {}\nports:\n- name: p\n  \
         port: {port}\n  protocol: {protocol}\nendpoints: {endpoints}",
        family.api()
    )
}

/// This node's Node, with these InternalIP addresses and pod CIDRs.
pub fn node(addresses: &[IpAddr], pod_cidrs: &[&str]) -> String {
    let addresses: String = addresses
        .iter()
        .map(|a| format!("\n  - type: InternalIP\n    address: \"{a}\""))
        .collect();
    let spec = match pod_cidrs.first() {
        Some(first) => format!(
            "spec:\n  podCIDR: \"{first}\"\n  podCIDRs: [{}]\n",
            pod_cidrs
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "spec: {}\n".to_string(),
    };
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE_NAME}\n{spec}status:\n  addresses:{addresses}\n"
    )
}

/// `ip6tables-save` inside the node, with the binaries the proxy picks by default.
pub fn ip6tables_save(cluster: &Cluster) -> String {
    cluster.node().sh("ip6tables-save").unwrap()
}
