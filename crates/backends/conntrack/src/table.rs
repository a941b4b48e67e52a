//! The conntrack table as the reconcile needs it: list the UDP entries of one family,
//! delete some. [`crate::NetlinkTable`] is the real one; tests may bring their own.

use std::net::SocketAddr;

use kpr_model::IpFamily;

use crate::entry::UdpEntry;

/// Which UDP entries a listing asks for, by original destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every UDP entry of the family.
    All,
    /// Entries to one service address and port.
    To(SocketAddr),
    /// Entries to one port on any address (a NodePort).
    ToPort(u16),
}

impl Scope {
    pub fn contains(&self, entry: &UdpEntry) -> bool {
        match *self {
            Self::All => true,
            Self::To(address) => entry.original.dst == address,
            Self::ToPort(port) => entry.original.dst.port() == port,
        }
    }
}

/// Why the conntrack table could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("opening a netfilter netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("{during}: {source}")]
    Io {
        during: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{during}: the kernel answered {}", std::io::Error::from_raw_os_error(*.errno))]
    Kernel { during: &'static str, errno: i32 },
    #[error("{during}: unreadable netlink answer: {reason}")]
    Malformed { during: &'static str, reason: String },
}

impl TableError {
    /// The kernel has no such entry (any more).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Kernel { errno, .. } if *errno == ENOENT)
    }
}

pub(crate) const ENOENT: i32 = 2;

/// What one listing found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub entries: Vec<UdpEntry>,
    /// The kernel said the table changed while it was being dumped: some entries may be
    /// missing. Deciding on the rest is still right (upstream goes on as well); what is
    /// missed is caught by the next reconcile.
    pub interrupted: bool,
    /// Entries that could not be read (an attribute the parser refused); left alone.
    pub unreadable: usize,
}

/// What one round of deletions did.
#[derive(Debug, Default)]
pub struct Deletion {
    pub deleted: usize,
    /// Entries that were gone already (timed out, deleted by someone else, or replaced by
    /// a new entry with the same tuple, which the kernel's entry id tells apart).
    pub gone: usize,
    /// Entries that could not be deleted.
    pub failed: usize,
    /// Why the first of them could not (one line in the log, not one per entry).
    pub first_error: Option<TableError>,
}

impl Deletion {
    pub(crate) fn fail(&mut self, count: usize, error: TableError) {
        self.failed += count;
        self.first_error.get_or_insert(error);
    }
}

/// Lists and deletes UDP conntrack entries.
pub trait ConntrackTable: Send {
    /// The UDP entries of `family` in `scope`.
    fn udp_entries(&mut self, family: IpFamily, scope: Scope) -> Result<Listing, TableError>;

    /// Deletes `entries`, each exactly (tuple, zone and, when known, the kernel's id).
    fn delete(&mut self, entries: &[UdpEntry]) -> Deletion;
}
