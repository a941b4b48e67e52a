//! The recorder against the in-repo test API server (the real wire protocol, the real
//! kube-rs client): what lands in the API, and that a slow, hung or absent API server never
//! makes the caller wait.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::events::v1::Event as ApiEvent;
use kpr_apiserver::TestApiServer;

use super::*;

/// A ceiling against hangs, not a speed check.
const FLUSH: Duration = Duration::from_secs(30);

async fn client_of(server: &TestApiServer) -> Client {
    let kubeconfig = ::kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml()).unwrap();
    let options = ::kube::config::KubeConfigOptions::default();
    let config = ::kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

async fn recorder_for(server: &TestApiServer, limits: Limits) -> KubeRecorder {
    KubeRecorder::with_limits(client_of(server).await, upstream_reporter("host-a"), limits)
}

/// A Warning about Service `shop/svc-<i>`: distinct objects never merge into a series.
fn service_event(i: usize) -> ProxyEvent {
    ProxyEvent {
        regarding: ObjectRef::service("shop", &format!("svc-{i}")),
        event_type: EventType::Warning,
        reason: "FailedToStartServiceHealthcheck",
        action: "Listen",
        note: format!("node node1 failed to start healthcheck \"shop/svc-{i}\" on port 3{i:04}"),
    }
}

fn reasons(server: &TestApiServer) -> Vec<String> {
    server
        .list::<ApiEvent>()
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn the_start_up_event_lands_on_the_node_as_upstream_writes_it() {
    let server = TestApiServer::start().await.unwrap();
    let recorder = recorder_for(&server, Limits::default()).await;
    recorder.record(ProxyEvent::starting("node1"));
    assert!(recorder.flush(FLUSH).await);

    let events = server.list::<ApiEvent>();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    // events.k8s.io/v1, in "default" (a Node has no namespace), named <object>.<nanos hex>.
    assert_eq!(event.metadata.namespace.as_deref(), Some("default"));
    let name = event.metadata.name.as_deref().unwrap();
    let suffix = name.strip_prefix("node1.").unwrap();
    assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(event.reason.as_deref(), Some("Starting"));
    assert_eq!(event.action.as_deref(), Some("StartKubeProxy"));
    assert_eq!(event.note, None);
    assert_eq!(event.reporting_controller.as_deref(), Some("kube-proxy"));
    assert_eq!(event.reporting_instance.as_deref(), Some("kube-proxy-host-a"));
    assert!(event.event_time.is_some());
    assert!(event.series.is_none());
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Node"));
    assert_eq!(regarding.name.as_deref(), Some("node1"));
    assert_eq!(regarding.uid.as_deref(), Some("node1"));
    assert_eq!(regarding.namespace, None);
    assert_eq!(regarding.api_version, None);
    // Upstream writes through the events.k8s.io API only.
    assert!(server.list::<k8s_openapi::api::core::v1::Event>().is_empty());
}

#[tokio::test]
async fn a_service_event_lands_in_the_services_namespace() {
    let server = TestApiServer::start().await.unwrap();
    let recorder = recorder_for(&server, Limits::default()).await;
    recorder.record(service_event(7));
    assert!(recorder.flush(FLUSH).await);

    let events = server.list::<ApiEvent>();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.action.as_deref(), Some("Listen"));
    assert_eq!(event.note.as_deref(), Some(service_event(7).note.as_str()));
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Service"));
    assert_eq!(regarding.api_version.as_deref(), Some("v1"));
    assert_eq!(regarding.namespace.as_deref(), Some("shop"));
    assert_eq!(regarding.name.as_deref(), Some("svc-7"));
}

#[tokio::test]
async fn a_repeated_event_becomes_a_series_on_the_first_one() {
    let server = TestApiServer::start().await.unwrap();
    let recorder = recorder_for(&server, Limits::default()).await;
    for _ in 0..3 {
        recorder.record(ProxyEvent::healthz_server_failed("node1", "address in use"));
    }
    assert!(recorder.flush(FLUSH).await);

    let events = server.list::<ApiEvent>();
    assert_eq!(events.len(), 1, "{events:#?}");
    let series = events[0].series.as_ref().unwrap();
    assert_eq!(series.count, 3);
}

#[tokio::test]
async fn a_hung_api_server_never_makes_the_caller_wait() {
    let server = TestApiServer::start().await.unwrap();
    let limits = Limits {
        queue: 4,
        publish_timeout: Duration::from_secs(300),
    };
    let recorder = recorder_for(&server, limits).await;
    server.pause();
    // Each call returns at once: the queue takes 4, at most one more is being written.
    let recorded = 50;
    for i in 0..recorded {
        recorder.record(service_event(i));
    }
    let dropped = recorder.dropped();
    assert!(dropped >= 50 - 4 - 1, "dropped {dropped}");

    server.resume();
    assert!(recorder.flush(FLUSH).await);
    let arrived = server.list::<ApiEvent>().len() as u64;
    assert_eq!(arrived, recorded as u64 - dropped, "every accepted event arrives");
}

#[tokio::test]
async fn a_write_that_hangs_is_given_up_and_later_events_still_go() {
    let server = TestApiServer::start().await.unwrap();
    let limits = Limits {
        queue: 4,
        publish_timeout: Duration::from_millis(200),
    };
    let recorder = recorder_for(&server, limits).await;
    server.pause();
    recorder.record(ProxyEvent::healthz_server_failed("node1", "address in use"));
    assert!(recorder.flush(FLUSH).await, "the hung write was not given up");

    server.resume();
    recorder.record(ProxyEvent::starting("node1"));
    assert!(recorder.flush(FLUSH).await);
    assert!(
        reasons(&server).contains(&"Starting".to_string()),
        "{:?}",
        reasons(&server)
    );
}

#[tokio::test]
async fn an_absent_api_server_costs_only_the_events_recorded_meanwhile() {
    let server = TestApiServer::start().await.unwrap();
    let recorder = recorder_for(&server, Limits::default()).await;
    server.stop().await;
    recorder.record(ProxyEvent::healthz_server_failed("node1", "address in use"));
    assert!(recorder.flush(FLUSH).await);

    server.restart().await.unwrap();
    recorder.record(ProxyEvent::starting("node1"));
    assert!(recorder.flush(FLUSH).await);
    assert_eq!(reasons(&server), ["Starting"]);
}

#[test]
fn long_notes_are_cut_to_the_apis_limit_at_a_character_boundary() {
    assert_eq!(within_note_limit("short"), "short");
    let ascii = "x".repeat(5000);
    assert_eq!(within_note_limit(&ascii).len(), NOTE_LIMIT_BYTES);
    // "é" is two bytes: byte 1024 falls inside the 513th one.
    let wide = format!("a{}", "é".repeat(1000));
    let cut = within_note_limit(&wide);
    assert_eq!(cut.len(), NOTE_LIMIT_BYTES - 1);
    assert!(wide.starts_with(cut));
}

#[test]
fn the_reporter_is_upstreams() {
    let reporter = upstream_reporter("worker-1.example");
    assert_eq!(reporter.controller, "kube-proxy");
    assert_eq!(reporter.instance.as_deref(), Some("kube-proxy-worker-1.example"));
}
