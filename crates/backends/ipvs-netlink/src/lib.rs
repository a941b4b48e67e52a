//! The ipvs mode's kernel objects over netlink, for the ipvs mode and for removing what
//! upstream's ipvs mode left: virtual services, their real servers and the connection
//! timeouts as typed values ([`Service`], [`Destination`], [`Timeouts`]), their generic-
//! netlink messages as pure functions ([`messages`], pinned byte for byte by tests), and
//! [`Ipvs`], one socket in the calling thread's network namespace; and the `kube-ipvs0`
//! dummy link with its addresses through rtnetlink ([`IpvsLinks`]).
//!
//! Why our own: no well-kept crate speaks IPVS on the rust-netlink packet crates this
//! workspace uses (`netlink-packet-ipvs` 0.0.1 is built on an older netlink-packet-core and
//! barely documented); the messages are small, and here they are built with
//! netlink-packet-core's attributes and sent through kpr-netlink like every other family.
//!
//! This host's kernel has no IPVS; the kernel tests (`tests/vm.rs`) run in a throw-away
//! guest with Debian's kernel (kpr-vm), with Debian's `ipvsadm` as the independent view of
//! what the kernel made of each message.

mod client;
mod link;
pub mod messages;
mod types;

pub use client::{Ipvs, Listing};
pub use kpr_netlink::NetlinkError;
pub use link::{IPVS_LINK, IpvsLink, IpvsLinks};
pub use messages::IPVS_FAMILY;
pub use types::{
    CALLER_FLAGS, Destination, FLAG_HASHED, FLAG_MH_PORT, FLAG_PERSISTENT, Protocol, Scheduler, Service,
    ServiceKey, Timeouts,
};
