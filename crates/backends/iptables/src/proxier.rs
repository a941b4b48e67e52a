//! The iptables [`Backend`]: decides full or partial sync, picks the chains to write, and
//! applies them with one `iptables-restore --noflush`.
//!
//! A partial sync rewrites the fixed chains (they reference every service) plus those
//! chains of changed services whose content differs from the last successful sync,
//! tracked by a hash per chain, and deletes chains that disappeared. Anything that could
//! make that bookkeeping wrong (first sync, a failed sync, a forced sync, an hour since the
//! last full one, or a missing canary chain, meaning someone flushed the tables) makes the
//! sync full: every chain rewritten, stale chains found with `iptables-save` and removed,
//! and the jump rules from the built-in chains ensured.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use kpr_conntrack::Conntrack;
use kpr_model::NamespacedName;
use kpr_naming::{chain, is_service_chain};
use kpr_state::{Backend, BackendError, SyncReport, SyncRequest, TableCount};

use crate::exec::{ExecError, Iptables};
use crate::host::{HostError, Sysctl, prepare_host};
use crate::jumps::jump_rules;
use crate::names::NameCache;
use crate::options::{IptablesOptions, OptionsError};
use crate::rules::build_with_cache;
use crate::ruleset::{Chain, ChainKind, Payload, PayloadBuilder, Ruleset, Table};
use crate::saved::SavedTable;

/// Upstream's FullSyncPeriod: a full sync at least this often repairs any drift.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

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
    #[error("applying the {} ruleset: {source}", if *.full { "full" } else { "partial" })]
    Restore {
        full: bool,
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
    chains: HashMap<String, AppliedChain>,
    large_cluster: bool,
    full_sync_at: Instant,
}

/// Which chains one sync writes and deletes (nat per-service chains; everything else is
/// decided by kind).
#[derive(Debug, Default, PartialEq, Eq)]
struct ChainPlan {
    full: bool,
    /// Per-service chains to write, with their new content hash.
    write: HashMap<String, u64>,
    /// Chains to delete, sorted.
    delete: Vec<String>,
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
    pub fn new(opts: IptablesOptions, exec: Box<dyn Iptables>) -> Result<Self, OptionsError> {
        opts.validate()?;
        Ok(Self {
            opts,
            exec,
            names: NameCache::default(),
            applied: None,
            synced_once: false,
            full_sync_period: FULL_SYNC_PERIOD,
            conntrack: None,
        })
    }

    /// Overrides how often a full sync happens regardless of changes.
    pub fn with_full_sync_period(mut self, period: Duration) -> Self {
        self.full_sync_period = period;
        self
    }

    /// Deletes stale UDP conntrack entries after each successful sync, as upstream does.
    /// A failed sync is reported to it too (its changes got no cleanup).
    pub fn with_conntrack(mut self, conntrack: Box<dyn Conntrack>) -> Self {
        self.conntrack = Some(conntrack);
        self
    }

    pub fn options(&self) -> &IptablesOptions {
        &self.opts
    }

    /// The start-up step: host settings the rules depend on (route_localnet).
    pub fn init(&self, sysctl: &dyn Sysctl) -> Result<(), HostError> {
        prepare_host(&self.opts, sysctl)
    }

    /// Syncs the kernel with `request.state`; on error the next sync is full.
    pub fn sync_rules(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let result = self.try_sync(request);
        if result.is_err() {
            self.applied = None;
        }
        self.synced_once = true;
        result
    }

    fn try_sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, SyncError> {
        let mut reason = self.full_sync_reason(request)?;
        let ruleset = build_with_cache(request.state, &self.opts, &mut self.names);
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
        let payload = render(&ruleset, &plan);
        self.exec
            .restore(payload.text.as_bytes())
            .map_err(|source| SyncError::Restore {
                full: plan.full,
                source,
            })?;
        if plan.full {
            self.ensure_jumps()?;
        }
        let full = plan.full;
        self.record(&ruleset, plan);
        Ok(report(&ruleset, &payload, full))
    }

    fn full_sync_reason(&self, request: &SyncRequest<'_>) -> Result<Option<FullSyncReason>, SyncError> {
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
        let mut delete: Vec<String> = saved
            .chains
            .into_iter()
            .map(|c| c.name)
            .filter(|name| is_service_chain(name) && !ruleset.nat.contains(name))
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

    fn ensure_jumps(&self) -> Result<(), SyncError> {
        for jump in jump_rules(&self.opts) {
            self.exec
                .ensure_rule(jump.table, jump.chain, &jump.args)
                .map_err(|source| SyncError::Jump {
                    table: jump.table,
                    chain: jump.chain,
                    target: jump.target,
                    source,
                })?;
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
            if let Some(owner) = owner_of(&name) {
                applied.chains.insert(name, AppliedChain { hash, owner });
            }
        }
        self.applied = Some(applied);
    }
}

impl Backend for IptablesBackend {
    fn mode(&self) -> &'static str {
        "iptables"
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let result = self.sync_rules(request);
        match (result, &mut self.conntrack) {
            // Only once the new rules are in, or the deleted flows would be re-created by
            // the old ones.
            (Ok(mut report), Some(conntrack)) => {
                report.conntrack_reconcile = conntrack.after_sync(request);
                Ok(report)
            }
            (Err(error), Some(conntrack)) => {
                conntrack.sync_failed();
                Err(Box::new(error))
            }
            (result, None) => result.map_err(|e| Box::new(e) as BackendError),
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
    let mut delete: Vec<String> = applied
        .chains
        .keys()
        .filter(|name| !ruleset.nat.contains(name))
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

fn render(ruleset: &Ruleset, plan: &ChainPlan) -> Payload {
    let mut payload = PayloadBuilder::default();
    let chosen = |chain: &Chain| match &chain.kind {
        ChainKind::Fixed => true,
        ChainKind::Canary => plan.full,
        ChainKind::Service(_) => plan.write.contains_key(&chain.name),
    };
    payload.table(&ruleset.filter, chosen, &[]);
    payload.table(&ruleset.nat, chosen, &plan.delete);
    payload.finish()
}

fn report(ruleset: &Ruleset, payload: &Payload, full: bool) -> SyncReport {
    let count = |table: Table| TableCount {
        table: table.as_str(),
        total: ruleset.table(table).map_or(0, |t| t.rule_count()),
        written: payload.written_rules(table),
    };
    SyncReport {
        full,
        tables: vec![count(Table::Filter), count(Table::Nat)],
        no_local_internal: ruleset.no_local_internal,
        no_local_external: ruleset.no_local_external,
        conntrack_reconcile: None,
    }
}
