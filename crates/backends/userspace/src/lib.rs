//! userspace proxy mode, shaped like upstream kube-proxy's (pkg/proxy/userspace, removed in
//! 1.26): the proxy process itself carries every Service connection.
//!
//! # Design
//!
//! - **The data path is kpr-relay's**: a listener per service port, the balancer, the TCP
//!   threads, UDP sessions, the byte copy and the limits. It is a crate of its own because
//!   nftables mode is to serve its loopback NodePorts through it too, and must not build on
//!   this crate's iptables. What this mode adds is below.
//! - **Each listener's port** ([`ports`]), from `--proxy-port-range` or, without it, from a
//!   scan of the kernel's ephemeral range, and the **portals** ([`portals`]): upstream's
//!   iptables nat rules that redirect a Service's addresses and NodePorts to that listener.
//!   Portal rendering is pure and golden-tested; the rules go through kpr-iptables' rule
//!   builder, restore payloads and exec trait, like iptables mode's.
//! - **Metrics** are `kubeproxy_userspace_*` ([`metrics`]), per service port, removed with
//!   the port: the relay counts into handles this mode registers under those names.
//! - **UDP flows to a closed listener are deleted** from conntrack ([`conntrack`]): the
//!   portal's REDIRECT is remembered per flow, and a client that keeps its source port
//!   would otherwise keep being sent to a port nobody listens on.
//! - **SCTP is not supported** in this mode: such ports are left out, logged once each and
//!   counted in `kubeproxy_userspace_unsupported_service_ports`.
//! - [`UserspaceBackend`] ([`proxier`]) is the mode's `Backend`: each sync opens, updates
//!   and closes the relay's ports, then writes the portals that lead to them.

pub mod conntrack;
pub mod metrics;
mod mode;
pub mod portals;
pub mod ports;
pub mod proxier;

pub use kpr_relay::{Budget, CopyMethod, Limits};
pub use metrics::UserspaceMetrics;
pub use mode::UserspaceMode;
pub use portals::{Portal, PortalTargets};
pub use proxier::{SyncError, UserspaceBackend, UserspaceOptions};
