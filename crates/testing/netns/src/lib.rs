//! Test support for end-to-end tests on the real kernel: a one-node "cluster" made of
//! network namespaces ([`Lab`]), real TCP/UDP backends in pod namespaces, clients that
//! send real traffic from any namespace, and the kube-proxy-rs binary run inside the node.
//! For what ordinary clients cannot show: a UDP client that keeps one flow alive
//! ([`UdpFlow`]) and a crafted TCP segment ([`Segment`]).
//!
//! Nothing is created in the root namespace and everything is deleted on drop, also when
//! a test panics; namespaces of test processes that were killed are swept by the next
//! [`Lab::new`]. Needs root, iproute2 and the `br_netfilter` module.

mod addressing;
mod backend;
mod client;
mod client_addresses;
mod error;
mod eventually;
mod http;
mod lab;
mod naming;
mod netns;
mod process;
mod raw_tcp;
mod shell;
mod sweep;
mod udp_flow;

pub use addressing::{
    BRIDGE, CLIENT_IFACE, CLIENT_IP, CLIENT_IP_V6, CLUSTER_CIDR, CLUSTER_CIDR_V6, FIRST_POD_HOST, MAX_PODS,
    NODE_IFACE, NODE_IP, NODE_IP_V6, NODE_LINK_PREFIX_LEN, NODE_LINK_PREFIX_LEN_V6, NODE_LINK_SUBNET,
    NODE_LINK_SUBNET_V6, POD_GATEWAY, POD_GATEWAY_V6, POD_IFACE, POD_PREFIX_LEN, POD_PREFIX_LEN_V6,
    POD_SUBNET, POD_SUBNET_V6, pod_ip, pod_ip_v6,
};
pub use backend::{Backend, split_peer_reply};
pub use client::{SPREAD_TIMEOUT, spread, spread_from, spread_udp};
pub use client_addresses::{FIRST_EXTRA_CLIENT_HOST, MAX_EXTRA_CLIENT_ADDRESSES, extra_client_ip};
pub use error::{Error, Result};
pub use eventually::{TIMEOUT_SCALE_ENV, eventually};
pub use lab::Lab;
pub use naming::NAME_PREFIX;
pub use netns::{Netns, enter as enter_thread};
pub use process::{ProcessGuard, STOP_GRACE};
pub use raw_tcp::Segment;
pub use sweep::sweep_stale_namespaces;
pub use udp_flow::UdpFlow;
