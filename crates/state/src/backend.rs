//! The one interface between the sync loop and a proxy mode.
//!
//! A backend gets the whole desired state plus what changed since its previous sync, and
//! programs the kernel. It decides for itself when a partial sync is safe (it knows whether
//! its last write failed or someone flushed its rules); the caller can only force a full one.

use std::collections::BTreeSet;

use kpr_model::NamespacedName;
use kpr_tracking::{EndpointsChange, ServiceChange};

use crate::DesiredState;

pub type BackendError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub struct SyncRequest<'a> {
    pub state: &'a DesiredState,
    /// Services whose ports or endpoints changed since the previous call to `sync`.
    pub changed: &'a BTreeSet<NamespacedName>,
    pub service_changes: &'a [ServiceChange],
    pub endpoint_changes: &'a [EndpointsChange],
    /// Rewrite everything, e.g. because node labels (and so topology) changed.
    pub force_full: bool,
}

/// Rule counts of one table, for the `*_iptables_total` / `*_iptables_last` style metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCount {
    pub table: &'static str,
    /// Rules the proxy owns in this table after the sync.
    pub total: usize,
    /// Rules written by this sync.
    pub written: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Whether this was a full sync (everything rewritten) rather than a partial one.
    pub full: bool,
    pub tables: Vec<TableCount>,
    /// Service ports with internalTrafficPolicy Local and no local endpoint.
    pub no_local_internal: usize,
    /// Service ports with externalTrafficPolicy Local and no local endpoint.
    pub no_local_external: usize,
}

pub trait Backend: Send {
    /// The mode name as `/proxyMode` reports it: "iptables", "nftables", "ipvs", "userspace".
    fn mode(&self) -> &'static str;

    /// Programs the kernel to match `request.state`. On error the backend must make its next
    /// sync a full one.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError>;
}
