//! Intake: source events into the trackers.
//!
//! Intake also keeps `/healthz`'s problem text for what it knows about: sources that are in
//! trouble and sources not in yet. It withdraws only texts it set itself, so a source that
//! recovers never erases a "last sync failed" set by the sync step meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use kpr_model::{Converted, IgnoredValue, Rejection, convert_node};
use kpr_runner::Trigger;
use kpr_sources::{Event, EventReceiver};
use kpr_tracking::Recorded;
use tokio::sync::watch;

use crate::{Shared, missing_sources};

pub struct Intake {
    shared: Arc<Shared>,
    expected: BTreeSet<&'static str>,
    synced: BTreeSet<&'static str>,
    trigger: Trigger,
    ready: watch::Sender<bool>,
    /// The problem text of every source currently in trouble.
    source_problems: BTreeMap<&'static str, String>,
    /// The "waiting for the initial state" text last shown, while sources are missing.
    waiting_problem: Option<String>,
}

impl Intake {
    pub(crate) fn new(
        shared: Arc<Shared>,
        expected: BTreeSet<&'static str>,
        trigger: Trigger,
        ready: watch::Sender<bool>,
    ) -> Self {
        let mut intake = Self {
            shared,
            expected,
            synced: BTreeSet::new(),
            trigger,
            ready,
            source_problems: BTreeMap::new(),
            waiting_problem: None,
        };
        intake.announce_if_ready();
        intake
    }

    pub async fn run(mut self, mut events: EventReceiver) {
        while let Some(event) = events.recv().await {
            self.apply(event);
        }
    }

    pub(crate) fn apply(&mut self, event: Event) {
        match event {
            Event::Service { id, object } => {
                // Upstream counts every Service event.
                self.shared
                    .metrics
                    .sync_proxy_rules_service_changes_total
                    .get_or_create(&self.shared.labels)
                    .inc();
                let recorded = self.shared.trackers().services.record(id, object.as_deref());
                self.recorded(recorded);
            }
            Event::EndpointSlice { id, object } => {
                let recorded = self.shared.trackers().endpoints.record(id, object.as_deref());
                // Upstream counts the slices of this proxier's family only.
                let ours = match &object {
                    Some(slice) => slice.address_type == self.shared.labels.ip_family,
                    None => recorded.changed,
                };
                if ours {
                    self.shared
                        .metrics
                        .sync_proxy_rules_endpoint_changes_total
                        .get_or_create(&self.shared.labels)
                        .inc();
                }
                self.recorded(recorded);
            }
            Event::Node { object } => self.node_changed(object.as_deref()),
            Event::Synced { source } => {
                tracing::info!(source, "source delivered its initial state");
                self.synced.insert(source);
                self.announce_if_ready();
            }
            Event::Rejected(rejection) => self.reject(&rejection),
            Event::SourceTrouble { source, problem } => self.source_trouble(source, problem),
        }
    }

    /// Upstream's node handlers: the health server's `SyncNode` and the proxier's topology
    /// labels. A deleted Node keeps the eligibility its last version had (upstream calls
    /// `SyncNode` with the deleted object), so a node drained before deletion stays out of
    /// load balancers; its labels are forgotten, as the proxier's `OnNodeDelete` does. The
    /// rules stay either way. A malformed address is dropped and reported; the rest of the
    /// Node (zone, taints) still counts.
    fn node_changed(&mut self, node: Option<&k8s_openapi::api::core::v1::Node>) {
        let view = match node.map(convert_node) {
            Some(Ok(Converted { view, ignored })) => {
                self.report_ignored(&ignored);
                view
            }
            Some(Err(rejection)) => return self.reject(&rejection),
            None => {
                let last = self.shared.trackers().node.clone();
                tracing::info!(
                    node = %last.name,
                    eligible = !last.going_away,
                    "our Node was deleted; keeping its last eligibility, rules stay"
                );
                kpr_model::NodeView {
                    name: last.name.clone(),
                    going_away: last.going_away,
                    ..Default::default()
                }
            }
        };
        self.shared.health.set_node_eligible(!view.going_away);
        let mut trackers = self.shared.trackers();
        if trackers.node.zone() != view.zone() {
            // Topology hints depend on the zone label: every service may route differently.
            // No other label matters to the rules (upstream's NodeTopologyConfig passes on the
            // zone label only), so other label changes cost no sync.
            trackers.force_full = true;
            drop(trackers);
            self.queue_sync();
            trackers = self.shared.trackers();
        }
        trackers.node = Arc::new(view);
    }

    /// Reports what a tracker update dropped or rejected, and queues a sync if it changed
    /// anything: as upstream, a version that changes nothing (sent again by a relist, or a
    /// slice of the other family) neither syncs nor counts as a queued change for health.
    fn recorded(&mut self, recorded: Recorded) {
        match &recorded.outcome {
            Ok(ignored) => self.report_ignored(ignored),
            Err(rejection) => self.reject(rejection),
        }
        self.update_pending_gauges();
        if recorded.changed {
            self.queue_sync();
        }
    }

    /// Marks a change as queued (for health and the queued-timestamp metric) and asks the
    /// runner for a sync, once every source is in.
    fn queue_sync(&self) {
        if self.is_ready() {
            self.shared.health.queued_update();
            self.shared
                .metrics
                .sync_proxy_rules_last_queued_timestamp_seconds
                .get_or_create(&self.shared.labels)
                .set(unix_now());
            self.trigger.fire();
        }
    }

    /// A source reports trouble (shown as the problem) or recovery (its own text withdrawn,
    /// another troubled source's shown instead if any; a text someone else set stays).
    fn source_trouble(&mut self, source: &'static str, problem: Option<String>) {
        match problem {
            Some(problem) => {
                tracing::warn!(source, "{problem}");
                let text = format!("source {source}: {problem}");
                self.source_problems.insert(source, text.clone());
                self.shared.health.set_problem(Some(text));
            }
            None => {
                tracing::info!(source, "source recovered");
                if let Some(own) = self.source_problems.remove(source) {
                    let still_troubled = self.source_problems.values().next().cloned();
                    self.shared.health.replace_problem(&own, still_troubled);
                }
            }
        }
    }

    fn reject(&self, rejection: &Rejection) {
        // Names come from untrusted input: escaped, so they cannot forge log lines.
        tracing::warn!(
            kind = %rejection.kind,
            object = %rejection.object.escape_debug(),
            field = %rejection.field.escape_debug(),
            reason = rejection.reason.as_str(),
            "{rejection}"
        );
        self.shared.metrics.count_rejection(rejection);
    }

    /// Logs and counts the list entries a conversion dropped from an object it accepted.
    /// Called once per converted object version, so a bad entry is not re-reported on every
    /// sync.
    fn report_ignored(&self, ignored: &[IgnoredValue]) {
        for entry in ignored {
            tracing::warn!(
                kind = %entry.kind,
                object = %entry.object.escape_debug(),
                field = %entry.field.escape_debug(),
                reason = entry.reason.as_str(),
                "{entry}"
            );
            self.shared.metrics.count_ignored(entry);
        }
    }

    fn update_pending_gauges(&self) {
        let (services, endpoints) = {
            let t = self.shared.trackers();
            (t.services.pending(), t.endpoints.pending())
        };
        let m = &self.shared.metrics;
        m.sync_proxy_rules_service_changes_pending
            .get_or_create(&self.shared.labels)
            .set(services as i64);
        m.sync_proxy_rules_endpoint_changes_pending
            .get_or_create(&self.shared.labels)
            .set(endpoints as i64);
    }

    fn is_ready(&self) -> bool {
        missing_sources(&self.expected, &self.synced).next().is_none()
    }

    fn announce_if_ready(&mut self) {
        if self.is_ready() {
            if let Some(waiting) = self.waiting_problem.take() {
                self.shared.health.replace_problem(&waiting, None);
            }
            if !*self.ready.borrow() {
                self.ready.send_replace(true);
                self.trigger.fire();
            }
        } else {
            let missing: Vec<_> = missing_sources(&self.expected, &self.synced).collect();
            let text = format!("waiting for the initial state of: {missing:?}");
            self.shared.health.set_problem(Some(text.clone()));
            self.waiting_problem = Some(text);
        }
    }
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
