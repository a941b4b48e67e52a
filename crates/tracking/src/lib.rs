//! Change tracking between the sources and the sync loop.
//!
//! Sources report every add/update/delete as it happens; the proxy syncs at most every
//! min-sync-period. In between, the trackers keep, per Service, the state last handed to the
//! proxier and the newest state seen. At sync time they hand over only the Services whose
//! state really changed (an update and its revert within one interval cancel out), together
//! with an immutable snapshot of the whole map for rule generation.
//!
//! The snapshot is an `Arc`'d map: the proxier can read it for seconds while sources keep
//! feeding the tracker, and the tracker copies the map only if a snapshot is still alive
//! when it next applies changes. That copy is of keys and pointers only: each Service's
//! ports and endpoints are `Arc`s shared by the tracker and every snapshot, and the
//! endpoints of a Service with one slice are that slice's own lists, so a snapshot holds no
//! second copy of the cluster.

mod endpoints;
mod services;

pub use endpoints::{
    EndpointsChange, EndpointsMap, EndpointsTracker, PortKey, ServiceEndpoints, endpoints_for,
};
pub use services::{ServiceChange, ServiceMap, ServiceTracker};

use kpr_model::{IgnoredValue, Rejection};

/// Entries of room a map of pending changes keeps after `take()` empties it. The initial
/// lists make it as large as the cluster (every object is a change), and an emptied
/// `HashMap` keeps its buckets: 3 MB per map at 50k Services, held for the life of the
/// process for the few changes a sync sees after that.
const ROOM_AFTER_TAKE: usize = 1024;

/// What recording one object version did to a tracker.
#[derive(Debug)]
pub struct Recorded {
    /// Whether the tracker's state changed (upstream's "change needed"): only then does the
    /// proxy need a sync. An identical version sent again (a relist) or a slice of the other
    /// IP family changes nothing, and upstream then neither syncs nor counts a queued change.
    pub changed: bool,
    /// The list entries the conversion dropped, or why the object was rejected (it is then
    /// treated as absent).
    pub outcome: Result<Vec<IgnoredValue>, Rejection>,
}

/// What one `take()` hands to the proxier: the changed keys and a snapshot of everything.
#[derive(Debug)]
pub struct Changes<C, M> {
    pub changed: Vec<C>,
    pub snapshot: std::sync::Arc<M>,
}
