//! ipsets over netlink from the process: no `ipset` process.
//!
//! Why here: ipset is a subsystem of nfnetlink (`NFNL_SUBSYS_IPSET`) on the same
//! `NETLINK_NETFILTER` socket as nf_tables, with the same 16-byte header, `nfgenmsg` and
//! attribute layout. This crate already has the attribute writer and reader, the socket
//! set-up (extended and capped acks, receive queue, timeout) and the datagram splitting;
//! the ipset messages reuse them instead of a second copy. What differs is small: ipset
//! has no transactions (each message stands alone and is acknowledged on its own), marks
//! integers in network order with `NLA_F_NET_BYTEORDER`, and reports its own error codes
//! (4096 and up) that the kernel's errno table does not name ([`reason`]).
//!
//! Why netlink at all (issue 11, measured; see kpr-ipvs's `ipset` module and
//! BENCHMARKS.md): a set change through `ipset restore` costs a process start, while the
//! change itself is a few microseconds in the kernel.
//!
//! - [`messages`]: pure builders for create, destroy, add/del, list and the type query,
//!   and the parser of list answers; the bytes are those the `ipset` tool (v7.17) sends
//!   for the same commands, pinned by tests.
//! - [`IpsetSocket`]: one socket in the calling thread's network namespace: creates sets
//!   (with the kernel's newest revision of the type, as the tool does), applies many
//!   additions and deletions per `sendmsg` with one acknowledgement each (a refused one
//!   names the set, the member and the kernel's reason), lists sets back, destroys them.
//!
//! The API speaks ipset's concepts and nothing of Kubernetes.

mod client;
pub mod messages;

pub use client::IpsetSocket;
pub use messages::{Change, CreateOptions, Entry, ListedSet, Op, SetDef, SetFamily, SetType, reason};
