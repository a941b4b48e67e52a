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
use axum::routing::get;
use kpr_metrics::{CodeLabels, HealthReport, Metrics, ProxyHealth};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::handle::{ServeError, ServerHandle};
use crate::listen::{bind, spawn};

#[derive(Clone)]
struct Healthz {
    health: Arc<ProxyHealth>,
    metrics: Metrics,
}

/// Binds `address` (e.g. "0.0.0.0:10256"; blank disables the server) and serves on a task.
pub async fn bind_healthz(
    address: &str,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
) -> Result<Option<ServerHandle>, ServeError> {
    let Some(listener) = bind("healthz", address).await? else {
        return Ok(None);
    };
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .with_state(Healthz { health, metrics });
    spawn("healthz", listener, router).map(Some)
}

async fn healthz(State(s): State<Healthz>) -> Response {
    let report = s.health.healthz();
    count(&s.metrics.proxy_healthz_total, &report);
    answer(report)
}

async fn livez(State(s): State<Healthz>) -> Response {
    let report = s.health.livez();
    count(&s.metrics.proxy_livez_total, &report);
    answer(report)
}

fn count(family: &Family<CodeLabels, Counter>, report: &HealthReport) {
    let code = if report.healthy { "200" } else { "503" };
    family.get_or_create(&CodeLabels { code }).inc();
}

fn answer(report: HealthReport) -> Response {
    let status = if report.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    // Serializing a struct of strings and bools cannot fail; an empty body would still carry the status.
    let body = serde_json::to_string(&report).unwrap_or_default();
    let mut response = (status, body).into_response();
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
    use crate::test_client::get;

    async fn serve(health: Arc<ProxyHealth>) -> (ServerHandle, Metrics, Registry) {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let handle = bind_healthz("127.0.0.1:0", health, metrics.clone())
            .await
            .unwrap()
            .unwrap();
        (handle, metrics, registry)
    }

    #[tokio::test]
    async fn healthy_proxy_answers_200_with_upstream_json() {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        health.updated();
        let (server, _metrics, registry) = serve(health).await;
        let reply = get(server.local_addr(), "/healthz").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert!(body["lastUpdated"].as_str().unwrap().ends_with('Z'));
        assert!(body["currentTime"].is_string());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn late_sync_answers_503_on_both_paths() {
        let health = Arc::new(ProxyHealth::new(Duration::from_millis(1)));
        tokio::time::sleep(Duration::from_millis(5)).await;
        health.set_problem(Some("iptables-restore failed".into()));
        let (server, _metrics, _registry) = serve(health).await;
        let reply = get(server.local_addr(), "/healthz").await;
        assert_eq!(reply.status, 503);
        assert!(reply.body.contains("iptables-restore failed"), "{}", reply.body);
        assert_eq!(get(server.local_addr(), "/livez").await.status, 503);
    }

    #[tokio::test]
    async fn node_going_away_fails_healthz_but_not_livez() {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        health.updated();
        health.set_node_going_away(true);
        let (server, _metrics, _registry) = serve(health).await;
        assert_eq!(get(server.local_addr(), "/healthz").await.status, 503);
        assert_eq!(get(server.local_addr(), "/livez").await.status, 200);
    }

    #[tokio::test]
    async fn blank_address_disables_and_bad_address_names_itself() {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let metrics = Metrics::new(&mut Registry::default());
        assert!(
            bind_healthz("", health.clone(), metrics.clone())
                .await
                .unwrap()
                .is_none()
        );
        let err = bind_healthz("not-an-address", health, metrics).await.unwrap_err();
        assert!(err.to_string().contains("not-an-address"), "{err}");
    }
}
