//! The healthz server: `/healthz` and `/livez` with upstream's codes, headers and JSON body.
//!
//! Load balancers probe `/healthz` to decide whether to send traffic to this node, so it must
//! fail both when the rules are stale and when the node is being deleted; kubelet probes
//! `/livez`, which must not fail for the node's sake or the pod would be restarted for nothing.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use kpr_metrics::{CodeLabels, HealthReport, Metrics, ProxyHealth};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::connections::Budget;
use crate::handle::{ServeError, ServerHandle};
use crate::limits::HttpLimits;
use crate::listen::{BindPolicy, start};

#[derive(Clone)]
struct Healthz {
    health: Arc<ProxyHealth>,
    metrics: Metrics,
}

/// Serves `/healthz` and `/livez` on `address` (e.g. "0.0.0.0:10256"; blank disables the
/// server) from a spawned task, binding as `policy` says, within `limits`
/// ([`HttpLimits::HEALTHZ`] in production).
pub async fn serve_healthz(
    address: &str,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    policy: BindPolicy,
    limits: HttpLimits,
) -> Result<Option<ServerHandle>, ServeError> {
    let budget = Budget::new("healthz", limits, &metrics);
    // Upstream's handlers answer whatever the method; probes use GET or HEAD.
    let router = Router::new()
        .route("/healthz", any(healthz))
        .route("/livez", any(livez))
        .with_state(Healthz { health, metrics });
    start(address, router, policy, budget).await
}

async fn healthz(State(s): State<Healthz>) -> Response {
    let report = s.health.healthz();
    count(&s.metrics.proxy_healthz_total, &report);
    answer(&report)
}

async fn livez(State(s): State<Healthz>) -> Response {
    let report = s.health.livez();
    count(&s.metrics.proxy_livez_total, &report);
    answer(&report)
}

fn count(family: &Family<CodeLabels, Counter>, report: &HealthReport) {
    let code = if report.healthy { "200" } else { "503" };
    family.get_or_create(&CodeLabels { code }).inc();
}

fn answer(report: &HealthReport) -> Response {
    let status = if report.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = (status, report.body()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::test_client::{get, request};

    const POLICY: BindPolicy = BindPolicy {
        hard_fail: true,
        retry_interval: Duration::from_millis(10),
    };

    async fn serve(health: Arc<ProxyHealth>) -> (ServerHandle, Registry) {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let handle = serve_healthz("127.0.0.1:0", health, metrics, POLICY, HttpLimits::HEALTHZ)
            .await
            .unwrap()
            .unwrap();
        (handle, registry)
    }

    fn encoded(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[tokio::test]
    async fn healthy_while_starting_with_upstreams_body_and_headers() {
        // Nothing has synced yet: upstream answers 200 while the proxy starts.
        let health = Arc::new(ProxyHealth::new(Duration::from_millis(1)));
        let (server, registry) = serve(health).await;
        let addr = server.local_addr().unwrap();
        let reply = get(addr, "/healthz").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["lastUpdated"], body["currentTime"]);
        assert_eq!(body["nodeEligible"], true);
        assert!(
            reply.body.starts_with("{\"lastUpdated\": \"") && reply.body.contains("\",\"currentTime\": \""),
            "upstream's spacing: {}",
            reply.body
        );
        let livez = get(addr, "/livez").await;
        assert_eq!(livez.status, 200);
        let body: serde_json::Value = serde_json::from_str(&livez.body).unwrap();
        assert_eq!(body.as_object().unwrap().len(), 2, "{}", livez.body);
        let text = encoded(&registry);
        assert!(
            text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_proxy_livez_total{code=\"200\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn late_sync_answers_503_on_both_paths_and_says_why() {
        let health = Arc::new(ProxyHealth::new(Duration::from_millis(1)));
        health.updated();
        health.queued_update();
        tokio::time::sleep(Duration::from_millis(5)).await;
        health.set_problem(Some("iptables-restore failed".into()));
        let (server, registry) = serve(health).await;
        let addr = server.local_addr().unwrap();
        let reply = get(addr, "/healthz").await;
        assert_eq!(reply.status, 503);
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body["problem"], "iptables-restore failed");
        assert_ne!(body["lastUpdated"], body["currentTime"]);
        assert_eq!(get(addr, "/livez").await.status, 503);
        let text = encoded(&registry);
        assert!(
            text.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_proxy_livez_total{code=\"503\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn ineligible_node_fails_healthz_but_not_livez() {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        health.updated();
        health.set_node_eligible(false);
        let (server, _registry) = serve(health).await;
        let addr = server.local_addr().unwrap();
        let reply = get(addr, "/healthz").await;
        assert_eq!(reply.status, 503);
        assert!(
            reply.body.ends_with(", \"nodeEligible\": false}"),
            "{}",
            reply.body
        );
        assert_eq!(get(addr, "/livez").await.status, 200);
    }

    #[tokio::test]
    async fn any_method_is_answered_as_upstream_does() {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let (server, _registry) = serve(health).await;
        let addr = server.local_addr().unwrap();
        assert_eq!(request(addr, "POST", "/healthz").await.status, 200);
        assert_eq!(request(addr, "HEAD", "/livez").await.status, 200);
        assert_eq!(get(addr, "/other").await.status, 404);
    }

    #[tokio::test]
    async fn blank_address_disables_and_bad_address_names_itself() {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let metrics = Metrics::new(&mut Registry::default());
        assert!(
            serve_healthz("", health.clone(), metrics.clone(), POLICY, HttpLimits::HEALTHZ)
                .await
                .unwrap()
                .is_none()
        );
        let err = serve_healthz("not-an-address", health, metrics, POLICY, HttpLimits::HEALTHZ)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not-an-address"), "{err}");
    }
}
