//! userspace proxy mode, shaped like upstream kube-proxy's (pkg/proxy/userspace, removed in
//! 1.26): the proxy process itself carries every Service connection.
//!
//! # Design
//!
//! - **A listener per service port** ([`tcp`], [`udp`]), on a port from
//!   `--proxy-port-range` or one the kernel picks ([`ports`]), and the **portals**
//!   ([`portals`]): upstream's iptables nat rules that redirect a Service's addresses and
//!   NodePorts to that listener. Portal rendering is pure and golden-tested; the rules go
//!   through kpr-iptables' rule builder, restore payloads and exec trait, like iptables
//!   mode's.
//! - **Load balancing** ([`balancer`]): upstream's round robin per service port with
//!   ClientIP affinity, pure (time and randomness from the caller), unit-tested. A failed
//!   connect moves on to the next endpoint down upstream's dial-timeout ladder.
//! - **Endpoint changes never touch carried connections**: they only swap what the
//!   balancer picks from ([`port`]); removing a Service port is what closes its listener
//!   and ends its connections and UDP sessions.
//! - **TCP on its own threads** ([`workers`]): an event loop per core ([`reactor`], epoll
//!   through mio, no runtime), each accepting on every listener and keeping what it
//!   accepted, so no connection is handed between threads.
//! - **Fast data path** ([`copy`]): splice(2) through a pipe, so bytes do not pass through
//!   this process; measured against a buffer copy and HAProxy in BENCHMARKS.md.
//! - **Bounded** ([`limits`]): at most so many connections and UDP sessions; past the
//!   limit clients are refused, counted and logged once. The limits bound the process: a
//!   dual-stack proxy's two backends share one [`Budget`].
//! - **Metrics** are kpr-metrics' `kubeproxy_userspace_*`, per service port, removed with
//!   the port.
//! - **UDP flows to a closed listener are deleted** from conntrack ([`conntrack`]): the
//!   portal's REDIRECT is remembered per flow, and a client that keeps its source port
//!   would otherwise keep being sent to a port nobody listens on.
//! - **SCTP is not supported** in this mode: such ports are left out, logged once each and
//!   counted in `kubeproxy_userspace_unsupported_service_ports`.
//! - [`UserspaceBackend`] ([`proxier`]) is the mode's `Backend`: it runs on the sync loop's
//!   blocking thread, starts the UDP listeners on the proxy's tokio runtime through a
//!   `Handle`, and hands the TCP listeners to its TCP threads.

pub mod balancer;
pub mod conntrack;
pub mod copy;
pub mod limits;
pub mod metrics;
mod mode;
pub mod port;
pub mod portals;
pub mod ports;
pub mod proxier;
pub mod reactor;
pub mod tcp;
pub mod udp;
pub mod workers;

pub use copy::CopyMethod;
pub use limits::{Budget, Limits};
pub use metrics::UserspaceMetrics;
pub use mode::UserspaceMode;
pub use portals::{Portal, PortalTargets};
pub use proxier::{SyncError, UserspaceBackend, UserspaceOptions};
