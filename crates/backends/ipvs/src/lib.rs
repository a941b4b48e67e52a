//! ipvs mode: upstream's IPVS proxier in kube-proxy-rs's pipeline.
//!
//! Every Service address becomes an IPVS virtual server whose real servers are the
//! endpoints; the addresses are bound to the `kube-ipvs0` dummy link so the node accepts
//! their traffic; a small, fixed iptables ruleset does what IPVS cannot (masquerading,
//! source ranges, Local policies, dropping what no Service holds), matching the Services
//! through ipsets instead of a rule per Service. The kernel objects come from
//! kpr-ipvs-netlink; this crate decides what they must be.
//!
//! What upstream does, sync by sync, is written down in `UPSTREAM.md` beside this crate
//! (from reading upstream, in our own words): the plan follows it case by case.
//!
//! - [`plan()`]: the pure decision of a sync, one family's desired state in, virtual servers
//!   with their real servers, `kube-ipvs0` addresses and set members out ([`IpvsPlan`],
//!   printable for `--dry-run` and golden files).
//! - [`reconcile`]: from the kernel's IPVS table to the plan's as a list of operations
//!   (pure), with graceful termination (a removed TCP real server with connections drains
//!   at weight 0); [`kernel`] reads the table and writes the operations.
//! - [`IpvsBackend`]: one sync as upstream's, in order (kube-ipvs0, addresses, plan, sets,
//!   rules and jumps, new addresses, virtual servers, stale addresses), each step writing
//!   only what differs from what the kernel holds.
//! - [`rules`]: the fixed iptables ruleset matching Services through the sets, and its
//!   jumps from the built-in chains (pure, golden files `tests/golden/*.rules`).
//! - [`addresses`]: this host's addresses split as a sync needs them (on kube-ipvs0, on
//!   other interfaces, serving NodePorts).
//! - [`sets`]: the seventeen sets, their names per family and upstream's comments.
//! - [`ipset`]: the sets as values, the changes that turn what the kernel has into what is
//!   wanted (pure), written and read back over netlink ([`IpsetNetlink`], chosen by
//!   measurement over the `ipset` tool, [`IpsetCli`]; figures in the module).

pub mod addresses;
mod backend;
pub mod explain;
pub mod ipset;
pub mod kernel;
pub mod leftovers;
mod mode;
mod plan;
pub mod reconcile;
pub mod rules;
pub mod sets;
#[cfg(test)]
mod test_support;

pub use backend::{DEFAULT_RECONCILE_PERIOD, IpvsBackend, IpvsOptions, SyncError, SyncStats};
pub use ipset::{Ipset, IpsetCli, IpsetNetlink};
pub use mode::IpvsMode;
pub use plan::{IpvsPlan, PlanInputs, VirtualServer, plan};
