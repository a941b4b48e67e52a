//! The sync loop: from source events to one backend, through the trackers.
//!
//! Two tasks share the trackers behind a mutex held only for short, CPU-bound steps:
//! - intake ([`intake`]) applies every source event to the trackers, counts and logs
//!   rejected objects, and asks the runner for a sync;
//! - the runner ([`kpr_runner::SyncRunner`]) calls [`sync::sync_once`] on a blocking thread:
//!   take the pending changes and snapshots, release the lock, let the backend program the
//!   kernel, then record metrics and health.
//!
//! No sync runs before every source has delivered its initial state. Health follows
//! upstream's start-up rule: the loop counts as updated when it starts, and changes are only
//! queued (and can only become late) once every source is in, so a proxy still waiting for
//! its sources answers `/healthz` 200; why it waits is logged.

mod intake;
mod sync;
#[cfg(test)]
mod test_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use kpr_metrics::{FamilyLabels, Metrics, ProxyHealth};
use kpr_model::{IpFamily, NodeView};
use kpr_runner::{RunnerConfig, SyncRunner};
use kpr_sources::EventReceiver;
use kpr_state::{Backend, DesiredState, SyncObserver};
use kpr_tracking::{EndpointsTracker, ServiceTracker};
use tokio::sync::watch;

pub use intake::Intake;

#[derive(Clone, Debug)]
pub struct ProxySettings {
    pub family: IpFamily,
    /// This node's name (`--hostname-override` or the host name): decides which endpoints are local.
    pub node_name: String,
    pub runner: RunnerConfig,
    /// Sources that must report `Synced` before the first sync, e.g. `["manifests"]`.
    pub sources: Vec<&'static str>,
}

/// Tracker state shared by intake and sync.
#[derive(Debug)]
pub(crate) struct Trackers {
    pub services: ServiceTracker,
    pub endpoints: EndpointsTracker,
    pub node: Arc<NodeView>,
    /// Set when something every service depends on changed (node labels).
    pub force_full: bool,
}

pub(crate) struct Shared {
    pub trackers: Mutex<Trackers>,
    pub metrics: Metrics,
    pub health: Arc<ProxyHealth>,
    pub labels: FamilyLabels,
    /// Told the desired state after each successful sync (the Service health-check servers).
    pub after_sync: Option<Arc<dyn SyncObserver>>,
}

impl Shared {
    pub fn new(settings: &ProxySettings, metrics: Metrics, health: Arc<ProxyHealth>) -> Self {
        Self {
            trackers: Mutex::new(Trackers {
                services: ServiceTracker::new(settings.family),
                endpoints: EndpointsTracker::new(settings.family, &settings.node_name),
                node: Arc::new(NodeView {
                    name: settings.node_name.clone(),
                    ..NodeView::default()
                }),
                force_full: false,
            }),
            metrics,
            health,
            labels: FamilyLabels {
                ip_family: settings.family.label(),
            },
            after_sync: None,
        }
    }

    pub fn trackers(&self) -> MutexGuard<'_, Trackers> {
        // The trackers stay consistent across a panic in another thread (every update is
        // a single map operation), so keep serving rather than poisoning the whole proxy.
        self.trackers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs the proxy until the event channel closes: intake, then syncs once all sources are in.
pub async fn run(
    settings: ProxySettings,
    backend: Box<dyn Backend>,
    events: EventReceiver,
    metrics: Metrics,
    health: Arc<ProxyHealth>,
) {
    run_observed(settings, backend, events, metrics, health, None).await;
}

/// [`run`], telling `after_sync` the desired state after each successful sync.
pub async fn run_observed(
    settings: ProxySettings,
    backend: Box<dyn Backend>,
    events: EventReceiver,
    metrics: Metrics,
    health: Arc<ProxyHealth>,
    after_sync: Option<Arc<dyn SyncObserver>>,
) {
    // Upstream's SyncLoop marks the proxier updated as it starts, "in case Sync() never
    // succeeds": from here on a queued change that is not applied in time makes it unhealthy.
    health.updated();
    let mut shared = Shared::new(&settings, metrics, health);
    shared.after_sync = after_sync;
    let shared = Arc::new(shared);
    // And, as upstream, it synthesizes a "last change queued" time while the sources list.
    shared
        .metrics
        .sync_proxy_rules_last_queued_timestamp_seconds
        .get_or_create(&shared.labels)
        .set(intake::unix_now());
    let (runner, trigger) = SyncRunner::new(settings.runner);
    let (ready_tx, mut ready_rx) = watch::channel(false);
    let intake = Intake::new(
        shared.clone(),
        settings.sources.iter().copied().collect(),
        trigger,
        ready_tx,
    );
    let intake_task = tokio::spawn(intake.run(events));
    if ready_rx.wait_for(|ready| *ready).await.is_err() {
        tracing::warn!("sources ended before delivering their initial state; no rules written");
        return;
    }
    tracing::info!("all sources synced; starting to program rules");
    let backend = Arc::new(Mutex::new(backend));
    let sync_loop = runner.run(move || {
        let shared = shared.clone();
        let backend = backend.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut backend = backend.lock().unwrap_or_else(|e| e.into_inner());
                sync::sync_once(&shared, backend.as_mut())
            })
            .await
            .map_err(|join| join.to_string())?
        }
    });
    tokio::select! {
        _ = sync_loop => {}
        _ = intake_task => tracing::info!("event sources closed; stopping"),
    }
}

/// Collects events until every source has delivered its initial state, and returns it;
/// for `--dry-run`, which renders rules without programming anything.
pub async fn initial_state(
    settings: &ProxySettings,
    mut events: EventReceiver,
    metrics: Metrics,
    health: Arc<ProxyHealth>,
) -> DesiredState {
    let shared = Arc::new(Shared::new(settings, metrics, health));
    let (runner, trigger) = SyncRunner::new(settings.runner);
    drop(runner);
    let (ready_tx, ready_rx) = watch::channel(false);
    let mut intake = Intake::new(
        shared.clone(),
        settings.sources.iter().copied().collect(),
        trigger,
        ready_tx,
    );
    while !*ready_rx.borrow() {
        match events.recv().await {
            Some(event) => intake.apply(event),
            None => break,
        }
    }
    let mut trackers = shared.trackers();
    let node = trackers.node.clone();
    DesiredState {
        services: trackers.services.take().snapshot,
        endpoints: trackers.endpoints.take().snapshot,
        node,
    }
}

/// Source names still missing from `synced`.
pub(crate) fn missing_sources<'a>(
    expected: &'a BTreeSet<&'static str>,
    synced: &'a BTreeSet<&'static str>,
) -> impl Iterator<Item = &'a &'static str> {
    expected.difference(synced)
}
