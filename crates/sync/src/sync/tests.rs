//! The sync loop against a recording backend: ordering and bookkeeping, not the kernel.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_metrics::{Metrics, ProxyHealth};
use kpr_model::ObjectKind;
use kpr_sources::{Event, EventSender, event_channel};
use kpr_state::{Backend, BackendError, FailedStep, SyncKind, SyncReport, SyncRequest, UnsafeObject};
use kpr_world::ep;
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::test_support::{FAMILY, metrics_text, service_event, settings, slice_event};
use crate::{FamilyBackend, Stopped, run};

#[derive(Debug, Default)]
struct Seen {
    /// Per sync: (number of service ports, changed services, forced full).
    syncs: Vec<(usize, Vec<String>, bool)>,
    /// How the next syncs fail, in order; then they succeed.
    failures: VecDeque<(SyncKind, FailedStep)>,
    /// Reported as newly left out by the next successful sync.
    unsafe_objects: Vec<UnsafeObject>,
    /// The failures are ones only the operator can fix (a map too small).
    needs_operator: bool,
}

struct Recording(Arc<Mutex<Seen>>);

impl Backend for Recording {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let mut seen = self.0.lock().unwrap();
        let changed = request.changed.iter().map(ToString::to_string).collect();
        seen.syncs
            .push((request.state.ports().len(), changed, request.force_full));
        if let Some((attempted, step)) = seen.failures.pop_front() {
            if seen.needs_operator {
                return Err(BackendError::needs_operator(attempted, step, "map too small"));
            }
            return Err(BackendError::new(attempted, step, "kernel said no"));
        }
        Ok(SyncReport {
            // Like a real backend: the first sync is full.
            full: seen.syncs.len() == 1,
            newly_unsafe: std::mem::take(&mut seen.unsafe_objects),
            ..SyncReport::default()
        })
    }
}

fn service(name: &str, ip: &str) -> Event {
    service_event(name, json!({"clusterIP": ip, "ports": [{"port": 80}]}))
}

/// Slice `name` of `service` with one ready endpoint on `ip` (port 8080).
fn slice_object(name: &str, service: &str, ip: &str) -> EndpointSlice {
    kpr_world::slice_object(name, service, "IPv4", json!([{"port": 8080}]), vec![ep(ip)])
}

fn slice(name: &str, service: &str, ip: &str) -> Event {
    slice_event(slice_object(name, service, ip))
}

struct Harness {
    seen: Arc<Mutex<Seen>>,
    events: EventSender,
    health: Arc<ProxyHealth>,
    registry: Registry,
}

/// A restore failure of the first (full) sync, as most tests want it.
const FULL_RESTORE: (SyncKind, FailedStep) = (SyncKind::Full, FailedStep::Restore);

fn start(sources: Vec<&'static str>, fail_first: usize) -> Harness {
    start_failing(sources, vec![FULL_RESTORE; fail_first])
}

fn start_failing(sources: Vec<&'static str>, failures: Vec<(SyncKind, FailedStep)>) -> Harness {
    let seen = Arc::new(Mutex::new(Seen {
        failures: failures.into(),
        ..Default::default()
    }));
    let (events, rx) = event_channel();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    tokio::spawn(run(
        settings(sources),
        vec![FamilyBackend::new(FAMILY, Box::new(Recording(seen.clone())))],
        rx,
        metrics,
        health.clone(),
    ));
    Harness {
        seen,
        events,
        health,
        registry,
    }
}

impl Harness {
    async fn send(&self, event: Event) {
        self.events.send(event).await.unwrap();
    }

    /// When the sync loop marked itself updated at its start (upstream's `SyncLoop`).
    async fn loop_started(&self) -> SystemTime {
        for _ in 0..500 {
            if let Some(at) = self.health.last_updated() {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the sync loop never marked itself updated");
    }

    async fn wait_for_syncs(&self, n: usize) {
        for _ in 0..500 {
            if self.seen.lock().unwrap().syncs.len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} syncs, saw {:?}", self.seen.lock().unwrap().syncs);
    }

    fn metrics_text(&self) -> String {
        metrics_text(&self.registry)
    }

    /// The metrics once `line` is among them (the sync loop records after the backend returns).
    async fn metrics_with(&self, line: &str) -> String {
        for _ in 0..500 {
            let text = self.metrics_text();
            if text.lines().any(|l| l == line) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never saw {line:?} in\n{}", self.metrics_text());
    }
}

/// The value of the metric line starting with `series ` (0 when absent).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

const SYNCS: &str = "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
const FULL_SYNCS: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";
const PARTIAL_SYNCS: &str = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}";

/// One successful full sync, then a change whose (partial) sync fails as `failure` says.
async fn partial_sync_failing(step: FailedStep) -> (Harness, String) {
    let h = start_failing(vec!["manifests"], Vec::new());
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    h.metrics_with(&format!("{FULL_SYNCS} 1")).await;
    h.seen
        .lock()
        .unwrap()
        .failures
        .push_back((SyncKind::Partial, step));
    h.send(slice("a-1", "a", "10.244.1.10")).await;
    h.wait_for_syncs(2).await;
    let text = h.metrics_with(&format!("{PARTIAL_SYNCS} 1")).await;
    (h, text)
}

#[tokio::test]
async fn no_sync_until_every_source_is_synced() {
    let h = start(vec!["manifests", "api"], 0);
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.send(service("b", "10.0.0.2")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        h.seen.lock().unwrap().syncs.is_empty(),
        "synced before the api source was in"
    );
    h.send(Event::Synced { source: "api" }).await;
    h.wait_for_syncs(1).await;
    let first = h.seen.lock().unwrap().syncs[0].clone();
    assert_eq!(first.0, 2, "first sync sees the whole initial state");
    assert_eq!(first.1, ["default/a", "default/b"]);
}

#[tokio::test]
async fn later_changes_are_incremental() {
    let h = start(vec!["manifests"], 0);
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    h.send(slice("a-1", "a", "10.244.1.10")).await;
    h.wait_for_syncs(2).await;
    assert_eq!(h.seen.lock().unwrap().syncs[1].1, ["default/a"]);
}

#[tokio::test]
async fn rejected_object_is_counted_and_others_still_sync() {
    let h = start(vec!["manifests"], 0);
    h.send(service("bad", "10.0.0.999")).await;
    h.send(service("good", "10.0.0.2")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    assert_eq!(h.seen.lock().unwrap().syncs[0].0, 1);
    let text = h.metrics_text();
    assert!(
        text.contains("kubeproxy_rejected_objects_total{kind=\"Service\",reason=\"invalid_ip\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn failed_sync_is_retried_and_reported() {
    let h = start(vec!["manifests"], 1);
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    // The sync loop's start counts as updated (upstream's SyncLoop); the failure does not.
    let started = h.health.last_updated().expect("set when the sync loop starts");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        h.health.last_updated(),
        Some(started),
        "a failed sync is no update"
    );
    // Backoff starts at 1 s (the floor for tiny min intervals).
    h.wait_for_syncs(2).await;
    let retried = h.health.last_updated().unwrap();
    assert!(retried > started, "retry succeeded");
    let text = h.metrics_text();
    assert_eq!(value(&text, SYNCS), 2.0, "both syncs are timed: {text}");
}

#[tokio::test]
async fn a_failed_partial_sync_is_timed_as_partial() {
    let (_h, text) = partial_sync_failing(FailedStep::Restore).await;
    assert_eq!(
        value(&text, SYNCS),
        2.0,
        "the failed sync's duration is observed too"
    );
    assert_eq!(value(&text, FULL_SYNCS), 1.0);
}

#[tokio::test]
async fn failed_full_sync_is_timed_as_full_and_not_a_partial_failure() {
    let h = start_failing(vec!["manifests"], vec![(SyncKind::Full, FailedStep::Other)]);
    let loop_started = h.loop_started().await;
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    let text = h.metrics_with(&format!("{FULL_SYNCS} 1")).await;
    assert_eq!(value(&text, SYNCS), 1.0, "{text}");
    assert_eq!(value(&text, PARTIAL_SYNCS), 0.0, "{text}");
    assert_eq!(
        h.health.last_updated(),
        Some(loop_started),
        "a failed sync is no update"
    );
    let why = h.health.proxier_sync_problem(FAMILY).unwrap();
    assert!(why.contains("kernel said no"), "{why}");
}

#[tokio::test]
async fn objects_the_backend_left_out_are_logged_and_counted_as_unsafe_text() {
    let h = start(vec!["manifests"], 0);
    h.seen.lock().unwrap().unsafe_objects.push(UnsafeObject {
        kind: ObjectKind::Service,
        object: "default/evil".into(),
        field: "metadata.name".into(),
        detail: "contains the control character '\\n' at byte 4".into(),
    });
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    let line = "kubeproxy_rejected_objects_total{kind=\"Service\",reason=\"unsafe_text\"} 1";
    h.metrics_with(line).await;
    h.send(slice("a-1", "a", "10.244.1.10")).await;
    h.wait_for_syncs(2).await;
    let text = h.metrics_with(&format!("{PARTIAL_SYNCS} 1")).await;
    assert!(text.lines().any(|l| l == line), "still counted once:\n{text}");
}

fn annotated_slice(ip: &str, trigger: jiff::Timestamp) -> Event {
    let mut object = slice_object("a-1", "a", ip);
    object.metadata.annotations = Some(
        [(
            kpr_model::LAST_CHANGE_TRIGGER_TIME_ANNOTATION.to_string(),
            trigger.to_string(),
        )]
        .into(),
    );
    slice_event(object)
}

#[tokio::test]
async fn endpoint_trigger_times_become_network_programming_latency() {
    let h = start(vec!["manifests"], 0);
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    let trigger = jiff::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    h.send(annotated_slice("10.244.1.10", trigger)).await;
    h.wait_for_syncs(2).await;
    // A change from before the proxy started (e.g. in the initial list) is not a sample.
    let long_ago = trigger - jiff::SignedDuration::from_hours(1);
    h.send(annotated_slice("10.244.1.11", long_ago)).await;
    h.wait_for_syncs(3).await;

    let text = h.metrics_text();
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("kubeproxy_network_programming_duration_seconds"))
        .collect();
    let count = "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 1";
    assert!(samples.contains(&count), "{samples:#?}");
    // 1.2 s and a bit: above the 1 s bucket, within the 2 s one.
    assert!(
        samples
            .iter()
            .any(|l| l.contains("le=\"1.0\"") && l.ends_with(" 0")),
        "{samples:#?}"
    );
    assert!(
        samples
            .iter()
            .any(|l| l.contains("le=\"2.0\"") && l.ends_with(" 1")),
        "{samples:#?}"
    );
}

#[tokio::test]
async fn source_trouble_is_shown_by_health_when_late() {
    let h = start(vec!["manifests", "api"], 0);
    h.send(Event::SourceTrouble {
        source: "api",
        problem: Some("connection refused".into()),
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Not late yet (timeout 60 s), so healthy and no problem shown; the text is kept.
    assert!(h.health.healthz().healthy);
    assert!(h.health.problem().unwrap().contains("connection refused"));
}

#[tokio::test]
async fn the_sync_loop_start_counts_as_updated_and_queued_as_upstreams() {
    let h = start(vec!["manifests", "api"], 0);
    // No source is in yet: nothing has synced, but the loop has started.
    for _ in 0..500 {
        if h.health.last_updated().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(h.health.last_updated().is_some(), "not marked updated at start");
    assert!(h.health.healthz().healthy);
    assert!(h.seen.lock().unwrap().syncs.is_empty());
    let text = h.metrics_text();
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}"),
        "{text}"
    );
}

/// A backend whose every sync ran a conntrack reconcile that deleted 3 entries.
struct Reconciling(Arc<Mutex<usize>>);

impl Backend for Reconciling {
    fn sync(&mut self, _request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        *self.0.lock().unwrap() += 1;
        Ok(SyncReport {
            conntrack_reconcile: Some(kpr_state::ConntrackReconcile {
                deleted: 3,
                duration: Duration::from_millis(3),
            }),
            ..SyncReport::default()
        })
    }
}

#[tokio::test]
async fn conntrack_reconciles_are_counted_and_timed_as_upstream() {
    let syncs = Arc::new(Mutex::new(0));
    let (events, rx) = event_channel();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    tokio::spawn(run(
        settings(vec!["manifests"]),
        vec![FamilyBackend::new(FAMILY, Box::new(Reconciling(syncs.clone())))],
        rx,
        metrics,
        health,
    ));
    events.send(service("a", "10.0.0.1")).await.unwrap();
    events.send(Event::Synced { source: "manifests" }).await.unwrap();
    // The metrics are recorded right after the backend returns: wait for them.
    let mut text = String::new();
    for _ in 0..500 {
        text = metrics_text(&registry);
        if text.contains("kubeproxy_conntrack_reconciler_sync_duration_seconds_count") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*syncs.lock().unwrap(), 1, "one sync");
    for line in [
        "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 3",
        "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le=\"0.004\",ip_family=\"IPv4\"} 1",
        "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"} 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

/// Remembers, per call, the services of the state it was told about, and the changed
/// Services it was given (`None`: everything may have changed).
#[derive(Debug, Default)]
struct AfterSync(Mutex<Vec<Vec<String>>>, Mutex<Vec<Option<Vec<String>>>>);

impl kpr_state::SyncObserver for AfterSync {
    fn synced(
        &self,
        state: &kpr_state::DesiredState,
        changed: Option<&std::collections::BTreeSet<kpr_model::NamespacedName>>,
    ) {
        let mut services: Vec<String> = state.services.keys().map(ToString::to_string).collect();
        services.sort();
        self.0.lock().unwrap().push(services);
        self.1
            .lock()
            .unwrap()
            .push(changed.map(|c| c.iter().map(ToString::to_string).collect()));
    }
}

/// The health-check servers follow what the rules say: they hear of each successful sync,
/// with the whole state, and of no failed one.
#[tokio::test]
async fn the_after_sync_observer_hears_successful_syncs_only() {
    let seen = Arc::new(Mutex::new(Seen {
        failures: [FULL_RESTORE].into(),
        ..Default::default()
    }));
    let observer = Arc::new(AfterSync::default());
    let (events, rx) = event_channel();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    tokio::spawn(run(
        settings(vec!["manifests"]),
        vec![FamilyBackend::new(FAMILY, Box::new(Recording(seen.clone()))).observed_by(observer.clone())],
        rx,
        metrics,
        health.clone(),
    ));
    let h = Harness {
        seen,
        events,
        health,
        registry,
    };
    h.send(service("a", "10.0.0.1")).await;
    h.send(Event::Synced { source: "manifests" }).await;
    h.wait_for_syncs(1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(observer.0.lock().unwrap().is_empty(), "told about a failed sync");
    // The retry (after the 1 s backoff) succeeds; then a change syncs partially.
    h.wait_for_syncs(2).await;
    h.send(service("b", "10.0.0.2")).await;
    h.wait_for_syncs(3).await;
    for _ in 0..500 {
        if observer.0.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        *observer.0.lock().unwrap(),
        [vec!["default/a"], vec!["default/a", "default/b"]],
        "one call per successful sync, each with the whole state"
    );
    assert_eq!(
        *observer.1.lock().unwrap(),
        [None, Some(vec!["default/b".to_string()])],
        "after a failed sync the observer hears of everything; after a partial one, of its changes"
    );
}

/// A backend failing as only the operator can fix, at the `fail_at`th sync (1-based).
async fn needing_the_operator_at(
    fail_at: usize,
) -> (Arc<Mutex<Seen>>, EventSender, tokio::task::JoinHandle<Stopped>) {
    let seen = Arc::new(Mutex::new(Seen {
        needs_operator: true,
        ..Default::default()
    }));
    if fail_at == 1 {
        seen.lock().unwrap().failures.push_back(FULL_RESTORE);
    }
    let (events, rx) = event_channel();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let stopped = tokio::spawn(run(
        settings(vec!["manifests"]),
        vec![FamilyBackend::new(FAMILY, Box::new(Recording(seen.clone())))],
        rx,
        metrics,
        health,
    ));
    (seen, events, stopped)
}

#[tokio::test]
async fn a_first_sync_only_the_operator_can_fix_stops_the_proxy_with_its_message() {
    let (_seen, events, stopped) = needing_the_operator_at(1).await;
    events.send(service("a", "10.0.0.1")).await.unwrap();
    events.send(Event::Synced { source: "manifests" }).await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("the proxy stops")
        .unwrap();
    assert_eq!(stopped, Stopped::Fatal("map too small".to_owned()));
}

#[tokio::test]
async fn the_same_failure_after_a_successful_sync_is_retried() {
    let (seen, events, stopped) = needing_the_operator_at(2).await;
    events.send(service("a", "10.0.0.1")).await.unwrap();
    events.send(Event::Synced { source: "manifests" }).await.unwrap();
    for _ in 0..500 {
        if seen.lock().unwrap().syncs.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    seen.lock()
        .unwrap()
        .failures
        .push_back((SyncKind::Partial, FailedStep::Restore));
    events.send(service("b", "10.0.0.2")).await.unwrap();
    // The failed sync, then its retry (backoff starts at 1 s).
    for _ in 0..500 {
        if seen.lock().unwrap().syncs.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.lock().unwrap().syncs.len(), 3, "failed, then retried");
    assert!(!stopped.is_finished(), "the proxy keeps running");
    stopped.abort();
}
