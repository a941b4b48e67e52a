//! One sync of one family: take its changes, hand the desired state to its backend, record
//! the outcome under its `ip_family` label and in its health entry.
//!
//! Metrics follow upstream's accounting: the sync duration (overall, and full or partial by
//! what was attempted) is observed for failed syncs too. What only one mode counts (its
//! failures by step, its rule counts) its backend records itself, so this layer knows no
//! mode.

use std::collections::BTreeSet;
use std::time::{Instant, SystemTime};

use kpr_metrics::{FamilyLabels, Metrics, RejectedLabels, TrafficLabels};
use kpr_model::NamespacedName;
use kpr_state::{Backend, DesiredState, PendingSync, SyncKind, SyncReport, UnsafeObject};

use crate::intake::unix_now;
use crate::{Proxier, Shared};

/// The `reason` label of objects a backend left out because of unsafe text.
const UNSAFE_TEXT_REASON: &str = "unsafe_text";

/// A failed sync, as the sync loop sees it.
#[derive(Debug)]
pub(crate) struct SyncFailed {
    pub message: String,
    /// Only a configuration change can fix it ([`kpr_state::BackendError::needs_operator`]).
    pub needs_operator: bool,
}

impl std::fmt::Display for SyncFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a successful sync programmed.
pub(crate) struct Programmed {
    pub state: DesiredState,
    /// The Services the sync took changes of.
    pub changed: BTreeSet<NamespacedName>,
    /// Whether the backend rewrote everything.
    pub full: bool,
}

/// Syncs `proxier`'s family; returns what its backend programmed.
pub(crate) fn sync_once(
    shared: &Shared,
    proxier: &Proxier,
    backend: &mut dyn Backend,
) -> Result<Programmed, SyncFailed> {
    let started = Instant::now();
    let (pending, force_full, trigger_times) = {
        let mut t = proxier.trackers();
        let force_full = std::mem::take(&mut t.force_full);
        let trigger_times = t.endpoints.take_trigger_times();
        let pending = PendingSync::new(t.services.take(), t.endpoints.take(), t.node.clone())
            .with_service_cidrs(t.service_cidrs.clone());
        (pending, force_full, trigger_times)
    };
    let family = Recorder { shared, proxier };
    family.set_pending_gauges_to_zero();
    let request = pending.request(force_full);
    let changed = &pending.changed;
    match backend.sync(&request) {
        Ok(report) => {
            family.record_duration(kind_of(&report), started);
            family.record_success(&report);
            family.record_unsafe_objects(&report.newly_unsafe);
            family.record_programming_latency(&trigger_times);
            tracing::debug!(
                full = report.full,
                changed = changed.len(),
                elapsed = ?started.elapsed(),
                "synced rules"
            );
            Ok(Programmed {
                state: pending.state,
                changed: pending.changed,
                full: report.full,
            })
        }
        Err(error) => {
            family.record_duration(error.attempted, started);
            // The runner logs the failure itself; this adds what the metrics were told.
            tracing::debug!(attempted = ?error.attempted, step = ?error.step, "sync failed: {error}");
            shared
                .health
                .proxier_sync_failed(proxier.family, format!("last sync failed: {error}"));
            Err(SyncFailed {
                message: error.to_string(),
                needs_operator: error.needs_operator,
            })
        }
    }
}

/// Where one family's sync outcome goes: the shared metrics under its labels, its health.
struct Recorder<'a> {
    shared: &'a Shared,
    proxier: &'a Proxier,
}

fn kind_of(report: &SyncReport) -> SyncKind {
    if report.full {
        SyncKind::Full
    } else {
        SyncKind::Partial
    }
}

impl Recorder<'_> {
    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    fn labels(&self) -> &FamilyLabels {
        &self.proxier.labels
    }

    /// Upstream observes how long a sync took whether or not it succeeded.
    fn record_duration(&self, attempted: SyncKind, started: Instant) {
        let m = self.metrics();
        let labels = self.labels();
        let elapsed = started.elapsed().as_secs_f64();
        m.sync_proxy_rules_duration_seconds
            .get_or_create(labels)
            .observe(elapsed);
        let by_kind = match attempted {
            SyncKind::Full => &m.sync_full_proxy_rules_duration_seconds,
            SyncKind::Partial => &m.sync_partial_proxy_rules_duration_seconds,
        };
        by_kind.get_or_create(labels).observe(elapsed);
    }

    /// Logs and counts what the backend left out, like the objects intake rejects.
    fn record_unsafe_objects(&self, unsafe_objects: &[UnsafeObject]) {
        for object in unsafe_objects {
            tracing::warn!("{object}");
            self.metrics()
                .rejected_objects_total
                .get_or_create(&RejectedLabels {
                    kind: object.kind.as_str(),
                    reason: UNSAFE_TEXT_REASON,
                })
                .inc();
        }
    }

    /// Upstream's network programming latency: from the change that triggered an endpoint
    /// update (the slice's annotation) to the end of the sync that programmed it.
    fn record_programming_latency(&self, trigger_times: &[SystemTime]) {
        // As upstream, a family's series appears with its first sample.
        if trigger_times.is_empty() {
            return;
        }
        let now = SystemTime::now();
        let histogram = self
            .metrics()
            .network_programming_duration_seconds
            .get_or_create(self.labels());
        for t in trigger_times {
            // A trigger time in the future (clock skew) says nothing; skip it as upstream does.
            if let Ok(latency) = now.duration_since(*t) {
                histogram.observe(latency.as_secs_f64());
            }
        }
    }

    fn set_pending_gauges_to_zero(&self) {
        let m = self.metrics();
        m.sync_proxy_rules_service_changes_pending
            .get_or_create(self.labels())
            .set(0);
        m.sync_proxy_rules_endpoint_changes_pending
            .get_or_create(self.labels())
            .set(0);
    }

    fn record_success(&self, report: &SyncReport) {
        let m = self.metrics();
        let labels = self.labels();
        m.sync_proxy_rules_last_timestamp_seconds
            .get_or_create(labels)
            .set(unix_now());
        for (policy, count) in [
            ("internal", report.no_local_internal),
            ("external", report.no_local_external),
        ] {
            m.sync_proxy_rules_no_local_endpoints_total
                .get_or_create(&TrafficLabels {
                    ip_family: labels.ip_family,
                    traffic_policy: policy,
                })
                .set(count as i64);
        }
        self.record_conntrack_reconcile(report);
        self.shared.health.proxier_updated(self.proxier.family);
    }

    /// Upstream's `conntrack_reconciler_*`: observed for every reconcile the backend ran.
    fn record_conntrack_reconcile(&self, report: &SyncReport) {
        let Some(reconcile) = &report.conntrack_reconcile else {
            return;
        };
        let m = self.metrics();
        m.conntrack_reconciler_sync_duration_seconds
            .get_or_create(self.labels())
            .observe(reconcile.duration.as_secs_f64());
        m.conntrack_reconciler_deleted_entries_total
            .get_or_create(self.labels())
            .inc_by(reconcile.deleted);
    }
}

#[cfg(test)]
mod dual_stack_tests;
#[cfg(test)]
mod repair_tests;
#[cfg(test)]
mod tests;
