//! The metrics server: `/metrics`, `/metrics/slis`, `/proxyMode`, `/configz` and a plain
//! `/healthz`.
//!
//! Upstream serves these on 127.0.0.1:10249 by default; scrapers and `curl .../proxyMode`
//! scripts rely on the paths and on `/healthz` here answering a bare "ok" (see [`crate::ping`]).
//! `/metrics` and `/metrics/slis` answer in the Prometheus text format unless the scraper
//! asks for OpenMetrics ([`crate::exposition`]); `DELETE /metrics/slis` empties the SLI
//! registry ([`crate::slis`]). As upstream's Go mux, every path answers any method (only
//! `/metrics/slis` tells DELETE apart), and the text answers carry
//! `X-Content-Type-Options: nosniff` where upstream's handlers set it.

use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use kpr_metrics::Metrics;
use prometheus_client::registry::Registry;

use crate::connections::Budget;
use crate::exposition::{Format, encode};
use crate::handle::{ServeError, ServerHandle};
use crate::limits::HttpLimits;
use crate::listen::{BindPolicy, start};
use crate::ping;
use crate::slis::HealthcheckSlis;

/// The key `/configz` puts the configuration under, as upstream does.
pub const CONFIGZ_GROUP: &str = "kubeproxy.config.k8s.io";

/// What `DELETE /metrics/slis` answers, as upstream's handler.
const METRICS_RESET: &str = "metrics reset\n";

#[derive(Clone)]
struct MetricsState {
    registry: Arc<Registry>,
    slis: Arc<HealthcheckSlis>,
    proxy_mode: Arc<str>,
    configz: Arc<str>,
}

/// Serves on `address` (e.g. "127.0.0.1:10249"; blank disables it) from a spawned task,
/// binding as `policy` says, within `limits` ([`HttpLimits::METRICS`] in production).
/// `registry` is what `/metrics` shows; `own_metrics` (registered in it) counts the server's
/// own connections. `config` is the effective KubeProxyConfiguration, shown by `/configz`.
pub async fn serve_metrics(
    address: &str,
    registry: Arc<Registry>,
    own_metrics: &Metrics,
    proxy_mode: &str,
    config: serde_json::Value,
    policy: BindPolicy,
    limits: HttpLimits,
) -> Result<Option<ServerHandle>, ServeError> {
    let budget = Budget::new("metrics", limits, own_metrics);
    let configz = serde_json::json!({ CONFIGZ_GROUP: config }).to_string();
    let state = MetricsState {
        registry,
        slis: Arc::default(),
        proxy_mode: proxy_mode.into(),
        configz: configz.into(),
    };
    let router = Router::new()
        .route("/metrics", any(metrics))
        .route("/metrics/slis", any(slis))
        .route("/proxyMode", any(proxy_mode_handler))
        .route("/configz", any(configz_handler))
        .route("/healthz", any(healthz))
        .route("/healthz/ping", any(ping::ping))
        .with_state(state);
    start(address, router, policy, budget).await
}

async fn metrics(State(s): State<MetricsState>, headers: HeaderMap) -> Response {
    exposition(&s.registry, &headers)
}

/// Upstream's SLI handler: the registry for any method, emptied by DELETE.
async fn slis(State(s): State<MetricsState>, method: Method, headers: HeaderMap) -> Response {
    if method == Method::DELETE {
        s.slis.reset();
        return with_content_type(METRICS_RESET.into_response(), "text/plain; charset=utf-8");
    }
    exposition(s.slis.registry(), &headers)
}

async fn healthz(State(s): State<MetricsState>, RawQuery(query): RawQuery) -> Response {
    ping::healthz(query.as_deref(), &s.slis)
}

/// `registry` in the format the request's `Accept` header selects (a value that is not
/// text counts as absent).
fn exposition(registry: &Registry, headers: &HeaderMap) -> Response {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok());
    let format = Format::negotiate(accept);
    match encode(registry, format) {
        Ok(text) => with_content_type(text.into_response(), format.content_type()),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {err}"),
        )
            .into_response(),
    }
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

    use super::*;
    use crate::exposition::tests::check_text_format;
    use crate::exposition::{OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
    use crate::test_client::{get, raw, request, request_with};

    /// Retries fast, so a test does not wait upstream's 5 s.
    fn retrying() -> BindPolicy {
        BindPolicy {
            hard_fail: false,
            retry_interval: Duration::from_millis(20),
        }
    }

    async fn serve_on(address: &str, policy: BindPolicy) -> Result<Option<ServerHandle>, ServeError> {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        serve_metrics(
            address,
            Arc::new(registry),
            &metrics,
            "iptables",
            serde_json::Value::Null,
            policy,
            HttpLimits::METRICS,
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
        let limits = HttpLimits::METRICS;
        let server = serve_metrics(
            "127.0.0.1:0",
            Arc::new(registry),
            &metrics,
            "iptables",
            config,
            retrying(),
            limits,
        )
        .await
        .unwrap()
        .unwrap();
        let addr = server.local_addr().unwrap();

        let reply = get(addr, "/metrics").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-type"), Some(TEXT_CONTENT_TYPE));
        assert!(
            reply
                .body
                .contains("kubeproxy_sync_proxy_rules_service_changes_total{ip_family=\"IPv4\"} 1\n"),
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
        for path in ["/metrics", "/metrics/slis", "/proxyMode", "/configz", "/healthz"] {
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

    /// A server whose registry holds a counter, a gauge and a histogram.
    async fn serve_some_metrics() -> ServerHandle {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let v4 = kpr_metrics::FamilyLabels { ip_family: "IPv4" };
        metrics
            .sync_proxy_rules_endpoint_changes_total
            .get_or_create(&v4)
            .inc_by(3);
        metrics
            .sync_proxy_rules_endpoint_changes_pending
            .get_or_create(&v4)
            .set(2);
        metrics
            .sync_proxy_rules_duration_seconds
            .get_or_create(&v4)
            .observe(0.003);
        serve_metrics(
            "127.0.0.1:0",
            Arc::new(registry),
            &metrics,
            "iptables",
            serde_json::Value::Null,
            retrying(),
            HttpLimits::METRICS,
        )
        .await
        .unwrap()
        .unwrap()
    }

    fn assert_text_format(reply: &crate::test_client::Reply, why: &str) {
        assert_eq!(reply.status, 200, "{why}");
        assert_eq!(reply.header("content-type"), Some(TEXT_CONTENT_TYPE), "{why}");
        check_text_format(&reply.body).unwrap_or_else(|e| panic!("{why}: {e}\n{}", reply.body));
        for line in [
            "# HELP kubeproxy_sync_proxy_rules_endpoint_changes_total [ALPHA] Cumulative proxy rules Endpoint changes",
            "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"} 3",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending{ip_family=\"IPv4\"} 2",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.004\"} 1",
        ] {
            assert!(
                reply.body.lines().any(|l| l == line),
                "{why}: missing {line:?} in\n{}",
                reply.body
            );
        }
    }

    fn assert_openmetrics(reply: &crate::test_client::Reply, why: &str) {
        assert_eq!(reply.status, 200, "{why}");
        assert_eq!(
            reply.header("content-type"),
            Some(OPENMETRICS_CONTENT_TYPE),
            "{why}"
        );
        assert!(reply.body.ends_with("# EOF\n"), "{why}: {}", reply.body);
        for line in [
            "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes counter",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"} 3",
        ] {
            assert!(
                reply.body.lines().any(|l| l == line),
                "{why}: missing {line:?} in\n{}",
                reply.body
            );
        }
    }

    /// Upstream's text format unless the scraper asks for OpenMetrics, by name and quality.
    #[tokio::test]
    async fn metrics_answer_the_text_format_unless_openmetrics_is_asked_for() {
        let server = serve_some_metrics().await;
        let addr = server.local_addr().unwrap();
        let scrape = |accept: &'static [&'static str]| request_with(addr, "GET", "/metrics", accept);

        assert_text_format(&scrape(&[]).await, "no Accept");
        assert_text_format(&scrape(&["Accept: text/plain"]).await, "text/plain");
        assert_text_format(&scrape(&["Accept: */*"]).await, "*/*");
        assert_openmetrics(
            &scrape(&["Accept: application/openmetrics-text; version=1.0.0"]).await,
            "OpenMetrics 1.0.0",
        );
        assert_text_format(
            &scrape(&["Accept: application/openmetrics-text;q=0.3, text/plain;q=0.7"]).await,
            "text preferred",
        );
        assert_openmetrics(
            &scrape(&["Accept: text/plain;version=0.0.4;q=0.2, application/openmetrics-text;version=1.0.0;q=0.9, */*;q=0.1"])
                .await,
            "OpenMetrics preferred",
        );
        assert_openmetrics(
            &scrape(&[
                "Accept: text/plain;q=0.3",
                "Accept: application/openmetrics-text;q=0.6",
            ])
            .await,
            "two Accept lines",
        );
    }

    /// Every request is untrusted: odd, huge and undecodable headers and unknown methods get
    /// an answer (Go's mux answers any method on these paths), and the server keeps serving.
    #[tokio::test]
    async fn odd_requests_are_answered_as_upstream_and_never_crash_the_server() {
        let server = serve_some_metrics().await;
        let addr = server.local_addr().unwrap();

        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "FROB"] {
            assert_text_format(&request(addr, method, "/metrics").await, method);
        }
        // As long as the head limit allows (HttpLimits::max_head_bytes).
        let long = format!(
            "Accept: {}application/openmetrics-text",
            "text/html;q=0.1,".repeat(450)
        );
        assert_openmetrics(
            &request_with(addr, "GET", "/metrics", &[&long]).await,
            "7 KiB Accept",
        );
        for accept in [
            "Accept: ;;;",
            "Accept: /",
            "Accept: application/openmetrics-text;q=7",
            "Accept: \"\"\"",
        ] {
            assert_text_format(&request_with(addr, "GET", "/metrics", &[accept]).await, accept);
        }
        let latin1 = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\xff\r\nConnection: close\r\n\r\n";
        assert_text_format(&raw(addr, latin1).await.unwrap(), "Accept that is not text");

        // Beyond the head limit: refused (Go refuses beyond 1 MiB, kube-proxy-rs beyond
        // HttpLimits::max_head_bytes).
        for size in [64 << 10, 2 << 20] {
            let huge = format!(
                "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {}\r\nConnection: close\r\n\r\n",
                "a".repeat(size)
            );
            if let Some(reply) = raw(addr, huge.as_bytes()).await {
                assert_eq!(reply.status, 431, "{}", reply.body);
            }
        }
        assert_eq!(get(addr, "/metrics/").await.status, 404);
        assert_eq!(get(addr, "/metrics/slis/").await.status, 404);
        assert_text_format(&get(addr, "/metrics").await, "still serving");
    }

    const SLIS_AFTER_THREE_CHECKS: &str = "\
# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.
# TYPE kubernetes_healthcheck gauge
kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 1
# HELP kubernetes_healthchecks_total [STABLE] This metric records the results of all healthcheck.
# TYPE kubernetes_healthchecks_total counter
kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 3
";

    /// `/metrics/slis` records the metrics port's `/healthz` checks as upstream's SLI
    /// registry does; DELETE empties it.
    #[tokio::test]
    async fn slis_record_the_healthz_checks_and_reset_on_delete() {
        let server = serve_on("127.0.0.1:0", retrying()).await.unwrap().unwrap();
        let addr = server.local_addr().unwrap();

        let before = get(addr, "/metrics/slis").await;
        assert_eq!((before.status, before.body.as_str()), (200, ""));
        assert_eq!(before.header("content-type"), Some(TEXT_CONTENT_TYPE));

        assert_eq!(get(addr, "/healthz").await.body, "ok");
        assert_eq!(
            get(addr, "/healthz?verbose").await.body,
            "[+]ping ok\nhealthz check passed\n"
        );
        assert_eq!(request(addr, "POST", "/healthz").await.body, "ok");
        // Neither an excluded check nor the check's own path is recorded.
        get(addr, "/healthz?exclude=ping").await;
        assert_eq!(get(addr, "/healthz/ping").await.body, "ok");
        let after = get(addr, "/metrics/slis").await;
        assert_eq!(after.body, SLIS_AFTER_THREE_CHECKS);
        assert_eq!(after.header("content-type"), Some(TEXT_CONTENT_TYPE));
        check_text_format(&after.body).unwrap();

        let openmetrics = request_with(
            addr,
            "GET",
            "/metrics/slis",
            &["Accept: application/openmetrics-text"],
        )
        .await;
        assert_eq!(openmetrics.header("content-type"), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(
            openmetrics.body.contains(
                "# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.\n"
            ),
            "{}",
            openmetrics.body
        );
        assert!(openmetrics.body.ends_with("# EOF\n"), "{}", openmetrics.body);
        // The proxy's registry is another one.
        assert!(!get(addr, "/metrics").await.body.contains("kubernetes_health"));

        let reset = request(addr, "DELETE", "/metrics/slis").await;
        assert_eq!((reset.status, reset.body.as_str()), (200, "metrics reset\n"));
        assert_eq!(reset.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(get(addr, "/metrics/slis").await.body, "");
        get(addr, "/healthz").await;
        assert!(
            get(addr, "/metrics/slis").await.body.contains(
                "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 1\n"
            ),
            "counts start again after a reset"
        );
    }
}
