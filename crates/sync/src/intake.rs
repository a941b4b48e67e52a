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

    fn node_changed(&mut self, node: Option<&k8s_openapi::api::core::v1::Node>) {
        let view = match node.map(node_view) {
            Some(Ok(view)) => view,
            Some(Err(rejection)) => return self.reject(&rejection),
            // Our Node was deleted: keep its name, forget everything else about it.
            None => kpr_model::NodeView {
                name: self.shared.trackers().node.name.clone(),
                ..Default::default()
            },
        };
        self.shared.health.set_node_going_away(view.going_away);
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
mod ignored_tests {
    //! Dropped list entries: logged and counted at intake, once per object version.

    use std::time::Duration;

    use k8s_openapi::api::core::v1::Service;
    use kpr_metrics::{Metrics, ProxyHealth};
    use kpr_model::{IpFamily, NamespacedName};
    use kpr_runner::{RunnerConfig, SyncRunner};
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;
    use serde_json::json;

    use super::*;
    use crate::ProxySettings;

    fn intake() -> (Intake, Arc<Shared>, Registry) {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let settings = ProxySettings {
            family: IpFamily::V4,
            node_name: "node1".into(),
            runner: RunnerConfig {
                min_interval: Duration::from_millis(20),
                max_interval: Duration::from_secs(3600),
            },
            sources: vec![],
        };
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let shared = Arc::new(Shared::new(&settings, metrics, health));
        let (_runner, trigger) = SyncRunner::new(settings.runner);
        let (ready, _) = watch::channel(false);
        (
            Intake::new(shared.clone(), BTreeSet::new(), trigger, ready),
            shared,
            registry,
        )
    }

    fn service_event(external_ips: serde_json::Value) -> Event {
        let object: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.0.0.1", "externalIPs": external_ips, "ports": [{"port": 80}]}
        }))
        .unwrap();
        Event::Service {
            id: NamespacedName::new("default", "web"),
            object: Some(Arc::new(object)),
        }
    }

    fn metrics_text(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn a_bad_entry_is_counted_per_object_version_and_the_object_is_kept() {
        let (mut intake, shared, registry) = intake();
        intake.apply(service_event(json!(["192.0.2.1", "192.0.2.x", "also bad"])));
        let counted = |n: u32| {
            format!(
                "kubeproxy_ignored_values_total{{kind=\"Service\",field=\"spec.externalIPs\",reason=\"invalid_ip\"}} {n}"
            )
        };
        let text = metrics_text(&registry);
        assert!(text.contains(&counted(2)), "{text}");
        assert!(
            !text.contains("kubeproxy_rejected_objects_total{"),
            "the Service itself is not rejected:\n{text}"
        );
        let snapshot = shared.trackers().services.take().snapshot;
        assert_eq!(
            snapshot[&NamespacedName::new("default", "web")][0].external_ips,
            ["192.0.2.1".parse::<std::net::IpAddr>().unwrap()]
        );
        // Syncing does not report again; only a new version of the object does.
        shared.trackers().services.take();
        assert!(metrics_text(&registry).contains(&counted(2)));
        intake.apply(service_event(json!(["192.0.2.x"])));
        assert!(metrics_text(&registry).contains(&counted(3)));
        // A fixed version reports nothing.
        intake.apply(service_event(json!(["192.0.2.2"])));
        assert!(metrics_text(&registry).contains(&counted(3)));
    }
}
