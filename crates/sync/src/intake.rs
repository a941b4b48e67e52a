//! Intake: source events into the trackers of every family.
//!
//! Each object is converted once per family (inside each family's tracker); what the
//! conversions rejected or dropped is logged and counted once per object version, however
//! many families looked at it. Only the families whose state changed queue a sync.
//!
//! ServiceCIDRs are kept here, by name, as upstream's ServiceCIDR config keeps them: every
//! object, whatever its status, until it is deleted. Each family's trackers hold the union of
//! that family's CIDRs; a change of the union queues a sync of the family.
//!
//! Intake also keeps `/healthz`'s problem text for what it knows about: sources that are in
//! trouble and sources not in yet. It withdraws only texts it set itself, so a source that
//! recovers never erases a "last sync failed" set by the sync step meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{
    Converted, IgnoredValue, Rejection, ServiceCidrView, Sizes, convert_node, convert_service_cidr,
};
use kpr_runner::Trigger;
use kpr_sources::{Event, EventReceiver};
use kpr_tracking::Recorded;
use tokio::sync::watch;

use crate::{Proxier, Shared, missing_sources};

pub struct Intake {
    shared: Arc<Shared>,
    expected: BTreeSet<&'static str>,
    synced: BTreeSet<&'static str>,
    /// One per family, in the order of `shared.proxiers`.
    triggers: Vec<Trigger>,
    ready: watch::Sender<bool>,
    /// The problem text of every source currently in trouble.
    source_problems: BTreeMap<&'static str, String>,
    /// The "waiting for the initial state" text last shown, while sources are missing.
    waiting_problem: Option<String>,
    /// Every ServiceCIDR by name (the event's name), as converted.
    service_cidrs: BTreeMap<String, ServiceCidrView>,
}

impl Intake {
    /// `triggers` ask each family's runner for a sync, in the order of `shared.proxiers`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        expected: BTreeSet<&'static str>,
        triggers: Vec<Trigger>,
        ready: watch::Sender<bool>,
    ) -> Self {
        debug_assert_eq!(triggers.len(), shared.proxiers.len());
        let mut intake = Self {
            shared,
            expected,
            synced: BTreeSet::new(),
            triggers,
            ready,
            source_problems: BTreeMap::new(),
            waiting_problem: None,
            service_cidrs: BTreeMap::new(),
        };
        intake.announce_if_ready();
        intake
    }

    pub async fn run(mut self, mut events: EventReceiver) {
        while let Some(event) = events.recv().await {
            self.apply(event);
        }
    }

    /// What intake and every family's trackers hold (kpr_model::Sizes): none of it may grow
    /// with the number of changes (guarded by `intake::churn_tests`).
    pub fn footprint(&self) -> Sizes {
        let own = Sizes::new()
            .with("service_cidrs", self.service_cidrs.len())
            .with("source_problems", self.source_problems.len())
            .with("synced", self.synced.len());
        self.shared.proxiers.iter().fold(own, |sizes, proxier| {
            sizes.nested(proxier.labels.ip_family, proxier.trackers().footprint())
        })
    }

    pub(crate) fn apply(&mut self, event: Event) {
        match event {
            Event::Service { id, object } => {
                let mut outcomes = Outcomes::default();
                for index in 0..self.shared.proxiers.len() {
                    let proxier = &self.shared.proxiers[index];
                    // Upstream counts every Service event, in every family's proxier.
                    self.shared
                        .metrics
                        .sync_proxy_rules_service_changes_total
                        .get_or_create(&proxier.labels)
                        .inc();
                    let recorded = proxier.trackers().services.record(id.clone(), object.as_deref());
                    self.recorded(index, recorded, &mut outcomes);
                }
                self.report(outcomes);
            }
            Event::EndpointSlice { id, object } => {
                let mut outcomes = Outcomes::default();
                for index in 0..self.shared.proxiers.len() {
                    let proxier = &self.shared.proxiers[index];
                    let recorded = proxier.trackers().endpoints.record(id.clone(), object.as_deref());
                    // Upstream counts the slices of the proxier's own family only.
                    let ours = match &object {
                        Some(slice) => slice.address_type == proxier.labels.ip_family,
                        None => recorded.changed,
                    };
                    if ours {
                        self.shared
                            .metrics
                            .sync_proxy_rules_endpoint_changes_total
                            .get_or_create(&proxier.labels)
                            .inc();
                    }
                    self.recorded(index, recorded, &mut outcomes);
                }
                self.report(outcomes);
            }
            Event::Node { object } => self.node_changed(object.as_deref()),
            Event::ServiceCidr { name, object } => self.service_cidr_changed(name, object.as_deref()),
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
                let last = self.primary().trackers().node.clone();
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
        let view = Arc::new(view);
        for index in 0..self.shared.proxiers.len() {
            let mut trackers = self.shared.proxiers[index].trackers();
            let zone_changed = trackers.node.zone() != view.zone();
            trackers.node = view.clone();
            if zone_changed {
                // Topology hints depend on the zone label: every service may route
                // differently. No other label matters to the rules (upstream's
                // NodeTopologyConfig passes on the zone label only), so other label changes
                // cost no sync.
                trackers.force_full = true;
                drop(trackers);
                self.queue_sync(index);
            }
        }
    }

    /// A ServiceCIDR was added, changed or deleted: each family whose union of CIDRs changed
    /// gets the new union and queues a sync. A rejected object counts as absent, as a
    /// rejected Service does; its dropped entries are logged and counted.
    fn service_cidr_changed(&mut self, name: String, object: Option<&ServiceCIDR>) {
        match object.map(convert_service_cidr) {
            Some(Ok(Converted { view, ignored })) => {
                self.report_ignored(&ignored);
                self.service_cidrs.insert(name, view);
            }
            Some(Err(rejection)) => {
                self.reject(&rejection);
                self.service_cidrs.remove(&name);
            }
            None => {
                self.service_cidrs.remove(&name);
            }
        }
        for index in 0..self.shared.proxiers.len() {
            let family = self.shared.proxiers[index].family;
            let mut cidrs: Vec<IpNet> = self
                .service_cidrs
                .values()
                .flat_map(|view| view.of_family(family))
                .collect();
            cidrs.sort();
            cidrs.dedup();
            let mut trackers = self.shared.proxiers[index].trackers();
            if *trackers.service_cidrs != cidrs {
                tracing::info!(ip_family = family.label(), ?cidrs, "Service CIDRs changed");
                trackers.service_cidrs = Arc::new(cidrs);
                drop(trackers);
                self.queue_sync(index);
            }
        }
    }

    /// The first family's proxier (the primary family): every family sees the same Node.
    fn primary(&self) -> &Proxier {
        &self.shared.proxiers[0]
    }

    /// Keeps what a tracker update of family `index` dropped or rejected for [`Self::report`],
    /// and queues a sync of that family if it changed anything: as upstream, a version that
    /// changes nothing (sent again by a relist, or a slice of the other family) neither
    /// syncs nor counts as a queued change for health.
    fn recorded(&self, index: usize, recorded: Recorded, outcomes: &mut Outcomes) {
        outcomes.add(recorded.outcome);
        self.update_pending_gauges(&self.shared.proxiers[index]);
        if recorded.changed {
            self.queue_sync(index);
        }
    }

    /// Logs and counts, once each, what the families' conversions of one object version
    /// rejected or dropped.
    fn report(&self, outcomes: Outcomes) {
        for rejection in &outcomes.rejections {
            self.reject(rejection);
        }
        self.report_ignored(&outcomes.ignored);
    }

    /// Marks a change as queued for family `index` (for health and the queued-timestamp
    /// metric) and asks its runner for a sync, once every source is in.
    fn queue_sync(&self, index: usize) {
        if self.is_ready() {
            let proxier = &self.shared.proxiers[index];
            self.shared.health.proxier_queued_update(proxier.family);
            self.shared
                .metrics
                .sync_proxy_rules_last_queued_timestamp_seconds
                .get_or_create(&proxier.labels)
                .set(unix_now());
            self.triggers[index].fire();
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

    fn update_pending_gauges(&self, proxier: &Proxier) {
        let (services, endpoints) = {
            let t = proxier.trackers();
            (t.services.pending(), t.endpoints.pending())
        };
        let m = &self.shared.metrics;
        m.sync_proxy_rules_service_changes_pending
            .get_or_create(&proxier.labels)
            .set(services as i64);
        m.sync_proxy_rules_endpoint_changes_pending
            .get_or_create(&proxier.labels)
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
                for trigger in &self.triggers {
                    trigger.fire();
                }
            }
        } else {
            let missing: Vec<_> = missing_sources(&self.expected, &self.synced).collect();
            let text = format!("waiting for the initial state of: {missing:?}");
            self.shared.health.set_problem(Some(text.clone()));
            self.waiting_problem = Some(text);
        }
    }
}

/// What the conversions of one object version rejected or dropped, over every family, each
/// distinct finding once (the families mostly agree: a bad name is bad in both).
#[derive(Debug, Default)]
struct Outcomes {
    rejections: Vec<Rejection>,
    ignored: Vec<IgnoredValue>,
}

impl Outcomes {
    fn add(&mut self, outcome: Result<Vec<IgnoredValue>, Rejection>) {
        match outcome {
            Ok(ignored) => {
                for entry in ignored {
                    if !self.ignored.contains(&entry) {
                        self.ignored.push(entry);
                    }
                }
            }
            Err(rejection) => {
                if !self.rejections.contains(&rejection) {
                    self.rejections.push(rejection);
                }
            }
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
mod churn_tests;
#[cfg(test)]
mod tests;
