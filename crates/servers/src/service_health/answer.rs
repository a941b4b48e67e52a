//! What a Service's health-check port answers, byte for byte as upstream's `hcHandler`.
//!
//! 200 when the Service has a ready endpoint on this node and the proxy keeps its rules up
//! to date (upstream's `Health().Healthy`, which ignores the Node's eligibility: that one
//! is for the proxy's own `/healthz`), else 503; the JSON body names the Service and gives
//! both inputs; `X-Load-Balancing-Endpoint-Weight` carries the count for load balancers
//! that weigh nodes by it. Every path and method gets the same answer, as upstream's
//! handler serves the whole port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kpr_metrics::ProxyHealth;
use kpr_model::NamespacedName;

/// The header upstream sets to the local endpoint count.
pub(crate) const WEIGHT_HEADER: &str = "x-load-balancing-endpoint-weight";

/// What one Service's servers answer from; the manager updates it after each sync.
#[derive(Debug)]
pub(crate) struct Probe {
    service: NamespacedName,
    local_endpoints: AtomicUsize,
    /// Cleared when the Service's servers close: connections accepted before must not
    /// keep reporting a Service this node no longer checks.
    open: AtomicBool,
    health: Arc<ProxyHealth>,
}

impl Probe {
    pub(crate) fn new(service: NamespacedName, local_endpoints: usize, health: Arc<ProxyHealth>) -> Self {
        Self {
            service,
            local_endpoints: AtomicUsize::new(local_endpoints),
            open: AtomicBool::new(true),
            health,
        }
    }

    pub(crate) fn set_local_endpoints(&self, count: usize) {
        self.local_endpoints.store(count, Ordering::Relaxed);
    }

    pub(crate) fn close(&self) {
        self.open.store(false, Ordering::Relaxed);
    }
}

pub(crate) fn router(probe: Arc<Probe>) -> Router {
    Router::new().fallback(answer).with_state(probe)
}

async fn answer(State(probe): State<Arc<Probe>>) -> Response {
    if !probe.open.load(Ordering::Relaxed) {
        return closed();
    }
    let count = probe.local_endpoints.load(Ordering::Relaxed);
    let proxy_healthy = probe.health.livez().healthy;
    let status = if count != 0 && proxy_healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = (status, body(&probe.service, count, proxy_healthy)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(WEIGHT_HEADER, HeaderValue::from(count));
    response
}

/// A request on a connection accepted before the Service's servers closed. Upstream's
/// `Close` drops such connections; telling the client "unavailable" and closing it is the
/// same verdict for a load balancer.
fn closed() -> Response {
    let mut response = StatusCode::SERVICE_UNAVAILABLE.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Upstream's body: its template, dedented (one tab per level) and without the outer
/// newlines.
pub(crate) fn body(service: &NamespacedName, local_endpoints: usize, proxy_healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quoted(&service.namespace),
        quoted(&service.name)
    )
}

/// A JSON string (for the API's name syntax, the same text as Go's `%q`).
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}
