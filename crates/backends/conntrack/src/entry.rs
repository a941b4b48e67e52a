//! One UDP conntrack entry as the kernel reports it: what the reconcile decides on and
//! what a deletion names.

use std::fmt;
use std::net::SocketAddr;

/// One direction of a flow: who sent, to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowTuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// A UDP conntrack entry. For a flow DNATed to an endpoint, `original.dst` is the service
/// address the client used and `reply.src` the endpoint that answers; without NAT both
/// are the same address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UdpEntry {
    pub original: FlowTuple,
    pub reply: FlowTuple,
    /// The kernel's id of the entry (`CTA_ID`): a deletion that names it cannot hit a new
    /// entry that reused the tuple after the listing.
    pub id: Option<u32>,
    /// The conntrack zone (`CTA_ZONE`); `None` is the default zone.
    pub zone: Option<u16>,
}

impl fmt::Display for UdpEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "udp {} -> {} (reply from {})",
            self.original.src, self.original.dst, self.reply.src
        )
    }
}
