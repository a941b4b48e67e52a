//! Forgetting stale UDP conntrack entries, as upstream's `CleanStaleEntries` does after
//! every sync (pkg/proxy/conntrack, 1.32+).
//!
//! UDP has no connection to close: a client that keeps its socket (a DNS resolver, say)
//! keeps its 5-tuple, so conntrack keeps sending its datagrams wherever the first one was
//! DNATed, even after that endpoint left the Service; and datagrams that arrived before a
//! Service's rules existed leave entries without DNAT that shadow its endpoints. Such
//! entries never time out while traffic refreshes them.
//!
//! - [`Frontends`]: which entries are stale, from the desired state alone
//!   (pure): an entry to a UDP service frontend whose reply does not come from one of
//!   that port's *serving* endpoints (terminating ones included). Nothing else is touched.
//! - [`Reconciler`]: when to look and how much (the whole table, or only the frontends
//!   of services a sync changed), and what to report (`conntrack_reconciler_*`).
//! - [`NetlinkTable`]: the I/O, over ctnetlink: kernel-filtered dumps and deletions by
//!   exact tuple and entry id.
//!
//! Cost, measured with `examples/reconcile_cost.rs` (real flows DNATed in a namespace
//! lab, 2 cores shared with other builds, kernel hash table of 262,144 buckets): listing
//! 10,000 UDP entries takes ~12 ms user + ~25 ms kernel CPU; 100,000 take ~90-160 ms user
//! plus ~150-250 ms kernel (0.4-1 s wall on the loaded machine). A kernel-filtered dump that
//! matches nothing costs ~10 ms (10,000 entries) to ~37 ms (100,000) of kernel CPU: the
//! kernel still walks its whole table. Upstream's whole-table reconcile after every sync
//! would take a third of a core on a busy node with 100,000 UDP entries; hence the two
//! sizes of reconcile in [`Reconciler`], where a sync that changed no UDP service costs
//! nothing.

mod decision;
mod entry;
mod netlink;
mod reconciler;
mod table;

pub use decision::{Frontends, scopes_of};
pub use entry::{FlowTuple, UdpEntry};
pub use netlink::NetlinkTable;
pub use reconciler::{
    Conntrack, DEFAULT_FULL_PERIOD, MAX_TARGETED_DUMPS, Reconciled, Reconciler, clean_up_after,
};
pub use table::{ConntrackTable, Deletion, Listing, Scope, TableError};
