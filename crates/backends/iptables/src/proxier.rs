//! The iptables [`Backend`]: decides full or partial sync, picks the chains to write, and
//! applies them with one `iptables-restore --noflush` (several, Services first, for a full
//! sync on nf_tables above [`RESTORE_CHUNK_CHAINS`]).
//!
//! A partial sync rewrites the fixed chains (they reference every service) plus those
//! chains of changed services whose content differs from the last successful sync,
//! tracked by a hash per chain, and deletes chains that disappeared. Anything that could
//! make that bookkeeping wrong (first sync, a failed sync, a forced sync, an hour since the
//! last full one, or a missing canary chain, meaning someone flushed the tables) makes the
//! sync full: every chain rewritten, stale chains found with `iptables-save` and removed,
//! and the jump rules from the built-in chains ensured.
//!
//! Given a [`RepairRequest`] ([`Backend::repair_with`]), a thread checks the canary, the
//! jumps and KUBE-SERVICES between syncs ([`crate::repair`]); damage makes the next sync
//! full and asks for it at once.
//!
//! Before each sync the host's addresses are read again when `--nodeport-addresses`
//! needs them (an address added later is served). A service port the renderer refused
//! (unsafe text) is logged once and reported in the [`SyncReport`] for counting; the other
//! services sync as usual. A failure says what was attempted (full or partial) and whether
//! the restore itself failed, for upstream's failure metrics.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use kpr_conntrack::Conntrack;
use kpr_model::{NamespacedName, Sizes};
use kpr_naming::{ChainName, chain, is_service_chain};
use kpr_state::{
    Backend, BackendError, FailedStep, ObjectCount, RepairRequest, SyncKind, SyncReport, SyncRequest,
    UnsafeObject,
};

use crate::exec::{ExecError, Iptables};
use crate::host::{HostError, prepare_host};
use crate::jumps::jump_rules;
use crate::metrics::IptablesMetrics;
use crate::names::NameCache;
use crate::options::{IptablesOptions, OptionsError};
use crate::repair::{CHECK_INTERVAL, RepairCheck};
use crate::rules::build_with_cache;
use crate::ruleset::{Chain, ChainKind, Payload, RefusedPort, Ruleset, Table, TableCount};
use crate::saved::SavedTable;
use kpr_host::{AddressError, InterfaceAddresses, LocalAddresses, Sysctl};

/// Upstream's FullSyncPeriod: a full sync at least this often repairs any drift.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// At most this many chains per `iptables-restore` when a large write on nf_tables is
/// split ([`Ruleset::render_split`]).
///
/// `iptables-nft-restore --noflush` costs more than linearly in the size of one input
/// (measured with iptables 1.8.9 on the 10,000 Services x 10 endpoints full sync, 110,012
/// chains: 20,000 chain declarations in one input 2.8 s, 55,000 in one 112 s; all 110,012
/// split into 11 inputs 4.8 s in all; the whole ruleset as 11 inputs of whole Services
/// 74 s, as 44 inputs, about 2,500 chains each, 20.9 s, as 200 inputs 18.5 s, each input's
/// cost flat however full the table already was). Through this backend, 10,000 x 10 with
/// 2,500: first sync's restores 23.7 s, a full resync's over them 42 s; with 800 chains
/// 18.7 s and 75 s (each restore reads the whole table first, so many small ones cost on
/// a full table); with 5,000 36 s and 44 s. 2,500 chains (about 230 Services of 10
/// endpoints) is the best of both. iptables-legacy replaces a whole table at once, at a
/// linear cost, so it keeps one transaction.
pub const RESTORE_CHUNK_CHAINS: usize = 2_500;

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("checking for the canary chain {} in table {table}: {source}", chain::CANARY)]
    Canary {
        table: Table,
        #[source]
        source: ExecError,
    },
    #[error("listing the existing chains of table {table}: {source}")]
    ListChains {
        table: Table,
        #[source]
        source: ExecError,
    },
    #[error("applying the {} ruleset{}: {source}", if *.full { "full" } else { "partial" }, describe_part(*.part, *.parts))]
    Restore {
        full: bool,
        /// Which restore of the sync failed (1-based), when the write was split.
        part: usize,
        /// How many restores the sync's write was split into (1: not split).
        parts: usize,
        #[source]
        source: ExecError,
    },
    #[error("ensuring the jump from {table} {chain} to {target}: {source}")]
    Jump {
        table: Table,
        chain: &'static str,
        target: &'static str,
        #[source]
        source: ExecError,
    },
    #[error("{source}")]
    NodeAddresses {
        full: bool,
        #[source]
        source: AddressError,
    },
}

fn describe_part(part: usize, parts: usize) -> String {
    if parts > 1 {
        format!(" (restore {part} of {parts}; the earlier ones were applied)")
    } else {
        String::new()
    }
}

impl SyncError {
    /// What the failed sync attempted. The canary is only checked before a partial sync;
    /// listing chains and ensuring jumps are parts of full syncs.
    pub fn attempted(&self) -> SyncKind {
        let full = match self {
            Self::Canary { .. } => false,
            Self::ListChains { .. } | Self::Jump { .. } => true,
            Self::Restore { full, .. } | Self::NodeAddresses { full, .. } => *full,
        };
        if full { SyncKind::Full } else { SyncKind::Partial }
    }

    /// Whether the restore itself failed (upstream's `restore_failures_total`).
    pub fn step(&self) -> FailedStep {
        match self {
            Self::Restore { .. } => FailedStep::Restore,
            _ => FailedStep::Other,
        }
    }
}

/// Why a sync must be full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FullSyncReason {
    FirstSync,
    PreviousSyncFailed,
    Forced,
    Periodic,
    CanaryMissing,
    LargeClusterModeChanged,
    /// The check between syncs found our rules damaged ([`crate::repair`]).
    Repair,
}

/// A per-service chain as the last successful sync left it.
#[derive(Clone, Debug)]
struct AppliedChain {
    hash: u64,
    owner: NamespacedName,
}

/// What the kernel holds after the last successful sync.
#[derive(Debug)]
struct Applied {
    chains: HashMap<ChainName, AppliedChain>,
    large_cluster: bool,
    full_sync_at: Instant,
}

/// Which chains one sync writes and deletes (nat per-service chains; everything else is
/// decided by kind).
#[derive(Debug, Default, PartialEq, Eq)]
struct ChainPlan {
    full: bool,
    /// Per-service chains to write, with their new content hash.
    write: HashMap<ChainName, u64>,
    /// Chains to delete, sorted.
    delete: Vec<ChainName>,
}

pub struct IptablesBackend {
    opts: IptablesOptions,
    exec: Box<dyn Iptables>,
    names: NameCache,
    applied: Option<Applied>,
    synced_once: bool,
    full_sync_period: Duration,
    /// Reconciles UDP conntrack entries around syncs; `None` leaves conntrack alone.
    conntrack: Option<Box<dyn Conntrack>>,
    /// This host's addresses, read before each sync that needs them.
    local_addresses: Box<dyn LocalAddresses>,
    /// The mode's own metrics; `None` records nothing (tests, benchmarks).
    metrics: Option<IptablesMetrics>,
    /// Refused service ports already logged and reported, so each is reported once.
    reported_refusals: HashSet<RefusedPort>,
    /// The check between syncs, once a repair request was given.
    repair: Option<RepairCheck>,
    /// How often it checks.
    repair_interval: std::time::Duration,
    /// Whether the last successful sync wrote rules into KUBE-SERVICES.
    services_has_rules: bool,
    /// Split writes declaring more chains than this into several restores (nf_tables);
    /// `None`: one restore per sync.
    chunk_chains: Option<usize>,
}

impl std::fmt::Debug for IptablesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IptablesBackend")
            .field("opts", &self.opts)
            .field("applied_chains", &self.applied.as_ref().map(|a| a.chains.len()))
            .finish_non_exhaustive()
    }
}

impl IptablesBackend {
    /// A backend writing through `exec`. Asks the binary for its version once, as upstream
    /// does: `--random-fully` is only written where iptables supports it (>= 1.6.2); when
    /// the version cannot be read, upstream assumes an old one, and so do we.
    pub fn new(mut opts: IptablesOptions, exec: Box<dyn Iptables>) -> Result<Self, OptionsError> {
        opts.validate()?;
        let chunk_chains = exec.is_nf_tables().then_some(RESTORE_CHUNK_CHAINS);
        if opts.masquerade_random_fully {
            opts.masquerade_random_fully = match exec.version() {
                Ok(version) if version.supports_random_fully() => true,
                Ok(version) => {
                    tracing::info!(%version, "iptables does not support --random-fully");
                    false
                }
                Err(error) => {
                    tracing::warn!("cannot read the iptables version, not using --random-fully: {error}");
                    false
                }
            };
        }
        Ok(Self {
            opts,
            exec,
            names: NameCache::default(),
            applied: None,
            synced_once: false,
            full_sync_period: FULL_SYNC_PERIOD,
            conntrack: None,
            local_addresses: Box::new(InterfaceAddresses),
            metrics: None,
            reported_refusals: HashSet::new(),
            repair: None,
            repair_interval: CHECK_INTERVAL,
            services_has_rules: false,
            chunk_chains,
        })
    }

    /// Reads this host's addresses from `source` instead of the interfaces of the calling
    /// thread's network namespace.
    pub fn with_local_addresses(mut self, source: Box<dyn LocalAddresses>) -> Self {
        self.local_addresses = source;
        self
    }

    /// Records the mode's metrics after each sync.
    pub fn with_metrics(mut self, metrics: IptablesMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Overrides the split of large writes ([`RESTORE_CHUNK_CHAINS`] on nf_tables, else
    /// none): `Some(n)` writes a sync declaring more than `n` chains as several restores of
    /// whole Services, at most `n` chains each, then one with the rest; `None` writes every
    /// sync as one restore. Tests use a small `n` to split small rulesets.
    pub fn with_restore_chunk_chains(mut self, max_chains: Option<usize>) -> Self {
        self.chunk_chains = max_chains;
        self
    }

    /// Overrides how often a full sync happens regardless of changes.
    pub fn with_full_sync_period(mut self, period: Duration) -> Self {
        self.full_sync_period = period;
        self
    }

    /// Overrides how often the rules are checked between syncs once a repair request is
    /// given ([`crate::repair::CHECK_INTERVAL`]).
    pub fn with_repair_interval(mut self, interval: Duration) -> Self {
        self.repair_interval = interval;
        self
    }

    /// Deletes stale UDP conntrack entries after each successful sync, as upstream does.
    /// A failed sync is reported to it too (its changes got no cleanup).
    pub fn with_conntrack(mut self, conntrack: Box<dyn Conntrack>) -> Self {
        self.conntrack = Some(conntrack);
        self
    }

    /// The options in use (after the start-up checks, e.g. `--random-fully`).
    pub fn options(&self) -> &IptablesOptions {
        &self.opts
    }

    /// The start-up step: host settings the rules depend on (route_localnet).
    pub fn init(&self, sysctl: &dyn Sysctl) -> Result<(), HostError> {
        prepare_host(&self.opts, sysctl)
    }

    /// What the backend keeps between syncs (kpr_model::Sizes): the per-service chains last
    /// written, the chain name cache, the refusals already reported.
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with(
                "applied.chains",
                self.applied.as_ref().map_or(0, |a| a.chains.len()),
            )
            .nested("names", self.names.footprint())
            .with("reported_refusals", self.reported_refusals.len())
    }

    /// Syncs the kernel with `request.state`; on error the next sync is full.
    pub fn sync_rules(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        if let Some(check) = &self.repair {
            check.sync_started();
        }
        let result = self.try_sync(request);
        if let Some(check) = &self.repair {
            check.sync_ended(result.is_ok(), self.services_has_rules);
        }
        if let Err(error) = &result {
            self.applied = None;
            if let Some(metrics) = &self.metrics {
                metrics.record_failure(self.opts.family, error);
            }
        }
        self.synced_once = true;
        result
    }

    fn try_sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let mut reason = self.full_sync_reason(request)?;
        let local_addresses = self.read_local_addresses(reason.is_some() || self.applied.is_none())?;
        let ruleset = build_with_cache(request.state, &self.opts, &local_addresses, &mut self.names);
        if let Some(applied) = &self.applied
            && reason.is_none()
            && applied.large_cluster != ruleset.large_cluster
        {
            reason = Some(FullSyncReason::LargeClusterModeChanged);
        }
        let plan = match (&self.applied, reason) {
            (Some(applied), None) => plan_partial(applied, &ruleset, request.changed),
            (_, Some(reason)) => {
                tracing::info!(?reason, "full iptables sync");
                self.plan_full(&ruleset)?
            }
            (None, None) => self.plan_full(&ruleset)?,
        };
        let payloads = render(&ruleset, &plan, self.chunk_chains);
        if plan.full {
            // Before the restore, as upstream: the jumps then lead into empty chains until
            // the restore fills them all at once. Added after it, one by one, a connection
            // could be DNATed by PREROUTING's jump before POSTROUTING's existed, and keep
            // its un-masqueraded conntrack entry.
            self.ensure_jumps()?;
        }
        let parts = payloads.len();
        if parts > 1 {
            tracing::info!(parts, "writing the ruleset as several restores");
        }
        for (i, payload) in payloads.iter().enumerate() {
            self.exec
                .restore(payload.text.as_bytes())
                .map_err(|source| SyncError::Restore {
                    full: plan.full,
                    part: i + 1,
                    parts,
                    source,
                })?;
        }
        let full = plan.full;
        self.services_has_rules = ruleset
            .nat
            .chain(chain::SERVICES)
            .is_some_and(|c| !c.rules.is_empty());
        self.record(&ruleset, plan);
        let tables = ruleset.table_counts_of(&payloads);
        if let Some(metrics) = &self.metrics {
            metrics.record_tables(self.opts.family, &tables);
        }
        let mut report = report(&ruleset, &tables, full);
        report.newly_unsafe = self.report_refusals(&ruleset);
        Ok(report)
    }

    /// The host's addresses, when `--nodeport-addresses` selects among them (upstream's
    /// per-sync `GetNodeIPs`); otherwise rendering does not use them.
    fn read_local_addresses(&self, full: bool) -> Result<Vec<std::net::IpAddr>, SyncError> {
        self.opts
            .nodeport_addresses
            .local_addresses(self.opts.family, self.local_addresses.as_ref())
            .map_err(|source| SyncError::NodeAddresses { full, source })
    }

    /// Logs the service ports the renderer refused for the first time, and forgets those
    /// that are fine again (so a relapse is reported again).
    fn report_refusals(&mut self, ruleset: &Ruleset) -> Vec<UnsafeObject> {
        let current: HashSet<RefusedPort> = ruleset.refused.iter().cloned().collect();
        let mut new: Vec<&RefusedPort> = current.difference(&self.reported_refusals).collect();
        new.sort_by(|a, b| a.port.cmp(&b.port));
        let reported: Vec<UnsafeObject> = new.into_iter().map(RefusedPort::unsafe_object).collect();
        for object in &reported {
            tracing::warn!(
                "{object}; the service's other ports and every other service are still programmed"
            );
        }
        self.reported_refusals = current;
        reported
    }

    fn full_sync_reason(&self, request: &SyncRequest<'_>) -> Result<Option<FullSyncReason>, SyncError> {
        // Taken first: any full sync repairs what the check found.
        let repair = self.repair.as_ref().is_some_and(RepairCheck::take_pending);
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
        if applied.full_sync_at.elapsed() >= self.full_sync_period {
            return Ok(Some(FullSyncReason::Periodic));
        }
        for table in [Table::Filter, Table::Nat] {
            let exists = self
                .exec
                .chain_exists(table, chain::CANARY)
                .map_err(|source| SyncError::Canary { table, source })?;
            if !exists {
                return Ok(Some(FullSyncReason::CanaryMissing));
            }
        }
        Ok(None)
    }

    /// Writes everything and deletes every service chain in the kernel that is not wanted.
    fn plan_full(&self, ruleset: &Ruleset) -> Result<ChainPlan, SyncError> {
        let table = Table::Nat;
        let saved = self
            .exec
            .save(table)
            .map_err(|source| SyncError::ListChains { table, source })?;
        let saved = SavedTable::parse(&saved);
        let mut delete: Vec<ChainName> = saved
            .chains
            .into_iter()
            .map(|c| c.name)
            .filter(|name| is_service_chain(name) && !ruleset.nat.contains(name))
            .filter_map(|name| match ChainName::parse(&name) {
                Ok(chain) => Some(chain),
                Err(error) => {
                    tracing::warn!("not deleting the stale chain {name:?}: its name {error}");
                    None
                }
            })
            .collect();
        delete.sort();
        Ok(ChainPlan {
            full: true,
            write: service_chains(ruleset)
                .map(|(c, _)| (c.name.clone(), c.content_hash()))
                .collect(),
            delete,
        })
    }

    /// The jumps from built-in chains, each target chain created empty first if missing (as
    /// upstream's EnsureChain; the restore that follows fills the ones we write, and never
    /// touches kubelet's KUBE-FIREWALL when we do not write it).
    fn ensure_jumps(&self) -> Result<(), SyncError> {
        for jump in jump_rules() {
            let error = |source| SyncError::Jump {
                table: jump.table,
                chain: jump.chain,
                target: jump.target,
                source,
            };
            self.exec.ensure_chain(jump.table, jump.target).map_err(error)?;
            self.exec
                .ensure_rule(jump.table, jump.chain, &jump.args)
                .map_err(error)?;
        }
        Ok(())
    }

    /// Remembers what the kernel now holds.
    fn record(&mut self, ruleset: &Ruleset, plan: ChainPlan) {
        let owner_of = |name: &str| match ruleset.nat.chain(name).map(|c| &c.kind) {
            Some(ChainKind::Service(owner)) => Some(owner.clone()),
            _ => None,
        };
        let now = Instant::now();
        let applied = match self.applied.take() {
            Some(mut applied) if !plan.full => {
                for name in &plan.delete {
                    applied.chains.remove(name);
                }
                applied.large_cluster = ruleset.large_cluster;
                applied
            }
            _ => Applied {
                chains: HashMap::new(),
                large_cluster: ruleset.large_cluster,
                full_sync_at: now,
            },
        };
        let mut applied = applied;
        for (name, hash) in plan.write {
            if let Some(owner) = owner_of(name.as_str()) {
                applied.chains.insert(name, AppliedChain { hash, owner });
            }
        }
        self.applied = Some(applied);
    }
}

impl Backend for IptablesBackend {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let result = self
            .sync_rules(request)
            .map_err(|e| BackendError::new(e.attempted(), e.step(), e));
        kpr_conntrack::clean_up_after(self.conntrack.as_deref_mut(), request, result)
    }

    /// Starts the check between syncs when the iptables runner can be copied for it.
    fn repair_with(&mut self, repair: RepairRequest) {
        let Some(exec) = self.exec.for_checks() else {
            return;
        };
        match RepairCheck::start(exec, self.repair_interval, repair) {
            Ok(check) => self.repair = Some(check),
            Err(error) => tracing::warn!(
                "cannot start checking our iptables rules between syncs ({error}); the periodic sync repairs them"
            ),
        }
    }
}

fn service_chains(ruleset: &Ruleset) -> impl Iterator<Item = (&Chain, &NamespacedName)> {
    ruleset.nat.chains().iter().filter_map(|c| match &c.kind {
        ChainKind::Service(owner) => Some((c, owner)),
        _ => None,
    })
}

/// A partial sync: chains of changed services whose content changed, plus deletions. A
/// chain that disappeared marks its owner changed too, so the owner's other chains (which
/// may jump to it) are compared and rewritten in the same transaction.
fn plan_partial(applied: &Applied, ruleset: &Ruleset, changed: &BTreeSet<NamespacedName>) -> ChainPlan {
    let mut delete: Vec<ChainName> = applied
        .chains
        .keys()
        .filter(|name| !ruleset.nat.contains(name.as_str()))
        .cloned()
        .collect();
    delete.sort();
    let mut dirty: HashSet<&NamespacedName> = changed.iter().collect();
    dirty.extend(
        delete
            .iter()
            .filter_map(|name| applied.chains.get(name))
            .map(|c| &c.owner),
    );
    let write = service_chains(ruleset)
        .filter(|(_, owner)| dirty.contains(owner))
        .filter_map(|(chain, _)| {
            let hash = chain.content_hash();
            let known = applied.chains.get(&chain.name).map(|a| a.hash);
            (known != Some(hash)).then(|| (chain.name.clone(), hash))
        })
        .collect();
    ChainPlan {
        full: false,
        write,
        delete,
    }
}

/// The restores of one sync, in order: one, unless a full sync on nf_tables declares more
/// than `chunk_chains` chains ([`Ruleset::render_split`]). Partial syncs are always one
/// transaction: they write few chains, and a split would gain nothing.
fn render(ruleset: &Ruleset, plan: &ChainPlan, chunk_chains: Option<usize>) -> Vec<Payload> {
    let chosen = |chain: &Chain| match &chain.kind {
        ChainKind::Fixed => true,
        ChainKind::Canary => plan.full,
        ChainKind::Service(_) => plan.write.contains_key(&chain.name),
    };
    let split = if plan.full { chunk_chains } else { None };
    ruleset.render_split(chosen, &plan.delete, split)
}

fn report(ruleset: &Ruleset, tables: &[TableCount], full: bool) -> SyncReport {
    SyncReport {
        full,
        objects: ObjectCount {
            total: tables.iter().map(|t| t.total).sum(),
            written: tables.iter().map(|t| t.written).sum(),
        },
        no_local_internal: ruleset.no_local_internal,
        no_local_external: ruleset.no_local_external,
        conntrack_reconcile: None,
        newly_unsafe: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
