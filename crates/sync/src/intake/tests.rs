//! Intake on its own: Node events into health and the trackers.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kpr_metrics::{Metrics, ProxyHealth};
use kpr_model::NamespacedName;
use kpr_runner::SyncRunner;
use kpr_sources::Event;
use kpr_world::slice_object;
use prometheus_client::registry::Registry;

use crate::ProxySettings;
use serde_json::json;
use tokio::sync::watch;

use crate::Shared;
use crate::test_support::{
    FAMILY, NODE_NAME, metrics_text, node_event, service_event, settings, slice_event,
};

use super::Intake;

/// An intake whose sources have not reported `Synced` yet.
fn waiting_intake(sources: Vec<&'static str>, health_timeout: Duration) -> (Intake, Arc<Shared>) {
    let (intake, shared, _registry) = waiting_intake_with_metrics(sources, health_timeout);
    (intake, shared)
}

/// Like [`waiting_intake`], with the registry its metrics are in.
fn waiting_intake_with_metrics(
    sources: Vec<&'static str>,
    health_timeout: Duration,
) -> (Intake, Arc<Shared>, Registry) {
    let settings = settings(sources);
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(health_timeout));
    let shared = Arc::new(Shared::new(&settings, &[FAMILY], metrics, health));
    let (_runner, trigger) = SyncRunner::new(settings.runner);
    let (ready, _) = watch::channel(false);
    let expected = settings.sources.iter().copied().collect();
    let intake = Intake::new(shared.clone(), expected, vec![trigger], ready);
    (intake, shared, registry)
}

fn intake() -> (Intake, Arc<Shared>) {
    let (mut intake, shared) = waiting_intake(vec!["manifests"], Duration::from_secs(60));
    intake.apply(Event::Synced { source: "manifests" });
    (intake, shared)
}

fn service(ip: &str) -> Event {
    service_event("web", json!({"clusterIP": ip, "ports": [{"port": 80}]}))
}

#[test]
fn changes_are_only_queued_once_every_source_is_in() {
    let timeout = Duration::from_millis(1);
    let (mut intake, shared) = waiting_intake(vec!["manifests", "api"], timeout);
    shared.health.updated(); // the sync loop starts
    intake.apply(Event::Synced { source: "manifests" });
    intake.apply(service("10.96.0.1"));
    std::thread::sleep(timeout * 5);
    let waiting = shared.health.healthz();
    assert!(
        waiting.healthy,
        "waiting for the api source is healthy, as upstream"
    );

    intake.apply(Event::Synced { source: "api" });
    intake.apply(service("10.96.0.2"));
    std::thread::sleep(timeout * 5);
    assert!(
        !shared.health.healthz().healthy,
        "a change queued after start-up and never applied is late"
    );
}

/// The Node in zone z1 with one InternalIP and these taints.
fn node(taints: serde_json::Value) -> Event {
    node_with(
        json!({"topology.kubernetes.io/zone": "z1"}),
        taints,
        json!([{"type": "InternalIP", "address": "192.168.0.10"}]),
    )
}

fn autoscaler_taint() -> serde_json::Value {
    json!([{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
}

#[test]
fn a_drained_node_stays_ineligible_once_deleted() {
    let (mut intake, shared) = intake();
    intake.apply(node(json!([])));
    assert!(shared.health.node_eligible());
    intake.apply(node(autoscaler_taint()));
    assert!(!shared.health.node_eligible());

    intake.apply(Event::Node { object: None });
    assert!(!shared.health.node_eligible(), "deletion made it eligible again");
    assert!(!shared.health.healthz().healthy);
    assert_eq!(shared.health.healthz().node_eligible, Some(false));
    let trackers = shared.trackers();
    assert_eq!(trackers.node.name, "node1");
    assert!(
        trackers.node.labels.is_empty(),
        "labels forgotten as upstream's OnNodeDelete"
    );
    assert!(
        trackers.force_full,
        "the zone went away: every service is re-rendered"
    );
}

#[test]
fn a_deleted_node_keeps_the_eligibility_of_its_last_version() {
    // Upstream's SyncNode(deleted object): no taint and no deletionTimestamp on the last
    // version means still eligible.
    let (mut intake, shared) = intake();
    intake.apply(node(json!([])));
    intake.apply(Event::Node { object: None });
    assert!(shared.health.node_eligible());
    assert!(shared.health.healthz().healthy);
}

#[test]
fn a_node_that_comes_back_is_judged_afresh() {
    let (mut intake, shared) = intake();
    intake.apply(node(autoscaler_taint()));
    intake.apply(Event::Node { object: None });
    intake.apply(node(json!([])));
    assert!(shared.health.node_eligible());
}

// === Dropped list entries: logged and counted at intake, once per object version ===

fn with_external_ips(external_ips: serde_json::Value) -> Event {
    service_event(
        "web",
        json!({"clusterIP": "10.0.0.1", "externalIPs": external_ips, "ports": [{"port": 80}]}),
    )
}

#[test]
fn a_bad_entry_is_counted_per_object_version_and_the_object_is_kept() {
    let (mut intake, shared, registry) = waiting_intake_with_metrics(vec![], Duration::from_secs(60));
    intake.apply(with_external_ips(json!(["192.0.2.1", "192.0.2.x", "also bad"])));
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
    intake.apply(with_external_ips(json!(["192.0.2.x"])));
    assert!(metrics_text(&registry).contains(&counted(3)));
    // A fixed version reports nothing.
    intake.apply(with_external_ips(json!(["192.0.2.2"])));
    assert!(metrics_text(&registry).contains(&counted(3)));
}

// === Node conversion: lenient addresses, topology from the zone label only ===

fn node_with(labels: serde_json::Value, taints: serde_json::Value, addresses: serde_json::Value) -> Event {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE_NAME, "labels": labels},
        "spec": {"taints": taints},
        "status": {"addresses": addresses}
    }))
    .unwrap();
    node_event(node)
}

/// Upstream reads node IPs leniently: a malformed address is skipped, and the Node's taint
/// and zone still take effect. The dropped address is logged and counted, not the Node.
#[test]
fn a_malformed_node_address_is_dropped_and_the_rest_of_the_node_used() {
    let (mut intake, shared, registry) = waiting_intake_with_metrics(vec![], Duration::from_secs(60));
    intake.apply(node_with(
        json!({"topology.kubernetes.io/zone": "z1"}),
        autoscaler_taint(),
        json!([{"type": "InternalIP", "address": "192.168.0.x"}, {"type": "InternalIP", "address": "192.168.0.10"}]),
    ));
    assert!(!shared.health.node_eligible(), "the taint was ignored");
    {
        let trackers = shared.trackers();
        assert_eq!(trackers.node.zone(), Some("z1"));
        assert_eq!(
            trackers.node.addresses,
            ["192.168.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
    }
    let text = metrics_text(&registry);
    assert!(
        text.contains(
            "kubeproxy_ignored_values_total{kind=\"Node\",field=\"status.addresses\",reason=\"invalid_ip\"} 1"
        ),
        "{text}"
    );
    assert!(!text.contains("kubeproxy_rejected_objects_total{"), "{text}");
}

/// Only the zone label decides topology: another label changing needs no full sync.
#[test]
fn only_a_zone_change_forces_a_full_sync() {
    let (mut intake, shared) = intake();
    let addresses = json!([{"type": "InternalIP", "address": "192.168.0.10"}]);
    intake.apply(node_with(
        json!({"topology.kubernetes.io/zone": "z1", "team": "a"}),
        json!([]),
        addresses.clone(),
    ));
    assert!(shared.trackers().force_full, "the zone appeared");
    shared.trackers().force_full = false;

    intake.apply(node_with(
        json!({"topology.kubernetes.io/zone": "z1", "team": "b"}),
        json!([]),
        addresses.clone(),
    ));
    assert!(!shared.trackers().force_full, "an unrelated label changed");
    assert_eq!(
        shared.trackers().node.labels["team"],
        "b",
        "labels still follow the Node"
    );

    intake.apply(node_with(
        json!({"topology.kubernetes.io/zone": "z2", "team": "b"}),
        json!([]),
        addresses,
    ));
    assert!(shared.trackers().force_full, "the zone changed");
}

/// A slice port upstream ignores is dropped and counted; the slice's other ports serve.
#[test]
fn a_bad_slice_port_is_counted_and_the_good_ports_kept() {
    let (mut intake, shared, registry) = waiting_intake_with_metrics(vec![], Duration::from_secs(60));
    intake.apply(slice_event(slice_object(
        "web-1",
        "web",
        "IPv4",
        json!([{"name": "http", "port": 80}, {"name": "admin"}]),
        vec![json!({"addresses": ["10.0.0.5"]})],
    )));
    let text = metrics_text(&registry);
    assert!(
        text.contains(
            "kubeproxy_ignored_values_total{kind=\"EndpointSlice\",field=\"ports\",reason=\"missing_field\"} 1"
        ),
        "{text}"
    );
    assert!(!text.contains("kubeproxy_rejected_objects_total{"), "{text}");
    let snapshot = shared.trackers().endpoints.take().snapshot;
    let port = kpr_model::ServicePortName::new("default", "web", "http", kpr_model::Protocol::Tcp);
    assert_eq!(kpr_tracking::endpoints_for(&snapshot, &port).len(), 1);
}

// === /healthz problem texts: each withdrawn only by whoever set it ===

fn trouble(source: &'static str, problem: Option<&str>) -> Event {
    Event::SourceTrouble {
        source,
        problem: problem.map(str::to_string),
    }
}

/// A source that recovers withdraws its own text, never a failed sync's.
#[test]
fn a_recovered_source_leaves_a_sync_failure_shown() {
    let (mut intake, shared) = intake();
    intake.apply(trouble("api", Some("connection refused")));
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("source api: connection refused")
    );
    // The sync step fails meanwhile.
    shared
        .health
        .set_problem(Some("last sync failed: iptables-restore: exit 1".into()));
    intake.apply(trouble("api", None));
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("last sync failed: iptables-restore: exit 1")
    );
}

#[test]
fn a_recovered_source_withdraws_its_text_and_shows_another_troubled_one() {
    let (mut intake, shared) = intake();
    intake.apply(trouble("api", Some("connection refused")));
    intake.apply(trouble("manifests", Some("cannot read /etc/kpr")));
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("source manifests: cannot read /etc/kpr")
    );
    intake.apply(trouble("manifests", None));
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("source api: connection refused"),
        "api is still in trouble"
    );
    // A recovery report from a source that reported nothing changes nothing.
    intake.apply(trouble("manifests", None));
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("source api: connection refused")
    );
    intake.apply(trouble("api", None));
    assert_eq!(shared.health.problem(), None);
}

/// The "waiting for sources" text goes once every source is in, unless something else
/// replaced it meanwhile.
#[test]
fn the_waiting_text_is_withdrawn_once_every_source_is_in() {
    let (mut intake, shared) = waiting_intake(vec!["manifests", "api"], Duration::from_secs(60));
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("waiting for the initial state of: [\"api\", \"manifests\"]")
    );
    intake.apply(Event::Synced { source: "manifests" });
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("waiting for the initial state of: [\"api\"]")
    );
    intake.apply(Event::Synced { source: "api" });
    assert_eq!(shared.health.problem(), None);

    let (mut intake, shared) = waiting_intake(vec!["api"], Duration::from_secs(60));
    intake.apply(trouble("api", Some("connection refused")));
    intake.apply(Event::Synced { source: "api" });
    assert_eq!(
        shared.health.problem().as_deref(),
        Some("source api: connection refused")
    );
}

// === Only real changes queue a sync, as upstream's change trackers decide ===

fn ipv6_slice() -> Event {
    slice_event(slice_object(
        "web-v6",
        "web",
        "IPv6",
        json!([{"port": 80}]),
        vec![json!({"addresses": ["fd00::5"]})],
    ))
}

/// A version that changes nothing (a relist sends it again; a slice of the other family)
/// queues no sync, so it can never make the proxy late; upstream does not count the
/// other-family slice as an endpoint change either.
#[test]
fn versions_that_change_nothing_queue_no_sync() {
    let timeout = Duration::from_millis(1);
    let (mut intake, shared, registry) = waiting_intake_with_metrics(vec![], timeout);
    shared.health.updated(); // the sync loop starts
    intake.apply(service("10.96.0.1"));
    // A sync applies it.
    shared.trackers().services.take();
    shared.health.updated();

    intake.apply(service("10.96.0.1"));
    intake.apply(ipv6_slice());
    std::thread::sleep(timeout * 5);
    assert!(shared.health.healthz().healthy, "nothing was queued");
    let text = metrics_text(&registry);
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_service_changes_total{ip_family=\"IPv4\"} 2"),
        "{text}"
    );
    assert!(
        !text.contains("kubeproxy_sync_proxy_rules_endpoint_changes_total{"),
        "{text}"
    );

    // A real change is queued and becomes late when no sync applies it.
    intake.apply(service("10.96.0.2"));
    std::thread::sleep(timeout * 5);
    assert!(!shared.health.healthz().healthy);
}

// === ServiceCIDRs: the union per family, kept by name ===

/// A dual-stack intake with every source in, and its metrics.
fn dual_stack_intake(health_timeout: Duration) -> (Intake, Arc<Shared>, Registry) {
    dual_stack_intake_with(&settings(vec![]), health_timeout)
}

/// A dual-stack intake of `settings`, waiting for its sources, and its metrics.
pub(super) fn dual_stack_intake_with(
    settings: &ProxySettings,
    health_timeout: Duration,
) -> (Intake, Arc<Shared>, Registry) {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(health_timeout));
    let families = [kpr_model::IpFamily::V4, kpr_model::IpFamily::V6];
    let shared = Arc::new(Shared::new(settings, &families, metrics, health));
    let triggers = families
        .iter()
        .map(|_| SyncRunner::new(settings.runner).1)
        .collect();
    let (ready, _) = watch::channel(false);
    let expected = settings.sources.iter().copied().collect();
    let intake = Intake::new(shared.clone(), expected, triggers, ready);
    (intake, shared, registry)
}

fn service_cidr(name: &str, cidrs: serde_json::Value) -> Event {
    let object =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}})).unwrap();
    Event::ServiceCidr {
        name: name.to_string(),
        object: Some(Arc::new(object)),
    }
}

fn cidrs_of(shared: &Shared, index: usize) -> Vec<String> {
    shared.proxiers[index]
        .trackers()
        .service_cidrs
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn service_cidrs_reach_each_family_as_a_union_until_deleted() {
    let (mut intake, shared, _registry) = dual_stack_intake(Duration::from_secs(60));
    intake.apply(service_cidr(
        "kubernetes",
        json!(["10.96.0.0/16", "fd00:96::/112"]),
    ));
    intake.apply(service_cidr("extra", json!(["10.100.0.0/16"])));
    assert_eq!(cidrs_of(&shared, 0), ["10.96.0.0/16", "10.100.0.0/16"]);
    assert_eq!(cidrs_of(&shared, 1), ["fd00:96::/112"]);
    // The same CIDR in two objects stays until both are gone (upstream's string set would
    // lose it with the first deletion).
    intake.apply(service_cidr("copy", json!(["10.96.0.0/16"])));
    intake.apply(Event::ServiceCidr {
        name: "kubernetes".into(),
        object: None,
    });
    assert_eq!(cidrs_of(&shared, 0), ["10.96.0.0/16", "10.100.0.0/16"]);
    assert!(cidrs_of(&shared, 1).is_empty());
    intake.apply(Event::ServiceCidr {
        name: "copy".into(),
        object: None,
    });
    assert_eq!(cidrs_of(&shared, 0), ["10.100.0.0/16"]);
}

#[test]
fn a_service_cidr_change_queues_a_sync_of_the_families_it_changes_only() {
    let timeout = Duration::from_millis(1);
    let (mut intake, shared, registry) = dual_stack_intake(timeout);
    shared.health.updated(); // the sync loops start
    intake.apply(service_cidr("kubernetes", json!(["10.96.0.0/16"])));
    let text = metrics_text(&registry);
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}"),
        "{text}"
    );
    assert!(
        !text.contains("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv6\"}"),
        "the IPv6 union did not change:\n{text}"
    );
    std::thread::sleep(timeout * 5);
    assert!(
        !shared.health.healthz().healthy,
        "the queued change was never synced"
    );
}

#[test]
fn an_unchanged_union_queues_nothing() {
    let timeout = Duration::from_millis(1);
    let (mut intake, shared, _registry) = dual_stack_intake(timeout);
    intake.apply(service_cidr("kubernetes", json!(["10.96.0.0/16"])));
    shared.health.updated(); // a sync applied it
    intake.apply(service_cidr("kubernetes", json!(["10.96.0.0/16"])));
    intake.apply(service_cidr("copy", json!(["10.96.0.0/16"])));
    std::thread::sleep(timeout * 5);
    assert!(shared.health.healthz().healthy, "nothing was queued");
}

#[test]
fn a_bad_service_cidr_entry_is_counted_and_a_rejected_object_counts_as_absent() {
    let (mut intake, shared, registry) = dual_stack_intake(Duration::from_secs(60));
    intake.apply(service_cidr(
        "kubernetes",
        json!(["10.96.0.0/16", "nope", "0.0.0.0/0"]),
    ));
    assert_eq!(cidrs_of(&shared, 0), ["10.96.0.0/16"]);
    let text = metrics_text(&registry);
    assert!(
        text.contains(
            "kubeproxy_ignored_values_total{kind=\"ServiceCIDR\",field=\"spec.cidrs\",reason=\"invalid_cidr\"} 2"
        ),
        "{text}"
    );
    // A version whose name the conversion refuses replaces nothing it could be confused with:
    // under its own (bad) name it is absent.
    intake.apply(service_cidr("Bad_Name", json!(["10.200.0.0/16"])));
    assert_eq!(cidrs_of(&shared, 0), ["10.96.0.0/16"]);
    let text = metrics_text(&registry);
    assert!(
        text.contains("kubeproxy_rejected_objects_total{kind=\"ServiceCIDR\""),
        "{text}"
    );
}
