//! The sync loop: from source events to one backend per IP family, through the trackers.
//!
//! A proxy runs one proxier per IP family it serves, as upstream's dual-stack "meta
//! proxier" does: each family has its own trackers (every object is converted once per
//! family), its own runner and its own backend, and is synced, timed and reported on its
//! own (metrics labelled `ip_family`, health per family). A single-stack proxy is the same
//! with one family.
//!
//! Two kinds of tasks share the trackers behind mutexes held only for short, CPU-bound steps:
//! - intake (`intake`) applies every source event to every family's trackers, counts and
//!   logs rejected objects once, and asks the runner of each family whose state changed
//!   for a sync;
//! - one runner per family ([`kpr_runner::SyncRunner`]) calls `sync::sync_once` on a
//!   blocking thread: take that family's pending changes and snapshots, release the lock,
//!   let its backend program the kernel, then record metrics and health, and hand the
//!   programmed state to whoever asked for it ([`FamilyBackend::after_sync`]).
//!
//! Before its first sync each backend gets a [`RepairRequest`] that fires its family's
//! runner trigger ([`Backend::repair_with`]): a backend that notices someone else damaged
//! its rules gets a sync as soon as the min interval allows, not at the next period.
//!
//! No sync runs before every source has delivered its initial state. Health follows
//! upstream's start-up rule: each family counts as updated when its loop starts, and changes
//! are only queued (and can only become late) once every source is in, so a proxy still
//! waiting for its sources answers `/healthz` 200; why it waits is logged.

mod intake;
mod sync;
#[cfg(test)]
mod test_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::IpNet;
use kpr_metrics::{FamilyLabels, Metrics, ProxyHealth};
use kpr_model::{IpFamily, NodeView, Sizes};
use kpr_runner::{RunnerConfig, SyncRunner, Trigger};
use kpr_sources::EventReceiver;
use kpr_state::{Backend, DesiredState, RepairRequest, SyncObserver};
use kpr_tracking::{EndpointsTracker, ServiceTracker};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

pub use intake::Intake;

#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// This node's name (`--hostname-override` or the host name): decides which endpoints are local.
    pub node_name: String,
    pub runner: RunnerConfig,
    /// Sources that must report `Synced` before the first sync, e.g. `["manifests"]`.
    pub sources: Vec<&'static str>,
}

/// The proxier of one IP family: the backend that programs it, and who wants to know what
/// it programmed.
pub struct FamilyBackend {
    pub family: IpFamily,
    pub backend: Box<dyn Backend>,
    /// Told the desired state after every successful sync of this family (the state the
    /// kernel now holds), e.g. the Service health-check servers; `None` when nobody listens.
    pub after_sync: Option<Arc<dyn SyncObserver>>,
}

impl FamilyBackend {
    pub fn new(family: IpFamily, backend: Box<dyn Backend>) -> Self {
        Self {
            family,
            backend,
            after_sync: None,
        }
    }

    /// Tells `observer` each successfully synced state.
    pub fn observed_by(mut self, observer: Arc<dyn SyncObserver>) -> Self {
        self.after_sync = Some(observer);
        self
    }
}

/// Tracker state of one family, shared by intake and that family's sync.
#[derive(Debug)]
pub(crate) struct Trackers {
    pub services: ServiceTracker,
    pub endpoints: EndpointsTracker,
    pub node: Arc<NodeView>,
    /// This family's Service CIDRs, from every ServiceCIDR intake holds (sorted, no
    /// duplicates).
    pub service_cidrs: Arc<Vec<IpNet>>,
    /// Set when something every service depends on changed (node labels).
    pub force_full: bool,
}

impl Trackers {
    fn footprint(&self) -> Sizes {
        Sizes::new()
            .nested("services", self.services.footprint())
            .nested("endpoints", self.endpoints.footprint())
            .with("service_cidrs", self.service_cidrs.len())
    }
}

/// One family's trackers and metric labels.
pub(crate) struct Proxier {
    pub family: IpFamily,
    pub labels: FamilyLabels,
    trackers: Mutex<Trackers>,
}

impl Proxier {
    fn new(family: IpFamily, node_name: &str) -> Self {
        Self {
            family,
            labels: FamilyLabels {
                ip_family: family.label(),
            },
            trackers: Mutex::new(Trackers {
                services: ServiceTracker::new(family),
                endpoints: EndpointsTracker::new(family, node_name),
                node: Arc::new(NodeView {
                    name: node_name.to_string(),
                    ..NodeView::default()
                }),
                service_cidrs: Arc::default(),
                force_full: false,
            }),
        }
    }

    pub fn trackers(&self) -> MutexGuard<'_, Trackers> {
        // The trackers stay consistent across a panic in another thread (every update is
        // a single map operation), so keep serving rather than poisoning the whole proxy.
        self.trackers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) struct Shared {
    /// One per family, in the order the backends were given (the primary family first).
    pub proxiers: Vec<Proxier>,
    pub metrics: Metrics,
    pub health: Arc<ProxyHealth>,
}

impl Shared {
    pub fn new(
        settings: &ProxySettings,
        families: &[IpFamily],
        metrics: Metrics,
        health: Arc<ProxyHealth>,
    ) -> Self {
        Self {
            proxiers: families
                .iter()
                .map(|&family| Proxier::new(family, &settings.node_name))
                .collect(),
            metrics,
            health,
        }
    }

    /// The first family's trackers (the tests' proxies are single-stack).
    #[cfg(test)]
    pub fn trackers(&self) -> MutexGuard<'_, Trackers> {
        self.proxiers[0].trackers()
    }
}

/// Why [`run`] returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The event sources ended (or a sync loop stopped).
    SourcesEnded,
    /// A family's first sync failed in a way only the operator can fix
    /// ([`kpr_state::BackendError::needs_operator`]): the process should exit with this.
    Fatal(String),
}

/// Runs the proxy until the event channel closes: intake, then one sync loop per family
/// once all sources are in. A family whose first sync fails with a failure only the
/// operator can fix stops it ([`Stopped::Fatal`]); every other failure is retried.
pub async fn run(
    settings: ProxySettings,
    backends: Vec<FamilyBackend>,
    events: EventReceiver,
    metrics: Metrics,
    health: Arc<ProxyHealth>,
) -> Stopped {
    let families: Vec<IpFamily> = backends.iter().map(|b| b.family).collect();
    for &family in &families {
        // Upstream's SyncLoop marks each proxier updated as it starts, "in case Sync() never
        // succeeds": from here on a queued change that is not applied in time makes it
        // unhealthy.
        health.proxier_updated(family);
    }
    let shared = Arc::new(Shared::new(&settings, &families, metrics, health));
    for proxier in &shared.proxiers {
        // And, as upstream, it synthesizes a "last change queued" time while the sources list.
        shared
            .metrics
            .sync_proxy_rules_last_queued_timestamp_seconds
            .get_or_create(&proxier.labels)
            .set(intake::unix_now());
    }
    let (runners, triggers): (Vec<_>, Vec<_>) =
        families.iter().map(|_| SyncRunner::new(settings.runner)).unzip();
    let repairs: Vec<RepairRequest> = triggers.iter().map(repair_request).collect();
    let (ready_tx, mut ready_rx) = watch::channel(false);
    let intake = Intake::new(
        shared.clone(),
        settings.sources.iter().copied().collect(),
        triggers,
        ready_tx,
    );
    let intake_task = tokio::spawn(intake.run(events));
    if ready_rx.wait_for(|ready| *ready).await.is_err() {
        tracing::warn!("sources ended before delivering their initial state; no rules written");
        return Stopped::SourcesEnded;
    }
    tracing::info!(families = ?families, "all sources synced; starting to program rules");
    // Dropped (and so aborted) when this function returns.
    let mut sync_loops = JoinSet::new();
    for (index, ((backend, runner), repair)) in backends.into_iter().zip(runners).zip(repairs).enumerate() {
        let span = tracing::info_span!("proxier", ip_family = backend.family.label());
        sync_loops.spawn(sync_loop(shared.clone(), index, backend, runner, repair).instrument(span));
    }
    tokio::select! {
        stopped = sync_loops.join_next() => match stopped {
            Some(Ok(Some(fatal))) => Stopped::Fatal(fatal),
            _ => {
                tracing::error!("a sync loop stopped");
                Stopped::SourcesEnded
            }
        },
        _ = intake_task => {
            tracing::info!("event sources closed; stopping");
            Stopped::SourcesEnded
        }
    }
}

/// A repair request that fires `trigger`: the backend's ask runs a sync as soon as the
/// runner's min interval allows, as a change would.
fn repair_request(trigger: &Trigger) -> RepairRequest {
    let trigger = trigger.clone();
    RepairRequest::new(move || trigger.fire())
}

/// Syncs one family whenever its runner says so, each sync on a blocking thread. The
/// backend gets `repair` before its first sync. Returns (the message) only when the
/// family's first successful sync is out of reach until the operator changes something.
async fn sync_loop(
    shared: Arc<Shared>,
    index: usize,
    backend: FamilyBackend,
    runner: SyncRunner,
    repair: RepairRequest,
) -> Option<String> {
    let FamilyBackend {
        mut backend,
        after_sync,
        ..
    } = backend;
    backend.repair_with(repair);
    let backend = Arc::new(Mutex::new(backend));
    let synced_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Whether the observer missed changes (none told yet, or a sync failed since): then it
    // hears of everything, whatever the next sync's own changes.
    let observer_behind = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let runs = runner.run(move || {
        let shared = shared.clone();
        let backend = backend.clone();
        let after_sync = after_sync.clone();
        let synced_once = synced_once.clone();
        let observer_behind = observer_behind.clone();
        let fatal_tx = fatal_tx.clone();
        let span = tracing::Span::current();
        async move {
            tokio::task::spawn_blocking(move || {
                let _in_span = span.enter();
                let mut backend = backend.lock().unwrap_or_else(|e| e.into_inner());
                let proxier = &shared.proxiers[index];
                let programmed = match sync::sync_once(&shared, proxier, backend.as_mut()) {
                    Ok(programmed) => programmed,
                    Err(failed) => {
                        observer_behind.store(true, std::sync::atomic::Ordering::Relaxed);
                        if failed.needs_operator && !synced_once.load(std::sync::atomic::Ordering::Relaxed) {
                            let _ = fatal_tx.send(failed.message.clone());
                        }
                        return Err(failed.message);
                    }
                };
                synced_once.store(true, std::sync::atomic::Ordering::Relaxed);
                if let Some(observer) = &after_sync {
                    let behind = observer_behind.swap(false, std::sync::atomic::Ordering::Relaxed);
                    let changed = (!behind && !programmed.full).then_some(&programmed.changed);
                    observer.synced(&programmed.state, changed);
                }
                Ok::<(), String>(())
            })
            .await
            .map_err(|join| join.to_string())?
        }
    });
    tokio::select! {
        () = runs => None,
        fatal = fatal_rx.recv() => fatal,
    }
}

/// Collects events until every source has delivered its initial state, and returns the
/// state of each family in `families`' order; for `--dry-run`, which renders rules without
/// programming anything.
pub async fn initial_states(
    settings: &ProxySettings,
    families: &[IpFamily],
    mut events: EventReceiver,
    metrics: Metrics,
    health: Arc<ProxyHealth>,
) -> Vec<(IpFamily, DesiredState)> {
    let shared = Arc::new(Shared::new(settings, families, metrics, health));
    let triggers = families
        .iter()
        .map(|_| SyncRunner::new(settings.runner).1)
        .collect();
    let (ready_tx, ready_rx) = watch::channel(false);
    let mut intake = Intake::new(
        shared.clone(),
        settings.sources.iter().copied().collect(),
        triggers,
        ready_tx,
    );
    while !*ready_rx.borrow() {
        match events.recv().await {
            Some(event) => intake.apply(event),
            None => break,
        }
    }
    shared
        .proxiers
        .iter()
        .map(|proxier| {
            let mut trackers = proxier.trackers();
            let node = trackers.node.clone();
            let state = DesiredState {
                services: trackers.services.take().snapshot,
                endpoints: trackers.endpoints.take().snapshot,
                node,
                service_cidrs: trackers.service_cidrs.clone(),
            };
            (proxier.family, state)
        })
        .collect()
}

/// Source names still missing from `synced`.
pub(crate) fn missing_sources<'a>(
    expected: &'a BTreeSet<&'static str>,
    synced: &'a BTreeSet<&'static str>,
) -> impl Iterator<Item = &'a &'static str> {
    expected.difference(synced)
}
