//! The nftables [`Backend`]: full or partial, which bundles to recompute, and the batches.
//!
//! - **Full** (first sync, after a failure, when forced, every [`FULL_SYNC_PERIOD`], after
//!   a read-back found the table changed by someone else, or after two Services claimed
//!   one key): the table is deleted and rebuilt, in batches of at most
//!   `max_batch_elements` elements.
//! - **Partial** (otherwise): only the bundles of changed Services (and the node's) are
//!   recomputed; the [`Ledger`] turns their difference into one batch. The kernel is not
//!   listed on this path.
//! - **Reconcile**: the table is read back (without elements) and compared with what we
//!   wrote: chain, set and object names (the live entry sets and endpoint maps, the named
//!   counters, included), rule counts (the dispatch
//!   chains': one per live entry set), and the rules' text against the last listing that
//!   matched (a partial sync that rewrote a dispatch chain updates that chain's text).
//!   Any difference makes this sync full, which removes foreign rules and restores ours.
//!   When: a transport that can tell whether anyone else committed (netlink: the ruleset
//!   generation, one request per sync) reads back only then, at any sync; else a sync with
//!   nothing changed (the sync period's tick) reads back, and under steady churn once per
//!   reconcile period.
//! - **Repair**: given a [`RepairRequest`] ([`Backend::repair_with`]) over a transport
//!   with a socket of its own, a thread watches nf_tables notifications
//!   ([`crate::repair`]); someone else's change to our table makes the next sync full and
//!   asks for it at once.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kpr_conntrack::Conntrack;
use kpr_host::{AddressError, InterfaceAddresses, LocalAddresses};
use kpr_model::{IpFamily, NamespacedName, ServicePortName, Sizes};
use kpr_state::{
    Backend, BackendError, FailedStep, ObjectCount, RepairRequest, SyncKind, SyncReport, SyncRequest,
};

use crate::localhost::LocalhostProxy;
use crate::metrics::NftablesMetrics;

use crate::batch::{Batch, BatchCounts, FullStart, Ledger, Op, stream_full};
use crate::build::{
    Bundle, Context, Dest, Owner, build_from, dispatch_rules, fixed_chains, needs_local_addresses,
    node_bundle, port_bundle, shared_rules,
};
use crate::names::{ChainId, EntryKind};
use crate::options::{NftablesOptions, OptionsError};
use crate::repair::RepairWatch;
use crate::transport::{Listing, Transport, TransportError};

/// A full sync at least this often repairs any drift the read-back cannot see (elements).
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);
/// Upstream's default `nftables.syncPeriod`.
pub const DEFAULT_RECONCILE_PERIOD: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("applying batch {index} of the {} nftables sync: {source}", if *.full { "full" } else { "partial" })]
    Apply {
        full: bool,
        index: usize,
        #[source]
        source: TransportError,
    },
    #[error("reading back table kube-proxy: {0}")]
    ReadBack(#[source] TransportError),
    #[error("{source}")]
    NodeAddresses {
        full: bool,
        #[source]
        source: AddressError,
    },
}

impl SyncError {
    pub fn attempted(&self) -> SyncKind {
        match self {
            Self::Apply { full: true, .. } | Self::NodeAddresses { full: true, .. } => SyncKind::Full,
            _ => SyncKind::Partial,
        }
    }

    pub fn step(&self) -> FailedStep {
        match self {
            Self::Apply { .. } => FailedStep::Restore,
            _ => FailedStep::Other,
        }
    }
}

/// Why a sync is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullSyncReason {
    FirstSync,
    PreviousSyncFailed,
    Forced,
    Periodic,
    /// The read-back differs from what we wrote (flushed, foreign rules, ...).
    TableChanged,
    /// A key two owners claimed lost an owner; a full sync settles it in a fixed order.
    ConflictReleased,
    /// A notification said someone else changed our table ([`crate::repair`]).
    Repair,
}

/// What the kernel holds after the last successful sync.
#[derive(Debug)]
struct Applied {
    ledger: Ledger,
    bundles: HashMap<Owner, Bundle>,
    ports: HashMap<NamespacedName, Vec<ServicePortName>>,
    full_at: Instant,
    /// When the table was last read back and compared.
    checked_at: Instant,
    needs_full: bool,
    /// The last listing that matched what we wrote: rules are compared against it.
    baseline: Option<Listing>,
}

pub struct NftablesBackend {
    opts: NftablesOptions,
    transport: Box<dyn Transport>,
    conntrack: Option<Box<dyn Conntrack>>,
    local_addresses: Box<dyn LocalAddresses>,
    applied: Option<Applied>,
    synced_once: bool,
    full_sync_period: Duration,
    reconcile_period: Duration,
    last_batches: Vec<BatchCounts>,
    last_full_reason: Option<FullSyncReason>,
    /// The mode's own metrics; `None` records nothing (tests, benchmarks).
    metrics: Option<NftablesMetrics>,
    /// Localhost NodePorts' TCP listeners, when this family serves them.
    localhost: Option<LocalhostProxy>,
    /// The watch of nf_tables notifications, once a repair request was given.
    repair: Option<RepairWatch>,
}

impl std::fmt::Debug for NftablesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftablesBackend")
            .field("opts", &self.opts)
            .field("applied_owners", &self.applied.as_ref().map(|a| a.bundles.len()))
            .finish_non_exhaustive()
    }
}

impl NftablesBackend {
    pub fn new(opts: NftablesOptions, transport: Box<dyn Transport>) -> Result<Self, OptionsError> {
        opts.validate()?;
        Ok(Self {
            opts,
            transport,
            conntrack: None,
            local_addresses: Box::new(InterfaceAddresses),
            applied: None,
            synced_once: false,
            full_sync_period: FULL_SYNC_PERIOD,
            reconcile_period: DEFAULT_RECONCILE_PERIOD,
            last_batches: Vec::new(),
            last_full_reason: None,
            metrics: None,
            localhost: None,
            repair: None,
        })
    }

    /// Serves this family's TCP NodePorts on its loopback address through `proxy`,
    /// reconciled after every sync (the options should say
    /// [`crate::LocalhostNodePorts::Proxied`], so the rules leave TCP to it).
    pub fn with_localhost_proxy(mut self, proxy: LocalhostProxy) -> Self {
        self.localhost = Some(proxy);
        self
    }

    /// The localhost NodePort proxy, when this family runs one.
    pub fn localhost_proxy(&self) -> Option<&LocalhostProxy> {
        self.localhost.as_ref()
    }

    pub fn with_local_addresses(mut self, source: Box<dyn LocalAddresses>) -> Self {
        self.local_addresses = source;
        self
    }

    pub fn with_full_sync_period(mut self, period: Duration) -> Self {
        self.full_sync_period = period;
        self
    }

    /// How often, at most, the table is read back while changes keep coming (a sync with
    /// nothing changed always reads it back). Give it the sync period.
    pub fn with_reconcile_period(mut self, period: Duration) -> Self {
        self.reconcile_period = period;
        self
    }

    /// Records the mode's metrics after each sync.
    pub fn with_metrics(mut self, metrics: NftablesMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Deletes stale UDP conntrack entries after each successful sync, as upstream does.
    pub fn with_conntrack(mut self, conntrack: Box<dyn Conntrack>) -> Self {
        self.conntrack = Some(conntrack);
        self
    }

    pub fn options(&self) -> &NftablesOptions {
        &self.opts
    }

    /// Replaces the fixed Service CIDRs (those of the desired state, from ServiceCIDR objects,
    /// are added to them); the next sync, partial or full, writes the difference (the node's
    /// elements are recomputed on every sync).
    pub fn set_service_cidrs(&mut self, cidrs: Vec<ipnet::IpNet>) {
        self.opts.service_cidrs = cidrs;
    }

    /// What the backend keeps between syncs (kpr_model::Sizes): the ledger, the bundles and
    /// ports per owner, the read-back baseline. Guarded by tests/churn.rs.
    pub fn footprint(&self) -> Sizes {
        let mut sizes = Sizes::new().with("last_batches", self.last_batches.len());
        if let Some(proxy) = &self.localhost {
            sizes = sizes.nested("localhost", proxy.footprint());
        }
        let Some(applied) = &self.applied else {
            return sizes;
        };
        let baseline = applied.baseline.as_ref();
        sizes
            .nested("ledger", applied.ledger.footprint())
            .with("bundles", applied.bundles.len())
            .with("ports", applied.ports.len())
            .with("ports.names", applied.ports.values().map(Vec::len).sum())
            .with("baseline.chains", baseline.map_or(0, |b| b.chains.len()))
            .with("baseline.sets", baseline.map_or(0, |b| b.sets.len()))
            .with(
                "baseline.handles",
                baseline.map_or(0, |b| b.chain_handles.len() + b.set_handles.len()),
            )
    }

    /// What the batches of the last sync carried.
    pub fn last_batches(&self) -> &[BatchCounts] {
        &self.last_batches
    }

    /// Why the last full sync was full (`None` when the last sync was partial).
    pub fn last_full_reason(&self) -> Option<FullSyncReason> {
        self.last_full_reason
    }

    /// Syncs the kernel with `request.state`; on error the next sync is full. Then the
    /// localhost NodePort listeners, whatever the rules' fate (they do not depend on each
    /// other): the changed Services' NodePorts, or every one after a full sync or a failed
    /// one.
    pub fn sync_rules(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let result = self.try_sync(request);
        if result.is_err() {
            self.applied = None;
            if let Some(metrics) = &self.metrics {
                metrics.record_failure(self.opts.family);
            }
        }
        self.synced_once = true;
        if let Some(proxy) = &mut self.localhost {
            let all =
                request.force_full || result.as_ref().is_ok_and(|report| report.full) || result.is_err();
            proxy.sync(request, all);
        }
        result
    }

    fn try_sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let reason = self.full_sync_reason(request)?;
        self.last_full_reason = reason;
        let local_addresses = self.read_local_addresses(reason.is_some())?;
        match reason {
            Some(reason) => {
                if reason != FullSyncReason::FirstSync {
                    tracing::info!(?reason, family = ?self.opts.family, "full nftables sync");
                }
                self.full_sync(request, &local_addresses)
            }
            None => self.partial_sync(request, &local_addresses),
        }
    }

    fn read_local_addresses(&self, full: bool) -> Result<Vec<IpAddr>, SyncError> {
        if !needs_local_addresses(&self.opts) {
            return Ok(Vec::new());
        }
        self.local_addresses
            .addresses(self.opts.family)
            .map_err(|source| SyncError::NodeAddresses { full, source })
    }

    fn full_sync_reason(&mut self, request: &SyncRequest<'_>) -> Result<Option<FullSyncReason>, SyncError> {
        // Taken first: any full sync repairs what the notification was about.
        let repair = self.repair.as_ref().is_some_and(RepairWatch::take_pending);
        let Some(applied) = &self.applied else {
            return Ok(Some(if self.synced_once {
                FullSyncReason::PreviousSyncFailed
            } else {
                FullSyncReason::FirstSync
            }));
        };
        if request.force_full {
            return Ok(Some(FullSyncReason::Forced));
        }
        if repair {
            return Ok(Some(FullSyncReason::Repair));
        }
        if applied.needs_full {
            return Ok(Some(FullSyncReason::ConflictReleased));
        }
        if applied.full_at.elapsed() >= self.full_sync_period {
            return Ok(Some(FullSyncReason::Periodic));
        }
        // A transport that can tell whether anyone else committed (netlink: the ruleset
        // generation) decides; else a sync with nothing changed is the sync period's tick,
        // and under steady churn the check still runs once per reconcile period.
        let period_due = request.changed.is_empty() || applied.checked_at.elapsed() >= self.reconcile_period;
        let due = match self.transport.foreign_changes().map_err(SyncError::ReadBack)? {
            Some(foreign) => foreign,
            None => period_due,
        };
        if due && !self.table_matches()? {
            return Ok(Some(FullSyncReason::TableChanged));
        }
        Ok(None)
    }

    /// Reads our table back and compares it with what we wrote (see the module docs).
    fn table_matches(&mut self) -> Result<bool, SyncError> {
        let listing = self
            .transport
            .read_back(self.opts.family)
            .map_err(SyncError::ReadBack)?;
        let Some(applied) = &mut self.applied else {
            return Ok(false);
        };
        let Some(listing) = listing else {
            tracing::warn!(family = ?self.opts.family, "table kube-proxy is gone; rebuilding it");
            return Ok(false);
        };
        let expected = expected_shape(&self.opts, &applied.ledger);
        let shape: HashMap<String, usize> = listing
            .chains
            .iter()
            .map(|(name, rules)| (name.clone(), rules.len()))
            .collect();
        let sets_ok = listing.sets
            == crate::build::declared_sets(&self.opts)
                .into_iter()
                .chain(applied.ledger.entry_sets())
                .chain(applied.ledger.endpoint_maps())
                .map(|s| s.to_string())
                .collect();
        let rules_ok = applied.baseline.as_ref().is_none_or(|baseline| {
            baseline
                .chains
                .iter()
                .all(|(name, rules)| listing.chains.get(name).is_none_or(|now| now == rules))
        });
        let objects_ok = listing.objects.keys().eq(crate::batch::counters(&self.opts)
            .map(|c| (kpr_nfnetlink::ObjectType::COUNTER, c.to_string()))
            .collect::<std::collections::BTreeSet<_>>()
            .iter());
        if shape != expected || !sets_ok || !rules_ok || !objects_ok {
            tracing::warn!(family = ?self.opts.family, "table kube-proxy differs from what was written; rebuilding it");
            return Ok(false);
        }
        applied.baseline = Some(listing);
        applied.checked_at = Instant::now();
        Ok(true)
    }

    fn apply_partial(&mut self, batch: &Batch) -> Result<(), SyncError> {
        self.last_batches = vec![batch.counts()];
        if batch.is_empty() {
            return Ok(());
        }
        self.transport.apply(batch).map_err(|source| SyncError::Apply {
            full: false,
            index: 1,
            source,
        })?;
        self.rebaseline_rewritten(batch)
    }

    /// A partial sync that rewrote a dispatch chain changed rules the baseline holds: the
    /// baseline takes their new text (read back at once where listing is cheap), or forgets
    /// them until the next reconcile's listing, which compares their count meanwhile.
    fn rebaseline_rewritten(&mut self, batch: &Batch) -> Result<(), SyncError> {
        let rewritten: Vec<String> = batch
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::FlushChain(chain) => Some(chain.to_string()),
                _ => None,
            })
            .collect();
        if rewritten.is_empty() {
            return Ok(());
        }
        let listing = if self.transport.cheap_read_back() {
            self.transport
                .read_back(self.opts.family)
                .map_err(SyncError::ReadBack)?
        } else {
            None
        };
        let Some(baseline) = self.applied.as_mut().and_then(|a| a.baseline.as_mut()) else {
            return Ok(());
        };
        for name in rewritten {
            match listing.as_ref().and_then(|l| l.chains.get(&name)) {
                Some(rules) => baseline.chains.insert(name, rules.clone()),
                None => baseline.chains.remove(&name),
            };
        }
        Ok(())
    }

    fn full_sync(
        &mut self,
        request: &SyncRequest<'_>,
        local_addresses: &[IpAddr],
    ) -> Result<SyncReport, SyncError> {
        let state = request.state;
        // After a successful sync the table is kept and rebuilt in place, with endpoints in
        // their slots, so ClientIP affinity survives; else (first sync, after a failure) it
        // is recreated, which also clears whatever another proxy left in it.
        let history = self.applied.take().map(|applied| applied.bundles);
        let listing = match history {
            Some(_) => self
                .transport
                .read_back(self.opts.family)
                .map_err(SyncError::ReadBack)?,
            None => None,
        };
        let ruleset = build_from(state, &self.opts, local_addresses, history.as_ref());
        drop(history);
        let start = match &listing {
            Some(listing) => FullStart::InPlace(listing),
            None => FullStart::Recreate,
        };
        // Batches are built and sent one at a time: a cold load never holds them all.
        self.last_batches.clear();
        let transport = &mut self.transport;
        let counts = &mut self.last_batches;
        stream_full(
            &ruleset,
            &self.opts,
            start,
            self.opts.max_batch_elements,
            &mut |batch| {
                counts.push(batch.counts());
                transport.apply(&batch).map_err(|source| SyncError::Apply {
                    full: true,
                    index: counts.len(),
                    source,
                })
            },
        )?;
        let ledger = Ledger::of(&ruleset);
        let mut ports: HashMap<NamespacedName, Vec<ServicePortName>> = HashMap::new();
        for owner in ruleset.bundles.keys() {
            if let Owner::Port(name) = owner {
                ports.entry(name.service.clone()).or_default().push(name.clone());
            }
        }
        // Kept until the Service changes: a Vec's first push makes room for four names.
        ports.values_mut().for_each(Vec::shrink_to_fit);
        // Sized at once: growing by doubling would hold both tables at the last rehash.
        let mut bundles: HashMap<Owner, Bundle> = HashMap::with_capacity(ruleset.bundles.len());
        bundles.extend(ruleset.bundles);
        // The baseline is what we just wrote, when listing is cheap (netlink: rules and set
        // names, no elements); else it comes from the next reconcile's listing, as an nft
        // listing here would cost every full sync a process and a parse.
        let baseline = if self.transport.cheap_read_back() {
            self.transport
                .read_back(self.opts.family)
                .map_err(SyncError::ReadBack)?
        } else {
            None
        };
        self.applied = Some(Applied {
            ledger,
            bundles,
            ports,
            full_at: Instant::now(),
            checked_at: Instant::now(),
            needs_full: false,
            baseline,
        });
        Ok(self.report(true))
    }

    fn partial_sync(
        &mut self,
        request: &SyncRequest<'_>,
        local_addresses: &[IpAddr],
    ) -> Result<SyncReport, SyncError> {
        let state = request.state;
        let ctx = Context::new(&self.opts, state, local_addresses);
        let Some(applied) = &mut self.applied else {
            return self.full_sync(request, local_addresses);
        };
        let mut new_bundles: Vec<(Owner, Option<Bundle>)> = vec![(Owner::Node, Some(node_bundle(&ctx)))];
        let mut new_ports: HashMap<NamespacedName, Vec<ServicePortName>> = HashMap::new();
        // Destinations claimed earlier in this sync (e.g. two new Services, one external IP).
        let mut fresh: HashMap<Dest, Owner> = HashMap::new();
        for service in request.changed {
            let mut names: BTreeSet<ServicePortName> = applied
                .ports
                .get(service)
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            let current = state.services.get(service).map(|ports| &ports[..]).unwrap_or(&[]);
            for port in current {
                names.insert(port.name.clone());
                let owner = Owner::Port(port.name.clone());
                let taken = |dest: &Dest| {
                    applied.ledger.taken_by_other(dest, &owner)
                        || fresh.get(dest).is_some_and(|o| *o != owner)
                };
                let bundle = port_bundle(&state.plan(port), &ctx, applied.bundles.get(&owner), &taken);
                for dest in &bundle.dests {
                    fresh.insert(*dest, owner.clone());
                }
                new_bundles.push((owner, Some(bundle)));
                new_ports
                    .entry(service.clone())
                    .or_default()
                    .push(port.name.clone());
            }
            for name in names {
                if !current.iter().any(|p| p.name == name) {
                    new_bundles.push((Owner::Port(name), None));
                }
            }
        }
        let replaced: Vec<(Owner, Option<&Bundle>, Option<&Bundle>)> = new_bundles
            .iter()
            .map(|(owner, new)| (owner.clone(), applied.bundles.get(owner), new.as_ref()))
            .collect();
        let (batch, conflict) = applied.ledger.update(self.opts.family, &replaced, &self.opts);
        applied.needs_full |= conflict;
        for (owner, new) in new_bundles {
            match new {
                Some(bundle) => {
                    applied.bundles.insert(owner, bundle);
                }
                None => {
                    applied.bundles.remove(&owner);
                }
            }
        }
        for service in request.changed {
            match new_ports.remove(service) {
                Some(mut names) => {
                    names.shrink_to_fit();
                    applied.ports.insert(service.clone(), names)
                }
                None => applied.ports.remove(service),
            };
        }
        self.apply_partial(&batch)?;
        Ok(self.report(false))
    }

    fn report(&self, full: bool) -> SyncReport {
        let (mut no_local_internal, mut no_local_external, mut total) = (0, 0, 0);
        if let Some(applied) = &self.applied {
            no_local_internal = applied.ledger.no_local_internal;
            no_local_external = applied.ledger.no_local_external;
            total = applied.ledger.element_count()
                + expected_shape(&self.opts, &applied.ledger)
                    .values()
                    .sum::<usize>();
        }
        let written = self
            .last_batches
            .iter()
            .map(|c| c.elements_added + c.elements_deleted + c.rules_written)
            .sum();
        SyncReport {
            full,
            objects: ObjectCount { total, written },
            no_local_internal,
            no_local_external,
            conntrack_reconcile: None,
            newly_unsafe: Vec::new(),
        }
    }
}

/// Chain name -> rule count, as the table should hold it.
fn expected_shape(opts: &NftablesOptions, ledger: &Ledger) -> HashMap<String, usize> {
    let mut shape: HashMap<String, usize> = fixed_chains(opts)
        .into_iter()
        .map(|(chain, rules)| (ChainId::Fixed(chain).to_string(), rules.len()))
        .collect();
    let entry_sets = ledger.entry_sets();
    for kind in EntryKind::ALL {
        shape.insert(
            ChainId::Fixed(kind.dispatch_chain()).to_string(),
            dispatch_rules(kind, &entry_sets, opts).len(),
        );
    }
    for chain in ledger.chains() {
        shape.insert(
            ChainId::Shared(chain).to_string(),
            shared_rules(chain, opts).len(),
        );
    }
    shape
}

impl Backend for NftablesBackend {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let result = self
            .sync_rules(request)
            .map_err(|e| BackendError::new(e.attempted(), e.step(), e));
        kpr_conntrack::clean_up_after(self.conntrack.as_deref_mut(), request, result)
    }

    /// Starts watching our table's notifications (in the calling thread's network
    /// namespace, the process's) when the transport has a socket of its own; else the
    /// periodic sync repairs.
    fn repair_with(&mut self, repair: RepairRequest) {
        let Some(own_port) = self.transport.own_port_id() else {
            return;
        };
        match RepairWatch::start(self.opts.family, own_port, repair) {
            Ok(watch) => self.repair = Some(watch),
            Err(error) => tracing::warn!(
                family = ?self.opts.family,
                "cannot watch nf_tables notifications ({error}); the periodic sync repairs foreign changes"
            ),
        }
    }
}

/// Deletes our table of `family` (`--cleanup`, or a switch to another mode). A missing
/// table is fine.
pub fn cleanup(transport: &mut dyn Transport, family: IpFamily) -> Result<bool, TransportError> {
    if transport.read_back(family)?.is_none() {
        return Ok(false);
    }
    let mut batch = Batch::new(family);
    batch.ops.push(crate::batch::Op::AddTable);
    batch.ops.push(crate::batch::Op::DeleteTable);
    transport.apply(&batch)?;
    Ok(true)
}
