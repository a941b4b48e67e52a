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
//! Pure analysis, I/O at the edge:
//! - [`nft_table::NftTable`]: our nftables table as typed values, decoded from kpr-nfnetlink
//!   dumps or taken from kpr-nftables' generation (golden tests); names are parsed back
//!   through kpr-nftables' `names`, so reader and writer cannot drift;
//! - [`nft::explain`], [`ipt::explain`] and [`ipvs::explain`]: (objects, query) -> findings;
//! - [`render`]: findings -> the text the command prints;
//! - [`explain_live`]: reads the calling thread's network namespace (netlink for nftables,
//!   `iptables-save` for iptables, netlink for IPVS) and explains in every mode whose objects
//!   exist (`table ip/ip6 kube-proxy` -> nftables, `kube-ipvs0` -> ipvs, Service chains in
//!   nat -> iptables; several -> each, with a note).
//!
//! It lives in its own crate (`crates/explain`) rather than under `crates/backends`: it
//! programs nothing, reads both modes' objects, and is a tool of the binary.
//!
//! # Limits
//!
//! - nftables: the Service name comes from the entry elements' comments, which kpr-nfnetlink's
//!   element dumps do not decode yet; until they do the live output says the name is not
//!   recorded (the golden tests take it from the generation).
//! - Which endpoints are local is known only where a Local policy splits them out.
//! - The pod-network condition of cluster-IP masquerading is described, not read back.

pub mod ipt;
pub mod ipvs;
mod live;
pub mod nft;
pub mod nft_table;
mod query;
mod report;

pub use live::explain_live;
pub use query::{Query, QueryError};
pub use report::{Endpoint, EndpointGroup, Explanation, Finding, Mode, Outcome, Section, Weight, render};
