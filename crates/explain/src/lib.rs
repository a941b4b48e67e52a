//! `kube-proxy-rs explain <ip>:<port>[/proto]`: which Service port a destination maps to,
//! its endpoints with their weights, the policy decisions on the way (why REJECT, why
//! DROP, which endpoints are local, affinity, masquerading, source ranges) and the kernel
//! objects that implement them, read back from the live kernel.
//!
//! # Why
//!
//! The nftables mode keeps a constant number of kernel objects per Service (elements of
//! shared maps, chains shared by every Service of one shape), so there is no chain per
//! Service left to read when debugging; and even in the iptables mode, following
//! KUBE-SERVICES through KUBE-EXT/KUBE-SVC/KUBE-SEP and turning statistic probabilities
//! into shares is tedious. Upstream has no such tool.
//!
//! # Shape
//!
//! This crate holds what every mode's explanation has in common; each mode's crate reads
//! its own objects back ([`Explainer`], reached through the mode's seam):
//! - [`Query`]: the destination asked about;
//! - [`Explanation`], [`Section`], [`Finding`]: what a mode's objects do with it, as values;
//! - [`render`]: findings -> the text the command prints;
//! - [`explain_live`]: asks every mode's [`Explainer`] about the calling thread's network
//!   namespace and explains in every mode whose objects exist (several -> each, with a note).
//!
//! # Limits
//!
//! - Which endpoints are local is known only where a Local policy splits them out.
//! - The pod-network condition of cluster-IP masquerading is described, not read back.

mod live;
mod query;
mod report;

pub use live::{Explainer, explain_live};
pub use query::{Query, QueryError};
pub use report::{Endpoint, EndpointGroup, Explanation, Finding, Outcome, Section, Weight, render};
