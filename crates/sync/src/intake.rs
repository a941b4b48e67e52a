//! Intake: source events into the trackers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use kpr_model::{IgnoredValue, Rejection, node_view};
use kpr_runner::Trigger;
use kpr_sources::{Event, EventReceiver};
use tokio::sync::watch;

use crate::{Shared, missing_sources};

pub struct Intake {
    shared: Arc<Shared>,
    expected: BTreeSet<&'static str>,
    synced: BTreeSet<&'static str>,
    trigger: Trigger,
    ready: watch::Sender<bool>,
}

impl Intake {
    pub(crate) fn new(
        shared: Arc<Shared>,
        expected: BTreeSet<&'static str>,
        trigger: Trigger,
        ready: watch::Sender<bool>,
    ) -> Self {
        let intake = Self {
            shared,
            expected,
            synced: BTreeSet::new(),
            trigger,
            ready,
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
                self.shared
                    .metrics
                    .sync_proxy_rules_service_changes_total
                    .get_or_create(&self.shared.labels)
                    .inc();
                let outcome = self.shared.trackers().services.update(id, object.as_deref());
                let result = outcome.map(|ignored| self.report_ignored(&ignored));
                self.changed(result);
            }
            Event::EndpointSlice { id, object } => {
                self.shared
                    .metrics
                    .sync_proxy_rules_endpoint_changes_total
                    .get_or_create(&self.shared.labels)
                    .inc();
                let outcome = self.shared.trackers().endpoints.update(id, object.as_deref());
                let result = outcome.map(|ignored| self.report_ignored(&ignored));
                self.changed(result);
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
    /// rules stay either way.
    fn node_changed(&mut self, node: Option<&k8s_openapi::api::core::v1::Node>) {
        let view = match node.map(node_view) {
            Some(Ok(view)) => view,
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
        if trackers.node.labels != view.labels {
            // Topology hints depend on the zone label: every service may route differently.
            trackers.force_full = true;
            drop(trackers);
            self.changed(Ok(()));
            trackers = self.shared.trackers();
        }
        trackers.node = Arc::new(view);
    }

    fn changed(&mut self, result: Result<(), Rejection>) {
        if let Err(rejection) = result {
            self.reject(&rejection);
        }
        self.update_pending_gauges();
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

    fn source_trouble(&self, source: &'static str, problem: Option<String>) {
        match &problem {
            Some(problem) => tracing::warn!(source, "{problem}"),
            None => tracing::info!(source, "source recovered"),
        }
        self.shared
            .health
            .set_problem(problem.map(|p| format!("source {source}: {p}")));
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

    fn announce_if_ready(&self) {
        if self.is_ready() && !*self.ready.borrow() {
            self.ready.send_replace(true);
            self.trigger.fire();
        } else if !self.is_ready() {
            let missing: Vec<_> = missing_sources(&self.expected, &self.synced).collect();
            self.shared
                .health
                .set_problem(Some(format!("waiting for the initial state of: {missing:?}")));
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
