//! The metrics server: `/metrics`, `/proxyMode`, `/configz` and a plain `/healthz`.
//!
//! Upstream serves these on 127.0.0.1:10249 by default; scrapers and `curl .../proxyMode`
//! scripts rely on the paths and on `/healthz` here answering a bare "ok" (see [`crate::ping`]).
//! As upstream's Go mux, every path answers any method, and the text answers carry
//! `X-Content-Type-Options: nosniff` as upstream's handlers set it.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use prometheus_client::registry::Registry;

use crate::handle::{ServeError, ServerHandle};
use crate::listen::{BindPolicy, start};
use crate::ping;

/// The key `/configz` puts the configuration under, as upstream does.
pub const CONFIGZ_GROUP: &str = "kubeproxy.config.k8s.io";

/// What Prometheus expects for the text exposition prometheus-client writes.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct MetricsState {
    registry: Arc<Registry>,
    proxy_mode: Arc<str>,
    configz: Arc<str>,
}

/// Serves on `address` (e.g. "127.0.0.1:10249"; blank disables it) from a spawned task,
/// binding as `policy` says. `config` is the effective KubeProxyConfiguration, shown by
/// `/configz`.
pub async fn serve_metrics(
    address: &str,
    registry: Arc<Registry>,
    proxy_mode: &str,
    config: serde_json::Value,
    policy: BindPolicy,
) -> Result<Option<ServerHandle>, ServeError> {
    let configz = serde_json::json!({ CONFIGZ_GROUP: config }).to_string();
    let state = MetricsState {
        registry,
        proxy_mode: proxy_mode.into(),
        configz: configz.into(),
    };
    let router = Router::new()
        .route("/metrics", any(metrics))
        .route("/proxyMode", any(proxy_mode_handler))
        .route("/configz", any(configz_handler))
        .route("/healthz", any(ping::healthz))
        .route("/healthz/ping", any(ping::ping))
        .with_state(state);
    start("metrics", address, router, policy).await
}

async fn metrics(State(s): State<MetricsState>) -> Response {
    let mut text = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &s.registry) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}"),
        )
            .into_response();
    }
    with_content_type(text.into_response(), OPENMETRICS_CONTENT_TYPE)
}

/// Upstream's handler: the mode name, plain text, not to be sniffed.
async fn proxy_mode_handler(State(s): State<MetricsState>) -> Response {
    nosniff(with_content_type(
        s.proxy_mode.to_string().into_response(),
        "text/plain; charset=utf-8",
    ))
}

async fn configz_handler(State(s): State<MetricsState>) -> Response {
    nosniff(with_content_type(
        s.configz.to_string().into_response(),
        "application/json",
    ))
}

fn with_content_type(mut response: Response, content_type: &'static str) -> Response {
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn nosniff(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kpr_metrics::Metrics;

    use super::*;
    use crate::test_client::{get, request};

    /// Retries fast, so a test does not wait upstream's 5 s.
    fn retrying() -> BindPolicy {
        BindPolicy {
            hard_fail: false,
            retry_interval: Duration::from_millis(20),
        }
    }

    async fn serve_on(address: &str, policy: BindPolicy) -> Result<Option<ServerHandle>, ServeError> {
        serve_metrics(
            address,
            Arc::new(Registry::default()),
            "iptables",
            serde_json::Value::Null,
            policy,
        )
        .await
    }

    /// A ceiling against hangs, not a speed check.
    async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(30), future)
            .await
            .expect("hung")
    }

    #[tokio::test]
    async fn serves_metrics_mode_configz_and_healthz() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        metrics
            .sync_proxy_rules_service_changes_total
            .get_or_create(&kpr_metrics::FamilyLabels { ip_family: "IPv4" })
            .inc();
        let config = serde_json::json!({"mode": "iptables"});
        let server = serve_metrics("127.0.0.1:0", Arc::new(registry), "iptables", config, retrying())
            .await
            .unwrap()
            .unwrap();
        let addr = server.local_addr().unwrap();

        let reply = get(addr, "/metrics").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-type"), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(
            reply
                .body
                .contains("kubeproxy_sync_proxy_rules_service_changes_total"),
            "{}",
            reply.body
        );

        assert_eq!(get(addr, "/proxyMode").await.body, "iptables");
        assert_eq!(get(addr, "/healthz").await.body, "ok");
        let configz: serde_json::Value = serde_json::from_str(&get(addr, "/configz").await.body).unwrap();
        assert_eq!(configz[CONFIGZ_GROUP]["mode"], "iptables");
        assert_eq!(get(addr, "/nope").await.status, 404);
    }

    /// Upstream's handlers set these headers; scripts and browsers see the same answers.
    #[tokio::test]
    async fn text_answers_carry_upstreams_headers() {
        let server = serve_on("127.0.0.1:0", retrying()).await.unwrap().unwrap();
        let addr = server.local_addr().unwrap();
        for (path, content_type) in [
            ("/proxyMode", "text/plain; charset=utf-8"),
            ("/healthz", "text/plain; charset=utf-8"),
            ("/configz", "application/json"),
        ] {
            let reply = get(addr, path).await;
            assert_eq!(reply.status, 200, "{path}");
            assert_eq!(reply.header("content-type"), Some(content_type), "{path}");
            assert_eq!(reply.header("x-content-type-options"), Some("nosniff"), "{path}");
        }
        let ping = get(addr, "/healthz/ping").await;
        assert_eq!((ping.status, ping.body.as_str()), (200, "ok"));
        assert_eq!(ping.header("content-type"), Some("text/plain; charset=utf-8"));
    }

    /// Upstream's Go mux answers every method on these paths.
    #[tokio::test]
    async fn any_method_is_answered_as_upstream_does() {
        let server = serve_on("127.0.0.1:0", retrying()).await.unwrap().unwrap();
        let addr = server.local_addr().unwrap();
        for path in ["/metrics", "/proxyMode", "/configz", "/healthz"] {
            assert_eq!(request(addr, "POST", path).await.status, 200, "{path}");
        }
        assert_eq!(request(addr, "POST", "/proxyMode").await.body, "iptables");
    }

    /// The generic health handler's query forms, as monitoring scripts use them.
    #[tokio::test]
    async fn healthz_verbose_and_exclude_answer_as_upstream() {
        let server = serve_on("127.0.0.1:0", retrying()).await.unwrap().unwrap();
        let addr = server.local_addr().unwrap();
        assert_eq!(
            get(addr, "/healthz?verbose").await.body,
            "[+]ping ok\nhealthz check passed\n"
        );
        assert_eq!(
            get(addr, "/healthz?verbose=1&exclude=ping").await.body,
            "[+]ping excluded: ok\nhealthz check passed\n"
        );
        assert_eq!(get(addr, "/healthz?exclude=etcd").await.body, "ok");
        assert_eq!(get(addr, "/healthz/other").await.status, 404);
    }

    #[tokio::test]
    async fn busy_port_with_hard_fail_is_an_error_naming_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let policy = BindPolicy {
            hard_fail: true,
            ..retrying()
        };
        let err = serve_on(&address, policy).await.unwrap_err();
        assert!(matches!(err, ServeError::Bind { .. }), "{err}");
        assert!(err.to_string().contains(&address), "{err}");
    }

    #[tokio::test]
    async fn busy_port_is_retried_and_served_once_free() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let wanted = taken.local_addr().unwrap();
        let server = serve_on(&wanted.to_string(), retrying()).await.unwrap().unwrap();
        assert_eq!(
            server.local_addr(),
            None,
            "cannot be listening: the port is taken"
        );
        drop(taken);
        let listening = within(server.listening()).await;
        assert_eq!(listening, Some(wanted));
        assert_eq!(get(wanted, "/proxyMode").await.body, "iptables");
        within(server.shutdown()).await.unwrap();
    }

    #[tokio::test]
    async fn a_server_still_waiting_for_its_port_stops_when_told() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap().to_string();
        let server = serve_on(&address, retrying()).await.unwrap().unwrap();
        within(server.shutdown()).await.unwrap();
    }
}
