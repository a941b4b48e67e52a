//! ebpf mode: Service connections translated at the socket.
//!
//! cgroup v2 programs (bpf/socket_lb.c, built by clang in build.rs, loaded by aya) rewrite
//! the destination of `connect()` and `sendmsg()` from a Service address to an endpoint,
//! and the source of UDP replies and `getpeername()` back; so a pod's or the node's
//! connection to a Service goes the direct path, with no NAT and no conntrack entry of its
//! own. What no local socket starts (NodePorts and external IPs from outside, forwarded
//! packets, processes outside the cgroup) meets nftables mode's rules, written by the same
//! process from the same sync request: this mode is nftables mode plus the socket layer.
//!
//! - [`entries`]: the desired state -> per-Service endpoint sets and addresses (pure);
//! - [`table`]: what is programmed -> the ordered map writes of a sync (pure);
//! - [`maps`]: the maps' byte layouts;
//! - [`layer`]: load, attach, pin, adopt, detach (kernel I/O);
//! - [`host`]: the cgroup v2 and bpffs mounts;
//! - `backend`, `mode`, `explain`: the mode behind kpr-mode's seam.

mod backend;
pub mod entries;
mod explain;
pub mod host;
pub mod layer;
pub mod maps;
mod mode;
pub mod table;

pub use backend::{EbpfBackend, SharedLayer};
pub use explain::{EbpfExplainer, explain_at};
pub use layer::{Capacities, DEFAULT_PIN_ROOT, Pins, SocketLayer};
pub use mode::EbpfMode;
