//! Facts and knobs of the node kube-proxy-rs runs on, which belong to no proxy mode.
//!
//! Upstream's proxiers each compute these in their constructors from the same settings;
//! here they are read once and handed to whichever mode runs, so modes cannot disagree about
//! the node, and a new mode gets them for free:
//! - [`HostFacts`]: local-traffic detection ([`LocalDetector`]), the NodePort addresses
//!   ([`NodePortAddresses`]), the bind address and conntrack's liberal TCP tracking, from the
//!   configuration and the node's facts;
//! - [`NodeFacts`]/[`NodeIps`]: the node IPs and primary family as upstream's
//!   `detectNodeIPs` decides them;
//! - [`LocalAddresses`]: this host's interface addresses, read before each sync where the
//!   NodePort addresses need them;
//! - [`Sysctl`] and [`conntrack`]: kernel parameters, and the conntrack settings upstream
//!   applies at start-up.

mod addresses;
pub mod conntrack;
mod facts;
mod local;
mod node;
mod node_ports;
mod sysctl;

pub use addresses::{AddressError, FixedAddresses, InterfaceAddresses, LocalAddresses};
pub use facts::{HostFacts, InvalidSetting, nodeport_addresses, specific_address};
pub use local::LocalDetector;
pub use node::{NodeFacts, NodeIps, node_host_ips};
pub use node_ports::{NodePortAddresses, NodePortTargets};
pub use sysctl::{ProcSysctl, Sysctl, TCP_BE_LIBERAL, conntrack_tcp_be_liberal};
