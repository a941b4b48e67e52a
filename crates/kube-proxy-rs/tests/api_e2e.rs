//! kube-proxy-rs against the in-repo test API server (the real wire protocol, the real kube-rs
//! client), on the real kernel: the API server listens inside the node namespace, the proxy
//! runs there with `--kubeconfig`, pods serve real TCP, and the test edits objects through the
//! server while sending traffic through the Service VIPs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_netns::{eventually, pod_ip};
use serde_json::json;
use support::api::ApiCluster;
use support::*;

/// What these tests add to the shared API lab.
trait ApiClusterExt {
    fn serving_web(pods: usize, backends: &[usize], endpoints: &[usize]) -> Self;
    fn restart_api(&self);
    fn stop_api(&self);
}

impl ApiClusterExt for ApiCluster {
    /// [`ApiCluster::new`] with TCP backends on port 8080 in `backends`, and the API server
    /// holding Service `web` (on `WEB_VIP`) with ready endpoints on `endpoints`.
    fn serving_web(pods: usize, backends: &[usize], endpoints: &[usize]) -> Self {
        let mut c = Self::new(pods);
        c.cluster.tcp_backends(backends, 8080);
        c.api.apply(&web_service(json!({}), "web", "10.96.0.10")).unwrap();
        c.api.apply(&web_slice("web", endpoints)).unwrap();
        c
    }

    fn restart_api(&self) {
        self.cluster
            .node()
            .run(|| self.runtime.block_on(self.api.restart()))
            .unwrap();
    }

    fn stop_api(&self) {
        self.runtime.block_on(self.api.stop());
    }
}

fn web_service(labels: serde_json::Value, name: &str, ip: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    }))
    .unwrap()
}

/// A slice for `service` with ready endpoints on `pods`, stamped with the trigger time the
/// endpoint-slice controller would set (now), for the network-programming latency.
fn web_slice(service: &str, pods: &[usize]) -> EndpointSlice {
    let endpoints: Vec<_> = pods
        .iter()
        .map(|&i| json!({"addresses": [pod_ip(i).to_string()], "conditions": {"ready": true}, "nodeName": NODE_NAME}))
        .collect();
    let now = jiff::Timestamp::now().to_string();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-abc"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": now}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .unwrap()
}

#[test]
fn services_from_the_api_follow_creates_scales_and_deletes() {
    let mut c = ApiCluster::serving_web(4, &[0, 1, 2], &[0]);
    c.start_proxy(&[]);
    let client = c.cluster.lab.pod(3);
    wait_spread(client, sock(WEB_VIP), 20, &["pod0"]);

    c.api.apply(&web_slice("web", &[0, 1, 2])).unwrap();
    let counts = wait_spread(client, sock(WEB_VIP), 300, &["pod0", "pod1", "pod2"]);
    assert_fair(&counts);

    c.api.apply(&web_slice("web", &[1])).unwrap();
    wait_spread(client, sock(WEB_VIP), 20, &["pod1"]);

    c.api.delete::<Service>("default", "web").unwrap();
    c.api.delete::<EndpointSlice>("default", "web-abc").unwrap();
    eventually(CONVERGE, POLL, || {
        let rules = c.cluster.iptables_save();
        (!rules.contains("10.96.0.10")).then_some(()).ok_or(rules)
    });

    // The latency samples of this run: every endpoint change above was stamped "now".
    let histogram = programming_latency(&c.cluster);
    println!("network programming latency: {histogram}");
    assert!(histogram.count >= 2, "{histogram}");
}

#[test]
fn rules_survive_an_api_outage_and_new_changes_apply_after_it() {
    let mut c = ApiCluster::serving_web(3, &[0, 1], &[0]);
    c.start_proxy(&["--iptables-sync-period=2s"]);
    let client = c.cluster.lab.pod(2);
    wait_spread(client, sock(WEB_VIP), 10, &["pod0"]);

    c.stop_api();
    // Longer than the health timeout (2 x sync period): rules stay, traffic keeps flowing.
    std::thread::sleep(Duration::from_secs(5));
    let during = kpr_netns::spread(client, sock(WEB_VIP), 50);
    assert_eq!(
        during,
        BTreeMap::from([("pod0".to_string(), 50)]),
        "during the outage"
    );

    // Changes made while the server is down arrive once it is back.
    c.api.apply(&web_slice("web", &[1])).unwrap();
    c.restart_api();
    wait_spread(client, sock(WEB_VIP), 20, &["pod1"]);
    c.cluster.wait_healthz(200);
}

#[test]
fn a_forced_relist_keeps_every_connection_working() {
    let mut c = ApiCluster::serving_web(3, &[0, 1], &[0, 1]);
    c.start_proxy(&[]);
    let client = c.cluster.lab.pod(2);
    wait_spread(client, sock(WEB_VIP), 10, &["pod0", "pod1"]);
    let lists_before = c
        .api
        .requests()
        .iter()
        .filter(|r| r.is_list_of("/api/v1/services"))
        .count();

    // Traffic runs the whole time; every request must be answered.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let counts = kpr_netns::spread(client, sock(WEB_VIP), 10);
                failures.extend(counts.into_iter().filter(|(k, _)| k.starts_with("error")));
            }
            failures
        });
        // Forget history and cut the watches: the watchers' resume gets 410 Gone and relists.
        c.api.compact();
        c.api.drop_watches();
        eventually(CONVERGE, POLL, || {
            let lists = c
                .api
                .requests()
                .iter()
                .filter(|r| r.is_list_of("/api/v1/services"))
                .count();
            (lists > lists_before)
                .then_some(())
                .ok_or(format!("{lists} lists"))
        });
        // A change after the relist still arrives.
        c.api.apply(&web_slice("web", &[1])).unwrap();
        wait_spread(client, sock(WEB_VIP), 10, &["pod1"]);
        stop.store(true, Ordering::Relaxed);
        traffic.join().unwrap()
    });
    assert!(
        failures.is_empty(),
        "requests failed across the relist: {failures:?}"
    );
}

#[test]
fn services_of_another_proxy_get_no_rules() {
    let mut c = ApiCluster::new(2);
    c.cluster.tcp_backends(&[0], 8080);
    let other = json!({"service.kubernetes.io/service-proxy-name": "someone-else"});
    c.api.apply(&web_service(other, "theirs", "10.96.0.99")).unwrap();
    c.api.apply(&web_slice("theirs", &[0])).unwrap();
    c.api.apply(&web_service(json!({}), "web", "10.96.0.10")).unwrap();
    c.api.apply(&web_slice("web", &[0])).unwrap();
    c.start_proxy(&[]);
    wait_spread(c.cluster.lab.pod(1), sock(WEB_VIP), 5, &["pod0"]);
    let rules = c.cluster.iptables_save();
    assert!(!rules.contains("10.96.0.99"), "{rules}");
    assert!(!rules.contains("default/theirs"), "{rules}");
    // The filtering is the server's: the watch asked for it with a label selector.
    let asked = c
        .api
        .requests()
        .iter()
        .filter(|r| r.is_watch() && r.path.contains("services"))
        .any(|r| {
            r.param("labelSelector")
                .is_some_and(|s| s.contains("!service.kubernetes.io/service-proxy-name"))
        });
    assert!(asked, "{:#?}", c.api.requests());
}

#[test]
fn an_unreachable_api_server_at_start_up_is_healthy_until_a_queued_change_is_late() {
    let mut c = ApiCluster::serving_web(2, &[0], &[0]);
    c.stop_api();
    c.start_proxy(&["--iptables-sync-period=1s"]);
    // Upstream's start-up: healthy while waiting for the initial lists, however long (here
    // past the 2 s health timeout); the log says what it waits for.
    eventually(CONVERGE, POLL, || {
        let logs = c.cluster.proxy_logs();
        (logs.matches("source=\"api\"").count() >= 2)
            .then_some(())
            .ok_or(logs)
    });
    std::thread::sleep(Duration::from_secs(3));
    let (status, body) = c.cluster.get(HEALTHZ, "/healthz").unwrap();
    assert_eq!(status, 200, "waiting for the initial lists is healthy: {body}");
    assert_eq!(c.cluster.get(HEALTHZ, "/livez").unwrap().0, 200);
    assert!(
        !c.cluster.iptables_save().contains("KUBE-SVC-"),
        "rules before the initial list"
    );

    c.restart_api();
    let client = c.cluster.lab.pod(1);
    wait_spread(client, sock(WEB_VIP), 10, &["pod0"]);
    c.cluster.wait_healthz(200);

    // A change that cannot be applied (someone else's rule holds our chain) turns it 503
    // once it is late, saying why, and it recovers when the change goes through.
    let svc_chain = c.cluster.first_service_chain();
    c.cluster.hold_chain(&svc_chain);
    c.api.delete::<Service>("default", "web").unwrap();
    let body = c.cluster.wait_healthz(503);
    assert!(body.contains("\"problem\""), "{body}");
    c.cluster.release_chain();
    c.cluster.wait_healthz(200);
}

#[test]
fn a_drained_node_is_ineligible_then_its_deletion_restarts_the_proxy_and_the_rules_stay() {
    let mut c = ApiCluster::serving_web(2, &[0], &[0]);
    c.api.apply(&node_object(json!([]))).unwrap();
    c.start_proxy(&[]);
    let client = c.cluster.lab.pod(1);
    wait_spread(client, sock(WEB_VIP), 5, &["pod0"]);
    c.cluster.wait_healthz(200);

    // The cluster autoscaler marks the node, then deletes it.
    let taint = json!([{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]);
    c.api.apply(&node_object(taint)).unwrap();
    let body = c.cluster.wait_healthz(503);
    assert!(body.ends_with("\"nodeEligible\": false}"), "{body}");
    c.api.delete::<Node>("", NODE_NAME).unwrap();
    // 1.37's NodeManager (k/k #138183): the proxy exits with status 1 and leaves its
    // rules for the restarted process to adopt.
    let proxy = c.cluster.proxy.as_mut().unwrap();
    let status = eventually(CONVERGE, POLL, || match proxy.try_wait() {
        Ok(Some(status)) => Ok(status),
        other => Err(format!("still running: {other:?}")),
    });
    assert_eq!(status.code(), Some(1), "{status:?}");
    let logs = c.cluster.proxy_logs();
    assert!(logs.contains("Node is being deleted"), "{logs}");
    wait_spread(client, sock(WEB_VIP), 5, &["pod0"]);
}

/// The `kubeproxy_network_programming_duration_seconds` histogram, with p50/p99 read off
/// its buckets (the upper bound of the bucket holding the quantile, as Prometheus would).
struct Latency {
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl Latency {
    fn quantile(&self, q: f64) -> f64 {
        let rank = (q * self.count as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank.max(1))
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} samples, p50 <= {} s, p99 <= {} s",
            self.count,
            self.quantile(0.5),
            self.quantile(0.99)
        )
    }
}

fn programming_latency(cluster: &Cluster) -> Latency {
    let (_, body) = cluster.get(METRICS, "/metrics").unwrap();
    let name = "kubeproxy_network_programming_duration_seconds";
    let mut buckets = Vec::new();
    let mut count = 0;
    for line in body.lines().filter(|l| l.starts_with(name)) {
        let value: u64 = line.rsplit(' ').next().unwrap().parse().unwrap_or(0);
        if let Some(labels) = line.strip_prefix(&format!("{name}_bucket{{")) {
            // `le` is the last label in the text format, as upstream writes it.
            let le = labels
                .split(',')
                .find_map(|pair| pair.strip_prefix("le=\""))
                .and_then(|rest| rest.split('"').next())
                .unwrap();
            buckets.push((le.parse().unwrap_or(f64::INFINITY), value));
        } else if line.starts_with(&format!("{name}_count")) {
            count = value;
        }
    }
    Latency { count, buckets }
}

/// Waits until `n` connections from `ns` to `addr` all fail (the Service is not served:
/// its cluster IP has no rule left, so nothing answers).
fn wait_down(ns: &kpr_netns::Netns, addr: std::net::SocketAddr) {
    eventually(CONVERGE, POLL, || {
        let counts = kpr_netns::spread(ns, addr, 1);
        if counts.keys().all(|reply| reply.starts_with("error")) {
            Ok(())
        } else {
            Err(format!("{addr} should be down: {counts:?}"))
        }
    });
}

/// Upstream's `service.kubernetes.io/<label>` scenarios (service.go): a Service created with
/// `label` is never served; a Service created without it is served, then not while it has
/// the label, then again. The proxy's watches leave labelled objects out, and the API server
/// reports an object that gains the label as deleted and one that loses it as added.
fn a_labelled_service_is_left_to_another_proxy(label: serde_json::Value) {
    let mut c = ApiCluster::new(3);
    c.cluster.tcp_backends(&[0, 1], 8080);
    c.api
        .apply(&web_service(label.clone(), "disabled", "10.96.0.98"))
        .unwrap();
    c.api.apply(&web_slice("disabled", &[0])).unwrap();
    c.api
        .apply(&web_service(json!({}), "toggled", "10.96.0.99"))
        .unwrap();
    c.api.apply(&web_slice("toggled", &[1])).unwrap();
    c.start_proxy(&[]);
    let (client, disabled, toggled) = (c.cluster.lab.pod(2), sock("10.96.0.98:80"), sock("10.96.0.99:80"));
    wait_spread(client, toggled, 10, &["pod1"]);
    wait_down(client, disabled);

    c.api.apply(&web_service(label, "toggled", "10.96.0.99")).unwrap();
    wait_down(client, toggled);

    c.api
        .apply(&web_service(json!({}), "toggled", "10.96.0.99"))
        .unwrap();
    wait_spread(client, toggled, 10, &["pod1"]);
    wait_down(client, disabled);
}

#[test]
fn should_implement_service_kubernetes_io_service_proxy_name() {
    a_labelled_service_is_left_to_another_proxy(
        json!({"service.kubernetes.io/service-proxy-name": "foo-bar"}),
    );
}

#[test]
fn should_implement_service_kubernetes_io_headless() {
    a_labelled_service_is_left_to_another_proxy(json!({"service.kubernetes.io/headless": ""}));
}
