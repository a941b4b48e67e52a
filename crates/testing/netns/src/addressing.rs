//! The lab's fixed addressing plan, shared by the harness and the end-to-end tests.
//!
//! Every lab uses the same addresses: the namespaces isolate them, so parallel labs never
//! collide, and tests can name pods, the node and the client without asking the lab.
//!
//! Every lab is dual-stack: each IPv4 address below has an IPv6 twin (`_V6`) on the same
//! interface, as on a dual-stack node (the pod subnet `fd00:10:244:1::/64` inside the
//! cluster's `fd00:10:244::/56`, as kind numbers them). IPv4-only tests just never use them.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The cluster CIDR to give kube-proxy (`--cluster-cidr`): every pod IP of every node.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// This node's pod subnet (the node's `spec.podCIDR`), carried by the bridge [`BRIDGE`].
pub const POD_SUBNET: &str = "10.244.1.0/24";

/// Prefix length of [`POD_SUBNET`], used on the bridge and on every pod's `eth0`.
pub const POD_PREFIX_LEN: u8 = 24;

/// The node's address on the pod bridge: the pods' default gateway.
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);

/// Host part of the first pod's IP: pod `i` gets `10.244.1.(10 + i)`.
pub const FIRST_POD_HOST: u8 = 10;

/// How many pods fit in [`POD_SUBNET`] after [`FIRST_POD_HOST`] (the last usable host is .254).
pub const MAX_PODS: usize = 254 - FIRST_POD_HOST as usize + 1;

/// The link between the node and the outside client.
pub const NODE_LINK_SUBNET: &str = "192.168.77.0/24";

/// Prefix length of [`NODE_LINK_SUBNET`].
pub const NODE_LINK_PREFIX_LEN: u8 = 24;

/// The node's IP (on its `eth0`, facing the client): the address NodePorts are reached on
/// and the one to give kube-proxy as the node IP.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);

/// The outside client's IP. The node's default route points here, so traffic the node
/// itself sends to a Service VIP has a route (kube-proxy rewrites it in OUTPUT before it
/// would leave).
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);

/// Name of the pod bridge in the node namespace.
pub const BRIDGE: &str = "kbr0";

/// Name of the node's interface facing the client (in the node namespace).
pub const NODE_IFACE: &str = "eth0";

/// Name of the client's interface (in the client namespace).
pub const CLIENT_IFACE: &str = "eth0";

/// Name of every pod's interface (in its pod namespace).
pub const POD_IFACE: &str = "eth0";

/// The IP of pod `index` (0-based): `10.244.1.(10 + index)`.
///
/// # Panics
/// When `index >= MAX_PODS`; [`crate::Lab::new`] refuses such labs, so a test only gets
/// here by asking for a pod its lab does not have.
pub const fn pod_ip(index: usize) -> Ipv4Addr {
    assert!(index < MAX_PODS, "pod index is outside the pod subnet");
    Ipv4Addr::new(10, 244, 1, FIRST_POD_HOST + index as u8)
}

/// The cluster's IPv6 pod CIDR (the second `--cluster-cidr` entry of a dual-stack cluster).
pub const CLUSTER_CIDR_V6: &str = "fd00:10:244::/56";

/// This node's IPv6 pod subnet (the node's second `spec.podCIDRs` entry), on [`BRIDGE`].
pub const POD_SUBNET_V6: &str = "fd00:10:244:1::/64";

/// Prefix length of [`POD_SUBNET_V6`].
pub const POD_PREFIX_LEN_V6: u8 = 64;

/// The node's IPv6 address on the pod bridge: the pods' IPv6 default gateway.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 1);

/// The IPv6 link between the node and the outside client.
pub const NODE_LINK_SUBNET_V6: &str = "fd00:77::/64";

/// Prefix length of [`NODE_LINK_SUBNET_V6`].
pub const NODE_LINK_PREFIX_LEN_V6: u8 = 64;

/// The node's IPv6 address (on its `eth0`, facing the client), [`NODE_IP`]'s twin.
pub const NODE_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);

/// The outside client's IPv6 address; the node's IPv6 default route points here.
pub const CLIENT_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2);

/// The IPv6 address of pod `index` (0-based): `fd00:10:244:1::<0x10 + index>`, so pod 0 is
/// `fd00:10:244:1::10` beside `10.244.1.10`.
///
/// # Panics
/// When `index >= MAX_PODS`, as [`pod_ip`].
pub const fn pod_ip_v6(index: usize) -> Ipv6Addr {
    assert!(index < MAX_PODS, "pod index is outside the pod subnet");
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0x10 + index as u16)
}

/// Name of the node-side end of pod `index`'s veth (a port of [`BRIDGE`]).
pub(crate) fn pod_port_name(index: usize) -> String {
    format!("vp{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ips_start_at_ten_and_stay_in_the_subnet() {
        assert_eq!(pod_ip(0), Ipv4Addr::new(10, 244, 1, 10));
        assert_eq!(pod_ip(3), Ipv4Addr::new(10, 244, 1, 13));
        assert_eq!(pod_ip(MAX_PODS - 1), Ipv4Addr::new(10, 244, 1, 254));
    }

    #[test]
    fn ipv6_twins_sit_in_their_subnets() {
        assert_eq!(pod_ip_v6(0).to_string(), "fd00:10:244:1::10");
        assert_eq!(pod_ip_v6(3).to_string(), "fd00:10:244:1::13");
        let in_net = |ip: Ipv6Addr, net: &str| {
            let (prefix, len) = net.split_once('/').unwrap();
            let prefix: Ipv6Addr = prefix.parse().unwrap();
            let bits: u32 = len.parse().unwrap();
            (u128::from(ip) ^ u128::from(prefix)) >> (128 - bits) == 0
        };
        assert!(in_net(pod_ip_v6(MAX_PODS - 1), POD_SUBNET_V6));
        assert!(in_net(POD_GATEWAY_V6, POD_SUBNET_V6));
        assert!(in_net(POD_GATEWAY_V6, CLUSTER_CIDR_V6));
        assert!(in_net(NODE_IP_V6, NODE_LINK_SUBNET_V6));
        assert!(in_net(CLIENT_IP_V6, NODE_LINK_SUBNET_V6));
    }

    #[test]
    #[should_panic(expected = "outside the pod subnet")]
    fn pod_ip_refuses_an_index_past_the_subnet() {
        let _ = pod_ip(MAX_PODS);
    }

    #[test]
    fn pod_port_names_fit_in_an_interface_name() {
        assert_eq!(pod_port_name(0), "vp0");
        assert!(pod_port_name(MAX_PODS - 1).len() < 16);
    }
}
