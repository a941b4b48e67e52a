//! One sync: take the changes, hand the desired state to the backend, record the outcome.
//!
//! Metrics follow upstream's accounting: the sync duration (overall, and full or partial by
//! what was attempted) is observed for failed syncs too; a failed partial sync counts in
//! `..._iptables_partial_restore_failures_total`, and `..._iptables_restore_failures_total`
//! counts only failures of the restore itself, as the backend's error says.

use std::time::{Instant, SystemTime};

use kpr_metrics::{RejectedLabels, TableLabels, TrafficLabels};
use kpr_state::{Backend, BackendError, FailedStep, PendingSync, SyncKind, SyncReport, UnsafeObject};

use crate::Shared;
use crate::intake::unix_now;

/// The `reason` label of objects a backend left out because of unsafe text.
const UNSAFE_TEXT_REASON: &str = "unsafe_text";

pub(crate) fn sync_once(shared: &Shared, backend: &mut dyn Backend) -> Result<(), String> {
    let started = Instant::now();
    let (pending, force_full, trigger_times) = {
        let mut t = shared.trackers();
        let force_full = std::mem::take(&mut t.force_full);
        let trigger_times = t.endpoints.take_trigger_times();
        let pending = PendingSync::new(t.services.take(), t.endpoints.take(), t.node.clone());
        (pending, force_full, trigger_times)
    };
    set_pending_gauges_to_zero(shared);
    let request = pending.request(force_full);
    let changed = &pending.changed;
    match backend.sync(&request) {
        Ok(report) => {
            record_duration(shared, kind_of(&report), started);
            record_success(shared, &report);
            record_unsafe_objects(shared, &report.newly_unsafe);
            record_programming_latency(shared, &trigger_times);
            if let Some(observer) = &shared.after_sync {
                observer.synced(&pending.state);
            }
            tracing::debug!(
                full = report.full,
                changed = changed.len(),
                elapsed = ?started.elapsed(),
                "synced rules"
            );
            Ok(())
        }
        Err(error) => {
            record_duration(shared, error.attempted, started);
            if backend.mode() == "iptables" {
                record_iptables_failure(shared, &error);
            }
            // The runner logs the failure itself; this adds what the metrics were told.
            tracing::debug!(attempted = ?error.attempted, step = ?error.step, "sync failed: {error}");
            shared
                .health
                .set_problem(Some(format!("last sync failed: {error}")));
            Err(error.to_string())
        }
    }
}

fn kind_of(report: &SyncReport) -> SyncKind {
    if report.full {
        SyncKind::Full
    } else {
        SyncKind::Partial
    }
}

/// Upstream observes how long a sync took whether or not it succeeded.
fn record_duration(shared: &Shared, attempted: SyncKind, started: Instant) {
    let m = &shared.metrics;
    let labels = &shared.labels;
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

fn record_iptables_failure(shared: &Shared, error: &BackendError) {
    let m = &shared.metrics;
    if error.attempted == SyncKind::Partial {
        m.sync_proxy_rules_iptables_partial_restore_failures_total
            .get_or_create(&shared.labels)
            .inc();
    }
    if error.step == FailedStep::Restore {
        m.sync_proxy_rules_iptables_restore_failures_total
            .get_or_create(&shared.labels)
            .inc();
    }
}

/// Logs and counts what the backend left out, like the objects intake rejects.
fn record_unsafe_objects(shared: &Shared, unsafe_objects: &[UnsafeObject]) {
    for object in unsafe_objects {
        tracing::warn!("{object}");
        shared
            .metrics
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
fn record_programming_latency(shared: &Shared, trigger_times: &[SystemTime]) {
    let now = SystemTime::now();
    let histogram = shared
        .metrics
        .network_programming_duration_seconds
        .get_or_create(&shared.labels);
    for t in trigger_times {
        // A trigger time in the future (clock skew) says nothing; skip it as upstream does.
        if let Ok(latency) = now.duration_since(*t) {
            histogram.observe(latency.as_secs_f64());
        }
    }
}

fn set_pending_gauges_to_zero(shared: &Shared) {
    let m = &shared.metrics;
    m.sync_proxy_rules_service_changes_pending
        .get_or_create(&shared.labels)
        .set(0);
    m.sync_proxy_rules_endpoint_changes_pending
        .get_or_create(&shared.labels)
        .set(0);
}

fn record_success(shared: &Shared, report: &SyncReport) {
    let m = &shared.metrics;
    let labels = &shared.labels;
    m.sync_proxy_rules_last_timestamp_seconds
        .get_or_create(labels)
        .set(unix_now());
    for table in &report.tables {
        let t = TableLabels {
            ip_family: labels.ip_family,
            table: table.table,
        };
        m.sync_proxy_rules_iptables_total
            .get_or_create(&t)
            .set(table.total as i64);
        m.sync_proxy_rules_iptables_last
            .get_or_create(&t)
            .set(table.written as i64);
    }
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
    record_conntrack_reconcile(shared, report);
    shared.health.updated();
}

/// Upstream's `conntrack_reconciler_*`: observed for every reconcile the backend ran.
fn record_conntrack_reconcile(shared: &Shared, report: &SyncReport) {
    let Some(reconcile) = &report.conntrack_reconcile else {
        return;
    };
    let m = &shared.metrics;
    m.conntrack_reconciler_sync_duration_seconds
        .get_or_create(&shared.labels)
        .observe(reconcile.duration.as_secs_f64());
    m.conntrack_reconciler_deleted_entries_total
        .get_or_create(&shared.labels)
        .inc_by(reconcile.deleted);
}

#[cfg(test)]
mod tests;
