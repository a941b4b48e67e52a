//! One IP family of ebpf mode: nftables mode's backend for the family, then the socket
//! layer's maps, from the same sync request.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use kpr_host::{InterfaceAddresses, LocalAddresses, NodePortAddresses, NodePortTargets};
use kpr_model::IpFamily;
use kpr_state::{
    Backend, BackendError, FailedStep, ObjectCount, RepairRequest, SyncKind, SyncReport, SyncRequest,
};

use crate::layer::{LayerError, SocketLayer};
use crate::table::{Adopted, Ids, Table, adopted_of};

/// The socket layer both families' backends write to (one set of maps), with the endpoint
/// set ids they share.
#[derive(Debug)]
pub struct SharedLayer {
    layer: SocketLayer,
    ids: Ids,
    /// Entries per family in the maps: the capacities bound their sum.
    sizes: [(usize, usize); 2],
}

impl SharedLayer {
    pub fn new(layer: SocketLayer) -> Result<(Arc<Mutex<Self>>, Adopted, Adopted), LayerError> {
        let (services, backends) = layer.adopted_entries()?;
        let ids = Ids::above(backends.iter().map(|(k, _)| k.id));
        let v4 = adopted_of(IpFamily::V4, &services, &backends);
        let v6 = adopted_of(IpFamily::V6, &services, &backends);
        if !services.is_empty() {
            tracing::info!(
                services = services.len(),
                backends = backends.len(),
                "adopted the socket maps of a previous process"
            );
        }
        Ok((
            Arc::new(Mutex::new(Self {
                layer,
                ids,
                sizes: [(0, 0); 2],
            })),
            v4,
            v6,
        ))
    }

    pub fn layer(&self) -> &SocketLayer {
        &self.layer
    }
}

/// Locks the shared layer; a panic in the other family's sync does not poison this one's
/// (the table is rebuilt by a full sync anyway).
fn lock(shared: &Mutex<SharedLayer>) -> MutexGuard<'_, SharedLayer> {
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// ebpf mode's backend for one family.
pub struct EbpfBackend {
    family: IpFamily,
    nftables: Box<dyn Backend>,
    shared: Arc<Mutex<SharedLayer>>,
    table: Table,
    nodeport_addresses: NodePortAddresses,
    /// The node addresses the NodePort entries were written for.
    node_addresses: Option<Vec<IpAddr>>,
    full_next: bool,
    /// Whether a sync of this family succeeded (before that, a capacity failure ends
    /// start-up, and this start's programs are taken away).
    synced_once: bool,
}

impl EbpfBackend {
    pub fn new(
        family: IpFamily,
        nftables: Box<dyn Backend>,
        shared: Arc<Mutex<SharedLayer>>,
        table: Table,
        nodeport_addresses: NodePortAddresses,
    ) -> Self {
        Self {
            family,
            nftables,
            shared,
            table,
            nodeport_addresses,
            node_addresses: None,
            full_next: true,
            synced_once: false,
        }
    }

    /// This node's addresses that accept NodePorts (not loopback: nftables mode serves
    /// none there by default, and the socket layer follows it).
    fn node_addresses(&self) -> Result<Vec<IpAddr>, String> {
        let all = InterfaceAddresses
            .addresses(self.family)
            .map_err(|e| e.to_string())?;
        let mut addresses = match self.nodeport_addresses.targets(self.family, &all) {
            NodePortTargets::AllLocal => all,
            NodePortTargets::Ips(ips) => ips,
        };
        addresses.retain(|ip| !ip.is_loopback());
        Ok(addresses)
    }

    /// The socket maps' writes for `request`, checked against the maps' capacities before
    /// anything (nftables' rules included) is written.
    fn plan(&mut self, request: &SyncRequest<'_>) -> Result<Planned, BackendError> {
        let node_addresses = self
            .node_addresses()
            .map_err(|e| BackendError::new(SyncKind::Full, FailedStep::Other, e))?;
        let full =
            self.full_next || request.force_full || self.node_addresses.as_ref() != Some(&node_addresses);
        let kind = if full { SyncKind::Full } else { SyncKind::Partial };
        let mut shared = lock(&self.shared);
        let shared = &mut *shared;
        let changed = (!full).then_some(request.changed);
        let batch = self
            .table
            .sync(request.state, changed, &node_addresses, &mut shared.ids);
        let index = usize::from(self.family == IpFamily::V6);
        let mut sizes = shared.sizes;
        sizes[index] = self.table.sizes();
        let (services, backends) = sizes.iter().fold((0, 0), |(s, b), (fs, fb)| (s + fs, b + fb));
        if let Err(error) = shared.layer.capacities().check(services, backends) {
            self.table.forget_unwritten(&batch.ops);
            self.full_next = true;
            self.count_failure("capacity");
            if !self.synced_once {
                // Start-up ends here (status 1): take away what this start attached, so
                // no half-programmed layer is left. Adopted maps keep serving.
                if let Err(detail) = shared.layer.abandon() {
                    tracing::warn!("socket layer not fully removed: {detail}");
                }
            }
            return Err(BackendError::needs_operator(kind, FailedStep::Restore, error));
        }
        shared.sizes = sizes;
        Ok(Planned {
            full,
            kind,
            node_addresses,
            ops: batch.ops,
        })
    }

    fn apply(&mut self, planned: Planned) -> Result<(bool, ObjectCount), BackendError> {
        let mut shared = lock(&self.shared);
        if let Err(error) = shared.layer.apply(&planned.ops) {
            self.table.forget();
            self.full_next = true;
            let reason = if matches!(error, LayerError::Capacity { .. }) {
                "capacity"
            } else {
                "kernel"
            };
            self.count_failure(reason);
            return Err(BackendError::new(planned.kind, FailedStep::Restore, error));
        }
        self.full_next = false;
        self.synced_once = true;
        self.node_addresses = Some(planned.node_addresses);
        let (services, backends) = self.table.sizes();
        Ok((
            planned.full,
            ObjectCount {
                total: services + backends,
                written: planned.ops.len(),
            },
        ))
    }

    fn count_failure(&self, reason: &'static str) {
        if let Some(metrics) = crate::mode::METRICS.get() {
            metrics
                .get_or_create(&crate::mode::FailureLabels {
                    ip_family: self.family.label(),
                    reason,
                })
                .inc();
        }
    }
}

/// A sync's socket map writes, checked to fit.
struct Planned {
    full: bool,
    kind: SyncKind,
    node_addresses: Vec<IpAddr>,
    ops: Vec<crate::table::Op>,
}

impl Backend for EbpfBackend {
    /// nftables first, so that a Service the socket layer starts translating already has
    /// its rules (for REJECT, and for traffic that meets no socket program).
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        // The socket writes are planned (and checked to fit) first: a cluster too large for
        // the maps fails the sync before anything is written.
        let planned = self.plan(request)?;
        let mut report = match self.nftables.sync(request) {
            Ok(report) => report,
            Err(error) => {
                self.table.forget();
                self.full_next = true;
                return Err(error);
            }
        };
        let (full, sockets) = self.apply(planned)?;
        report.full |= full;
        report.objects.total += sockets.total;
        report.objects.written += sockets.written;
        Ok(report)
    }

    /// nftables' watch repairs its rules; the socket layer's maps are the process's own
    /// (pinned, written by no one else), so nothing else needs watching.
    fn repair_with(&mut self, repair: RepairRequest) {
        self.nftables.repair_with(repair);
    }
}
