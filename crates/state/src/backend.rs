//! The one interface between the sync loop and a proxy mode.
//!
//! A backend gets the whole desired state plus what changed since its previous sync, and
//! programs the kernel. It decides for itself when a partial sync is safe (it knows whether
//! its last write failed or someone flushed its rules); the caller can only force a full one.
//!
//! A failed sync says what it attempted (full or partial) and which step failed (the kernel
//! refusing the rules, or something around it), because upstream's metrics count those
//! separately; the sync loop reads these fields, never the message.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use kpr_model::{NamespacedName, NodeView, ObjectKind};
use kpr_tracking::{Changes, EndpointsChange, EndpointsMap, ServiceChange, ServiceMap};

use crate::DesiredState;

/// Whether a sync rewrites everything or only what changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    Full,
    Partial,
}

/// The step of a sync that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailedStep {
    /// The kernel refused or failed to apply the new rules (the mode's one transaction).
    Restore,
    /// Anything else: reading the kernel's state, the host's addresses, the jump rules
    /// from built-in chains, ...
    Other,
}

/// A failed sync: what was attempted, which step failed, and the cause.
#[derive(Debug)]
pub struct BackendError {
    pub attempted: SyncKind,
    pub step: FailedStep,
    pub source: Box<dyn std::error::Error + Send + Sync>,
    /// Retrying cannot help until the operator changes the configuration (ebpf mode: a map
    /// too small for the cluster). Before the family's first successful sync this ends the
    /// process with status 1 (a clear error at start-up); later it is retried and reported
    /// as any failed sync, nothing of it written.
    pub needs_operator: bool,
}

impl BackendError {
    pub fn new(
        attempted: SyncKind,
        step: FailedStep,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            attempted,
            step,
            source: source.into(),
            needs_operator: false,
        }
    }

    /// A failure only a configuration change can fix (the field of this name).
    pub fn needs_operator(
        attempted: SyncKind,
        step: FailedStep,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            needs_operator: true,
            ..Self::new(attempted, step, source)
        }
    }
}

/// Shows the cause only: the kind and step are for metrics, the cause says what happened.
impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

/// Part of an object a backend left out because its text cannot be written into kernel
/// rules safely (the sources should have refused it; this is the second line of defence).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnsafeObject {
    pub kind: ObjectKind,
    /// `namespace/name`.
    pub object: String,
    /// The field holding the text, e.g. `metadata.name`.
    pub field: String,
    /// Why the text was refused.
    pub detail: String,
}

impl fmt::Display for UnsafeObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "left out {} {}: field {}: {}",
            self.kind, self.object, self.field, self.detail
        )
    }
}

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

/// What one `take()` of both trackers hands to a backend, owned; [`PendingSync::request`]
/// lends it out as a [`SyncRequest`].
#[derive(Debug)]
pub struct PendingSync {
    pub state: DesiredState,
    pub changed: BTreeSet<NamespacedName>,
    pub service_changes: Vec<ServiceChange>,
    pub endpoint_changes: Vec<EndpointsChange>,
}

impl PendingSync {
    /// Joins the trackers' changes: a service counts as changed if its ports or its
    /// endpoints did.
    pub fn new(
        services: Changes<ServiceChange, ServiceMap>,
        endpoints: Changes<EndpointsChange, EndpointsMap>,
        node: Arc<NodeView>,
    ) -> Self {
        let changed = services
            .changed
            .iter()
            .map(|c| c.id.clone())
            .chain(endpoints.changed.iter().map(|c| c.service.clone()))
            .collect();
        Self {
            state: DesiredState {
                services: services.snapshot,
                endpoints: endpoints.snapshot,
                node,
                service_cidrs: Arc::default(),
            },
            changed,
            service_changes: services.changed,
            endpoint_changes: endpoints.changed,
        }
    }

    /// The family's Service CIDRs (see [`DesiredState::service_cidrs`]).
    pub fn with_service_cidrs(mut self, cidrs: Arc<Vec<ipnet::IpNet>>) -> Self {
        self.state.service_cidrs = cidrs;
        self
    }

    pub fn request(&self, force_full: bool) -> SyncRequest<'_> {
        SyncRequest {
            state: &self.state,
            changed: &self.changed,
            service_changes: &self.service_changes,
            endpoint_changes: &self.endpoint_changes,
            force_full,
        }
    }
}

/// The kernel objects a backend keeps after a sync, and those the sync wrote, each in the
/// mode's own unit (rules, set elements): for logs, tests and benchmarks. A mode's own
/// metrics (upstream's rule counts per table, say) are the mode's to record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectCount {
    /// Objects the proxy owns after the sync.
    pub total: usize,
    /// Objects written by this sync.
    pub written: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Whether this was a full sync (everything rewritten) rather than a partial one.
    pub full: bool,
    pub objects: ObjectCount,
    /// Service ports with internalTrafficPolicy Local and no local endpoint.
    pub no_local_internal: usize,
    /// Service ports with externalTrafficPolicy Local and no local endpoint.
    pub no_local_external: usize,
    /// The conntrack reconcile after the sync, if one ran (`conntrack_reconciler_*`).
    pub conntrack_reconcile: Option<ConntrackReconcile>,
    /// Objects (or ports of them) left out of the rules for the first time in this sync:
    /// each is reported once, not on every sync while it stays bad.
    pub newly_unsafe: Vec<UnsafeObject>,
}

/// One reconcile of the UDP conntrack entries after a sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConntrackReconcile {
    /// Stale entries deleted.
    pub deleted: u64,
    pub duration: std::time::Duration,
}

/// One IP family's programming of the kernel, in one proxy mode.
pub trait Backend: Send {
    /// Programs the kernel to match `request.state`. On error the backend must make its next
    /// sync a full one.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError>;

    /// Given once, before the first sync: how to ask for a sync at once when the backend
    /// notices someone else changed what it wrote (a flushed table, a deleted chain). The
    /// sync that follows must find and repair the damage; the backend's own writes must
    /// never ask (a sync loop feeding itself). The default ignores it: such a backend is
    /// repaired by the periodic sync.
    fn repair_with(&mut self, _repair: crate::RepairRequest) {}
}
