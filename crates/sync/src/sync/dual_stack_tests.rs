//! The sync loop with one backend per IP family, as a dual-stack proxy runs it: each family
//! sees only its own objects, syncs on its own changes, reports under its own label and
//! health entry, and publishes what it programmed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpr_metrics::{Metrics, ProxyHealth};
use kpr_model::IpFamily;
use kpr_sources::{Event, EventSender, event_channel};
use kpr_state::{
    Backend, BackendError, DesiredState, FailedStep, SyncKind, SyncObserver, SyncReport, SyncRequest,
};
use kpr_world::ep;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::watch;

use crate::test_support::{metrics_text, service_event, settings, slice_event};
use crate::{FamilyBackend, run};

/// What one family's backend was asked to do.
#[derive(Debug, Default)]
struct Seen {
    /// Per sync: the cluster IPs of every service port, and the changed services.
    syncs: Vec<(Vec<String>, Vec<String>)>,
    /// Every sync fails while set.
    failing: bool,
}

struct Recording(Arc<Mutex<Seen>>);

impl Backend for Recording {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let mut seen = self.0.lock().unwrap();
        let ips = request
            .state
            .ports()
            .iter()
            .map(|p| p.cluster_ip.to_string())
            .collect();
        let changed = request.changed.iter().map(ToString::to_string).collect();
        seen.syncs.push((ips, changed));
        if seen.failing {
            return Err(BackendError::new(
                SyncKind::Full,
                FailedStep::Restore,
                "kernel said no",
            ));
        }
        Ok(SyncReport {
            full: true,
            ..SyncReport::default()
        })
    }
}

struct DualStack {
    v4: Arc<Mutex<Seen>>,
    v6: Arc<Mutex<Seen>>,
    events: EventSender,
    health: Arc<ProxyHealth>,
    registry: Registry,
    /// The cluster IPs of each state the IPv6 family programmed.
    v6_synced: watch::Receiver<Vec<String>>,
}

/// Publishes the cluster IPs of each state it is told about.
#[derive(Debug)]
struct ClusterIps(watch::Sender<Vec<String>>);

impl SyncObserver for ClusterIps {
    fn synced(
        &self,
        state: &DesiredState,
        _changed: Option<&std::collections::BTreeSet<kpr_model::NamespacedName>>,
    ) {
        let ips = state
            .ports()
            .iter()
            .map(|port| port.cluster_ip.to_string())
            .collect();
        self.0.send_replace(ips);
    }
}

/// A dual-stack proxy (IPv4 primary) waiting for the manifests source; the IPv6 backend
/// fails while `v6_failing`.
fn start(health_timeout: Duration, v6_failing: bool) -> DualStack {
    let v4 = Arc::new(Mutex::new(Seen::default()));
    let v6 = Arc::new(Mutex::new(Seen {
        failing: v6_failing,
        ..Seen::default()
    }));
    let (events, rx) = event_channel();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(health_timeout));
    let (v6_sender, v6_synced) = watch::channel(Vec::new());
    let backends = vec![
        FamilyBackend::new(IpFamily::V4, Box::new(Recording(v4.clone()))),
        FamilyBackend::new(IpFamily::V6, Box::new(Recording(v6.clone())))
            .observed_by(Arc::new(ClusterIps(v6_sender))),
    ];
    tokio::spawn(run(
        settings(vec!["manifests"]),
        backends,
        rx,
        metrics,
        health.clone(),
    ));
    DualStack {
        v4,
        v6,
        events,
        health,
        registry,
        v6_synced,
    }
}

/// Service `web`: 10.0.0.1 and fd00::1, port 80.
fn dual_stack_service() -> Event {
    service_event(
        "web",
        json!({"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1", "fd00::1"],
               "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
               "ports": [{"port": 80}]}),
    )
}

/// Service `v6only`: fd00::2 only.
fn ipv6_only_service() -> Event {
    service_event(
        "v6only",
        json!({"clusterIP": "fd00::2", "clusterIPs": ["fd00::2"], "ipFamilies": ["IPv6"],
               "ports": [{"port": 80}]}),
    )
}

fn slice(name: &str, family: &str, ip: &str) -> Event {
    slice_event(kpr_world::slice_object(
        name,
        "web",
        family,
        json!([{"port": 8080}]),
        vec![ep(ip)],
    ))
}

async fn wait_for(seen: &Arc<Mutex<Seen>>, syncs: usize) {
    for _ in 0..500 {
        if seen.lock().unwrap().syncs.len() >= syncs {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {syncs} syncs, saw {:?}", seen.lock().unwrap().syncs);
}

impl DualStack {
    async fn send(&self, event: Event) {
        self.events.send(event).await.unwrap();
    }

    /// Both families synced the initial state once.
    async fn started(events: Vec<Event>) -> Self {
        let proxy = start(Duration::from_secs(60), false);
        for event in events {
            proxy.send(event).await;
        }
        proxy.send(Event::Synced { source: "manifests" }).await;
        wait_for(&proxy.v4, 1).await;
        wait_for(&proxy.v6, 1).await;
        proxy
    }
}

#[tokio::test]
async fn each_family_programs_its_own_addresses_of_the_same_services() {
    let proxy = DualStack::started(vec![dual_stack_service(), ipv6_only_service()]).await;
    let v4 = proxy.v4.lock().unwrap().syncs[0].clone();
    let v6 = proxy.v6.lock().unwrap().syncs[0].clone();
    assert_eq!(
        v4,
        (vec!["10.0.0.1".to_string()], vec!["default/web".to_string()])
    );
    // Ports in name order: default/v6only, then default/web.
    assert_eq!(
        v6,
        (
            vec!["fd00::2".to_string(), "fd00::1".to_string()],
            vec!["default/v6only".to_string(), "default/web".to_string()]
        )
    );
}

#[tokio::test]
async fn a_change_of_one_family_syncs_only_that_family() {
    let proxy = DualStack::started(vec![dual_stack_service()]).await;
    proxy.send(slice("web-v6", "IPv6", "fd00:10:244::5")).await;
    wait_for(&proxy.v6, 2).await;
    assert_eq!(proxy.v6.lock().unwrap().syncs[1].1, ["default/web"]);
    // Give a wrongly woken IPv4 runner time to show itself (min interval 20 ms).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        proxy.v4.lock().unwrap().syncs.len(),
        1,
        "an IPv6 slice woke the IPv4 proxier"
    );
    let text = metrics_text(&proxy.registry);
    for line in [
        "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv6\"} 1",
        // Every Service event counts in every family, as upstream's proxiers count it.
        "kubeproxy_sync_proxy_rules_service_changes_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_service_changes_total{ip_family=\"IPv6\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    assert!(
        !text.contains("kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"}"),
        "{text}"
    );
}

#[tokio::test]
async fn an_object_both_families_reject_is_reported_once() {
    let bad = service_event("bad", json!({"clusterIP": "10.0.0.999", "ports": [{"port": 80}]}));
    let proxy = DualStack::started(vec![bad, dual_stack_service()]).await;
    let text = metrics_text(&proxy.registry);
    assert!(
        text.lines()
            .any(|l| l == "kubeproxy_rejected_objects_total{kind=\"Service\",reason=\"invalid_ip\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn each_family_publishes_the_state_it_programmed() {
    let mut proxy = DualStack::started(vec![dual_stack_service()]).await;
    let published = proxy
        .v6_synced
        .wait_for(|ips| !ips.is_empty())
        .await
        .unwrap()
        .clone();
    assert_eq!(published, ["fd00::1"]);
}

/// Upstream's per-family health: one family failing makes the proxy late although the other
/// keeps syncing, and the body says which family and why.
#[tokio::test]
async fn a_family_that_cannot_sync_makes_the_proxy_late() {
    let timeout = Duration::from_millis(50);
    let proxy = start(timeout, true);
    proxy.send(Event::Synced { source: "manifests" }).await;
    wait_for(&proxy.v6, 1).await;
    proxy.send(dual_stack_service()).await;
    wait_for(&proxy.v4, 2).await;
    let late = healthz_until(&proxy.health, false).await;
    assert_eq!(
        late.problem.as_deref(),
        Some("IPv6: last sync failed: kernel said no"),
        "{late:?}"
    );
    assert!(proxy.health.proxier_sync_problem(IpFamily::V4).is_none());

    // The next retry (the runner backs off from 1 s) succeeds.
    proxy.v6.lock().unwrap().failing = false;
    healthz_until(&proxy.health, true).await;
}

/// Polls `/healthz`'s answer until it is as `healthy` says (10 s at most).
async fn healthz_until(health: &ProxyHealth, healthy: bool) -> kpr_metrics::HealthReport {
    for _ in 0..1000 {
        let report = health.healthz();
        if report.healthy == healthy {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("healthz never became healthy={healthy}: {:?}", health.healthz());
}
