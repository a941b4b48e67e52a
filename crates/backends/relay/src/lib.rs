//! The proxy's own data path: a listener per service port, carrying TCP and UDP from the
//! clients to the endpoints in this process, shaped like upstream's userspace proxy
//! (pkg/proxy/userspace, removed in 1.26).
//!
//! Its own crate because more than one mode is to carry traffic itself: userspace mode
//! (behind its iptables portals, in kpr-userspace) and nftables mode's NodePorts on the
//! loopback address (upstream 1.37, KEP-6032), which must not build on iptables mode. So
//! this crate knows no mode, no rule and no API object: a caller opens a port on an
//! address, gives it endpoints, closes it ([`Relay`]), and counts under its own names.
//!
//! # Design
//!
//! - **A listener per service port** ([`tcp`], [`udp`]), on the address the caller binds
//!   ([`Relay::bind`]): a fixed one, or one from a range the caller scans.
//! - **Load balancing** ([`balancer`]): upstream's round robin per service port with
//!   ClientIP affinity, pure (time and randomness from the caller), unit-tested. A failed
//!   connect moves on to the next endpoint down upstream's dial-timeout ladder.
//! - **Endpoint changes never touch carried connections**: they only swap what the
//!   balancer picks from ([`port`]); closing a port is what ends its connections and UDP
//!   sessions.
//! - **TCP on its own threads** ([`workers`]): an event loop per core ([`reactor`], epoll
//!   through mio, no runtime), each accepting on every listener and keeping what it
//!   accepted, so no connection is handed between threads.
//! - **Fast data path** ([`copy`]): splice(2) through a pipe, so bytes do not pass through
//!   this process; measured against a buffer copy and HAProxy in BENCHMARKS.md.
//! - **Bounded** ([`limits`]): at most so many connections and UDP sessions; past the
//!   limit clients are refused, told to the caller's [`LimitObserver`] and logged once. The
//!   limits bound the process: a dual-stack proxy's two relays share one [`Budget`].
//! - **Counted into the caller's handles** ([`PortStats`]): connections, bytes, failed
//!   connects and retries, UDP sessions, per port, under whatever names the caller
//!   registered them.

pub mod balancer;
pub mod copy;
pub mod limits;
pub mod port;
pub mod reactor;
mod relay;
pub mod tcp;
pub mod udp;
pub mod workers;

pub use copy::CopyMethod;
pub use limits::{Budget, Kind, LimitObserver, Limits};
pub use port::PortStats;
pub use relay::{Bound, Relay, RelayError, RelayOptions, Transport};
